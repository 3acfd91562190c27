list(APPEND UKP_SOURCES
  core/full_blocks.cpp
  core/hit.cpp
  core/jit_debug.cpp
  core/jprobe.cpp
  core/kretprobe.cpp
  core/optimizer.cpp
  core/registry.cpp
  core/signals.cpp
  core/sigmask.cpp
  core/spawn_gate.cpp
  core/unwind.cpp
  core/verify.cpp)

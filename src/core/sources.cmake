# The probes: registration, arming, the hit path, jump optimization, return probes.
ukp_layer(core
  USES platform arch text symbols
  SOURCES blacklist.cpp fork.cpp full_blocks.cpp hit.cpp jit_debug.cpp jprobe.cpp kretprobe.cpp loader.cpp optimizer.cpp registry.cpp signals.cpp
          sigmask.cpp spawn_gate.cpp trampolines.S unwind.cpp verify.cpp
  LIBS Zydis::Zydis Threads::Threads)

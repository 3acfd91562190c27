# The probes: registration, arming, the hit path, jump optimization, return probes.
ukp_layer(core
  USES platform arch text symbols
  SOURCES blacklist.cpp fork.cpp full_blocks.cpp grace.cpp hit.cpp hw_breakpoint.cpp jit_debug.cpp jprobe.cpp kretprobe.cpp lean.cpp
          loader.cpp optimizer.cpp plans.cpp point_table.cpp registry.cpp signals.cpp sigmask.cpp spawn_gate.cpp trampolines.S
          unwind.cpp verify.cpp
  LIBS Zydis::Zydis Threads::Threads)

list(APPEND UKP_SOURCES
  arch/x86_64/decode.cpp
  arch/x86_64/detour.cpp
  arch/x86_64/full_blocks.cpp
  arch/x86_64/island.cpp
  arch/x86_64/reach.cpp
  arch/x86_64/relocate.cpp
  arch/x86_64/refs.cpp
  arch/x86_64/refs_cache.cpp
  arch/x86_64/region.cpp
  arch/x86_64/regs.cpp
  arch/x86_64/safe_access.S
  arch/x86_64/trampoline.cpp
  arch/x86_64/trampolines.S
  arch/x86_64/vector_use.cpp)

# What knows x86-64 instructions: decoding, relocating, emulating, emitting, and the
# analyses of code that jump optimization rests on.
ukp_layer(arch FOLDER arch
  USES platform
  SOURCES x86_64/decode.cpp x86_64/detour.cpp x86_64/elf_image.cpp x86_64/function_map.cpp x86_64/full_blocks.cpp x86_64/island.cpp x86_64/landing_pads.cpp x86_64/reach.cpp
          x86_64/refs.cpp x86_64/refs_cache.cpp x86_64/region.cpp x86_64/regs.cpp x86_64/relocate.cpp
          x86_64/trampoline.cpp x86_64/vector_use.cpp
  LIBS Zydis::Zydis PkgConfig::LIBELF)

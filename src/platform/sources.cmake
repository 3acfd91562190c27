# What every layer needs from the system: raw system calls, the CPU a thread runs on and
# counters per CPU, the vector state saved around calls, fault-safe memory access, where
# the agent's descriptors go, /proc/PID/maps, ELF files, the on-disk cache, the agent's
# own threads.
ukp_layer(platform
  SOURCES agent_heap.cpp agent_threads.cpp disk_cache.cpp elf_file.cpp fork_mark.cpp held_fd.cpp maps.cpp proc_tasks.cpp safe_access.S safe_access.cpp vector_state.S
          vector_state.cpp
  LIBS PkgConfig::LIBELF ${CMAKE_DL_LIBS})

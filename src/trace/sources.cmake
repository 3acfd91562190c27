# The event tracer: every .cpp of the folder (its parts are written side by side), but the
# capture file's, which only the controller writes and reads (src/CMakeLists.txt,
# ukprobes_reader). It uses the core through <ukprobes/kprobes.h> and core/agent.hpp.
file(GLOB UKP_TRACE_SOURCES RELATIVE ${CMAKE_CURRENT_LIST_DIR} CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.cpp)
list(REMOVE_ITEM UKP_TRACE_SOURCES capture.cpp)
ukp_layer(trace USES platform symbols core SOURCES ${UKP_TRACE_SOURCES} LIBS fmt::fmt Threads::Threads)

# The names of the system calls, for the hist key modifier .syscall: made from the kernel
# headers (linux-libc-dev) when the build is configured, as the kernel names its syscall
# metadata ("sys_read"). Written by hand, the table would drift from the headers.
set(UKP_UNISTD_H /usr/include/x86_64-linux-gnu/asm/unistd_64.h)
file(STRINGS ${UKP_UNISTD_H} UKP_NR_LINES REGEX "^#define __NR_[a-z0-9_]+ [0-9]+$")
set(UKP_SYSCALL_NAMES "// Made from ${UKP_UNISTD_H} by src/trace/sources.cmake.\n")
foreach(line ${UKP_NR_LINES})
  string(REGEX REPLACE "^#define __NR_([a-z0-9_]+) ([0-9]+)$" "{\\2, \"sys_\\1\"}," entry "${line}")
  string(APPEND UKP_SYSCALL_NAMES "${entry}\n")
endforeach()
file(CONFIGURE OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/generated/trace/syscall_names.inc CONTENT "${UKP_SYSCALL_NAMES}")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${UKP_UNISTD_H})
target_include_directories(ukp_trace PRIVATE ${CMAKE_CURRENT_BINARY_DIR}/generated)
# For the fuzzers, which build hist.cpp on their own (tests/fuzz/CMakeLists.txt).
set(UKP_GENERATED_DIR ${CMAKE_CURRENT_BINARY_DIR}/generated CACHE INTERNAL "files made when the build is configured")

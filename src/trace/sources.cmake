# The event tracer: every .cpp of the folder (its parts are written side by side), but the
# capture file's, which only the controller writes and reads (src/CMakeLists.txt,
# ukprobes_reader). It uses the core through <ukprobes/kprobes.h> and core/agent.hpp.
file(GLOB UKP_TRACE_SOURCES RELATIVE ${CMAKE_CURRENT_LIST_DIR} CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.cpp)
list(REMOVE_ITEM UKP_TRACE_SOURCES capture.cpp)
ukp_layer(trace USES platform symbols core SOURCES ${UKP_TRACE_SOURCES} LIBS fmt::fmt Threads::Threads)

# The trace layer: every .cpp of the folder (its parts are written side by side), but the
# capture file's, which only the controller writes and reads (src/CMakeLists.txt,
# ukprobes_reader).
file(GLOB UKP_TRACE_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.cpp)
list(REMOVE_ITEM UKP_TRACE_SOURCES ${CMAKE_CURRENT_LIST_DIR}/capture.cpp)
list(APPEND UKP_SOURCES ${UKP_TRACE_SOURCES})

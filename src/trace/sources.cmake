# The trace layer: every .cpp of the folder (its parts are written side by side).
file(GLOB UKP_TRACE_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.cpp)
list(APPEND UKP_SOURCES ${UKP_TRACE_SOURCES})

# C++ functions for tests/unit/sweep_test.cpp to probe instruction by instruction: one
# source compiled at -O0, -O2 and -Os into one executable, each copy in its own
# namespace (sweep_O0, sweep_O2, sweep_Os) with its own extern "C" table accessor
# (ukpt_sweep_table_O0, ...). The -O option comes after the build type's flags, so it
# wins; with GCC, -fno-inline-functions-called-once and -fno-ipa-icf keep every function
# distinct and out of line (clang has neither switch, and merges no functions by default).
set(UKP_SWEEP_LEVELS O0 O2 Os)
add_library(ukp_sweep_functions INTERFACE)
foreach(level IN LISTS UKP_SWEEP_LEVELS)
  add_library(ukp_sweep_${level} OBJECT ${CMAKE_CURRENT_LIST_DIR}/sweep_functions.cpp)
  target_compile_definitions(ukp_sweep_${level} PRIVATE SWEEP_NS=sweep_${level} SWEEP_LEVEL=${level})
  target_compile_options(ukp_sweep_${level} PRIVATE -${level}
    "$<$<CXX_COMPILER_ID:GNU>:-fno-inline-functions-called-once;-fno-ipa-icf>")
  # An INTERFACE library passes on an OBJECT library's objects only when they are
  # named explicitly.
  target_link_libraries(ukp_sweep_functions INTERFACE $<TARGET_OBJECTS:ukp_sweep_${level}>)
endforeach()

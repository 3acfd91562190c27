# A shared library symbols_test dlopen()s: it defines a function the test program
# defines too, for "main program first, MOD: picks the library".
add_library(ukp_symbols_fixture SHARED ${CMAKE_CURRENT_LIST_DIR}/symbols_test_lib.cpp)
add_dependencies(symbols_test ukp_symbols_fixture)
target_compile_definitions(symbols_test
  PRIVATE UKP_SYMBOLS_FIXTURE="$<TARGET_FILE:ukp_symbols_fixture>")

// Loaded by symbols_test with dlopen(): defines a function the test program defines too.
extern "C" {
__attribute__((visibility("default"), noipa)) int ukp_symtest_shared(int x) { return x * 7 + 1; }
__attribute__((visibility("default"), noipa)) int ukp_symtest_lib_only(int x) { return x - 9; }
}

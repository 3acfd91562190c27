// Compiled without debug information (tests/unit/CMakeLists.txt: -g0): an f: event on it
// takes $argN, and refuses arguments by name as the kernel does without BTF.
__attribute__((noinline)) long ukd_nodebug(long count) {
    __asm__ volatile("" ::: "memory");
    return count + 1;
}

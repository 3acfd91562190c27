/* A library for dlopen tests: its constructor calls the function the tests probe, so a
 * probe armed "before any of its code runs" sees that call. */
__attribute__((noinline)) int ukp_dl_fn(int x) {
    __asm__ volatile("" ::: "memory");
    return x * 3;
}

int ukp_dl_constructor_result;

__attribute__((constructor)) static void ukp_dl_init(void) { ukp_dl_constructor_result = ukp_dl_fn(14); }

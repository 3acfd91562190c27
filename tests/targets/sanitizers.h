// Whether the tests run under AddressSanitizer, whose interceptors replace libc
// functions (malloc, strlen, sigaction) and whose SIGSEGV handler reports faults.
#pragma once
#if defined(__SANITIZE_ADDRESS__)
#define UKP_UNDER_ASAN 1
#else
#define UKP_UNDER_ASAN 0
#endif

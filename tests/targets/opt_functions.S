// Hand-written functions for the jump-optimization tests (optimizer_test.cpp). No
// symbols inside them: each would count as an entry into the region after it.

        .macro  FUNC name
        .globl  \name
        .type   \name, @function
        .p2align 4
\name:
        .endm

        .text

// long ukpt_opt_red_zone(long x): a leaf that keeps x and a constant in its red zone
// across the instructions at +14 (the probe site: a 5-byte region of mov and two nops).
// Returns 2x + 0x5a5a5a5a.
        FUNC    ukpt_opt_red_zone
        mov     %rdi, -8(%rsp)          // 5 bytes
        movq    $0x5a5a5a5a, -128(%rsp) // 9 bytes
        mov     %rdi, %rax              // +14: 3 bytes
        nop
        nop
        add     -8(%rsp), %rax
        add     -128(%rsp), %rax
        ret
        .size   ukpt_opt_red_zone, .-ukpt_opt_red_zone

// long ukpt_opt_read(int fd, void *buf, long n): read(2) with the system call inside the
// first 5 bytes, so that a thread blocked in it has its instruction pointer inside the
// region a jump replaces (at +4, after the syscall).
        FUNC    ukpt_opt_read
        xor     %eax, %eax              // SYS_read; 2 bytes
        syscall                         // 2 bytes
        nop                             // +4
        nop
        ret
        .size   ukpt_opt_read, .-ukpt_opt_read

// long ukpt_opt_work(long x): a few instructions of arithmetic to probe in hot loops.
        FUNC    ukpt_opt_work
        lea     1(%rdi), %rax           // 4 bytes
        imul    $3, %rax, %rax          // 4 bytes
        xor     %rdi, %rax
        ret
        .size   ukpt_opt_work, .-ukpt_opt_work

// long ukpt_opt_inner(long x): the same, for the test that puts a probe inside the
// region (after which the entry stays a breakpoint for good).
        FUNC    ukpt_opt_inner
        lea     1(%rdi), %rax
        imul    $3, %rax, %rax
        xor     %rdi, %rax
        ret
        .size   ukpt_opt_inner, .-ukpt_opt_inner

        .section .note.GNU-stack,"",@progbits

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

// void ukpt_opt_vectors(const void *in, void *out): loads ymm0-15 from in (512 bytes),
// calls ukpt_opt_vec_probe (a function to probe, which leaves them alone), stores them
// to out. Whatever a probe handler does, out must equal in.
        FUNC    ukpt_opt_vectors
        vmovdqu 0(%rdi), %ymm0
        vmovdqu 32(%rdi), %ymm1
        vmovdqu 64(%rdi), %ymm2
        vmovdqu 96(%rdi), %ymm3
        vmovdqu 128(%rdi), %ymm4
        vmovdqu 160(%rdi), %ymm5
        vmovdqu 192(%rdi), %ymm6
        vmovdqu 224(%rdi), %ymm7
        vmovdqu 256(%rdi), %ymm8
        vmovdqu 288(%rdi), %ymm9
        vmovdqu 320(%rdi), %ymm10
        vmovdqu 352(%rdi), %ymm11
        vmovdqu 384(%rdi), %ymm12
        vmovdqu 416(%rdi), %ymm13
        vmovdqu 448(%rdi), %ymm14
        vmovdqu 480(%rdi), %ymm15
        push    %rsi
        call    ukpt_opt_vec_probe
        pop     %rsi
        vmovdqu %ymm0, 0(%rsi)
        vmovdqu %ymm1, 32(%rsi)
        vmovdqu %ymm2, 64(%rsi)
        vmovdqu %ymm3, 96(%rsi)
        vmovdqu %ymm4, 128(%rsi)
        vmovdqu %ymm5, 160(%rsi)
        vmovdqu %ymm6, 192(%rsi)
        vmovdqu %ymm7, 224(%rsi)
        vmovdqu %ymm8, 256(%rsi)
        vmovdqu %ymm9, 288(%rsi)
        vmovdqu %ymm10, 320(%rsi)
        vmovdqu %ymm11, 352(%rsi)
        vmovdqu %ymm12, 384(%rsi)
        vmovdqu %ymm13, 416(%rsi)
        vmovdqu %ymm14, 448(%rsi)
        vmovdqu %ymm15, 480(%rsi)
        vzeroupper
        ret
        .size   ukpt_opt_vectors, .-ukpt_opt_vectors

        FUNC    ukpt_opt_vec_probe
        mov     %rdi, %rax              // 3 bytes
        nop
        nop
        ret
        .size   ukpt_opt_vec_probe, .-ukpt_opt_vec_probe

// long ukpt_opt_flags(long a, long b): the flags of `cmp b, a` as a probed function sees
// them after its probed region (ukpt_opt_flags_probe returns its flags).
        FUNC    ukpt_opt_flags
        cmp     %rsi, %rdi
        call    ukpt_opt_flags_probe
        ret
        .size   ukpt_opt_flags, .-ukpt_opt_flags

// long ukpt_opt_flags_down(long a, long b): the same with the direction flag set around
// the call (as a hand-written backward copy might have it), cleared again on return.
        FUNC    ukpt_opt_flags_down
        std
        cmp     %rsi, %rdi
        call    ukpt_opt_flags_probe
        cld
        ret
        .size   ukpt_opt_flags_down, .-ukpt_opt_flags_down

        FUNC    ukpt_opt_flags_probe
        mov     %rdi, %rdx              // 3 bytes: leaves the flags alone
        nop
        nop
        pushfq
        pop     %rax
        ret
        .size   ukpt_opt_flags_probe, .-ukpt_opt_flags_probe

        .section .note.GNU-stack,"",@progbits

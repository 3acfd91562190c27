// ukp_fuzz_enter(const CpuState *s, const void *xsave_init): loads every register from
// *s and jumps to s->rip. Never returns. Layout of CpuState: sandbox.hpp.
        .text
        .globl  ukp_fuzz_enter
        .type   ukp_fuzz_enter, @function
ukp_fuzz_enter:
        // Every extended state component to its init state first: the parent's leftover
        // vector/x87 registers would differ from one fork to the next.
        mov     $-1, %eax
        mov     $-1, %edx
        xrstor64 (%rsi)
        mov     %rdi, %rsp
        movdqu  0(%rsp), %xmm0
        movdqu  16(%rsp), %xmm1
        movdqu  32(%rsp), %xmm2
        movdqu  48(%rsp), %xmm3
        movdqu  64(%rsp), %xmm4
        movdqu  80(%rsp), %xmm5
        movdqu  96(%rsp), %xmm6
        movdqu  112(%rsp), %xmm7
        movdqu  128(%rsp), %xmm8
        movdqu  144(%rsp), %xmm9
        movdqu  160(%rsp), %xmm10
        movdqu  176(%rsp), %xmm11
        movdqu  192(%rsp), %xmm12
        movdqu  208(%rsp), %xmm13
        movdqu  224(%rsp), %xmm14
        movdqu  240(%rsp), %xmm15
        mov     392(%rsp), %rax
        mov     %rax, ukp_fuzz_entry(%rip)
        lea     256(%rsp), %rsp
        popfq                          // rsp now at gpr[0]; nothing below changes flags
        mov     0(%rsp), %rax
        mov     8(%rsp), %rcx
        mov     16(%rsp), %rdx
        mov     24(%rsp), %rbx
        mov     40(%rsp), %rbp
        mov     48(%rsp), %rsi
        mov     56(%rsp), %rdi
        mov     64(%rsp), %r8
        mov     72(%rsp), %r9
        mov     80(%rsp), %r10
        mov     88(%rsp), %r11
        mov     96(%rsp), %r12
        mov     104(%rsp), %r13
        mov     112(%rsp), %r14
        mov     120(%rsp), %r15
        mov     32(%rsp), %rsp
        jmp     *ukp_fuzz_entry(%rip)
        .size   ukp_fuzz_enter, .-ukp_fuzz_enter

        .bss
        .p2align 3
ukp_fuzz_entry:
        .zero   8

        .section .note.GNU-stack,"",@progbits

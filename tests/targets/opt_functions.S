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

// long ukpt_opt_reentry(long n, long started): n + (n - 1) + ... + 1 for started = 0.
// It loops by jumping back to its first instruction with the running sum in its red zone:
// a probe there must leave the red zone alone (a kretprobe's own detour would not).
        FUNC    ukpt_opt_reentry
        test    %rsi, %rsi              // 3 bytes
        jz      1f                      // 2 bytes
        add     %rdi, -8(%rsp)
        jmp     2f
1:      mov     %rdi, -8(%rsp)
        mov     $1, %esi
2:      dec     %rdi
        jnz     ukpt_opt_reentry
        mov     -8(%rsp), %rax
        ret
        .size   ukpt_opt_reentry, .-ukpt_opt_reentry

// void ukpt_opt_regs(const long in[16]): loads the 15 general registers but rsp from
// in[0..14] (rax rbx rcx rdx rsi rdi rbp r8 .. r15) and the flags from in[15], calls
// ukpt_opt_regs_probe, which stores what it was entered with into ukpt_regs_seen, and
// stores what the call left into ukpt_regs_after (the same order). A probe on the
// callee, entry or return, must leave both equal to in.
        FUNC    ukpt_opt_regs
        push    %rbx
        push    %rbp
        push    %r12
        push    %r13
        push    %r14
        push    %r15
        mov     0(%rdi), %rax
        mov     8(%rdi), %rbx
        mov     16(%rdi), %rcx
        mov     24(%rdi), %rdx
        mov     32(%rdi), %rsi
        mov     48(%rdi), %rbp
        mov     56(%rdi), %r8
        mov     64(%rdi), %r9
        mov     72(%rdi), %r10
        mov     80(%rdi), %r11
        mov     88(%rdi), %r12
        mov     96(%rdi), %r13
        mov     104(%rdi), %r14
        mov     112(%rdi), %r15
        pushq   120(%rdi)
        popfq
        mov     40(%rdi), %rdi          // mov: the flags stay
        call    ukpt_opt_regs_probe
        .globl  ukpt_opt_regs_return    // the call's return address
ukpt_opt_regs_return:
        pushfq
        popq    ukpt_regs_after+120(%rip)
        mov     %rax, ukpt_regs_after+0(%rip)
        mov     %rbx, ukpt_regs_after+8(%rip)
        mov     %rcx, ukpt_regs_after+16(%rip)
        mov     %rdx, ukpt_regs_after+24(%rip)
        mov     %rsi, ukpt_regs_after+32(%rip)
        mov     %rdi, ukpt_regs_after+40(%rip)
        mov     %rbp, ukpt_regs_after+48(%rip)
        mov     %r8, ukpt_regs_after+56(%rip)
        mov     %r9, ukpt_regs_after+64(%rip)
        mov     %r10, ukpt_regs_after+72(%rip)
        mov     %r11, ukpt_regs_after+80(%rip)
        mov     %r12, ukpt_regs_after+88(%rip)
        mov     %r13, ukpt_regs_after+96(%rip)
        mov     %r14, ukpt_regs_after+104(%rip)
        mov     %r15, ukpt_regs_after+112(%rip)
        cld
        pop     %r15
        pop     %r14
        pop     %r13
        pop     %r12
        pop     %rbp
        pop     %rbx
        ret
        .size   ukpt_opt_regs, .-ukpt_opt_regs

        FUNC    ukpt_opt_regs_probe
        nopl    0(%rax,%rax,1)          // 5 bytes
        mov     %rax, ukpt_regs_seen+0(%rip)
        mov     %rbx, ukpt_regs_seen+8(%rip)
        mov     %rcx, ukpt_regs_seen+16(%rip)
        mov     %rdx, ukpt_regs_seen+24(%rip)
        mov     %rsi, ukpt_regs_seen+32(%rip)
        mov     %rdi, ukpt_regs_seen+40(%rip)
        mov     %rbp, ukpt_regs_seen+48(%rip)
        mov     %r8, ukpt_regs_seen+56(%rip)
        mov     %r9, ukpt_regs_seen+64(%rip)
        mov     %r10, ukpt_regs_seen+72(%rip)
        mov     %r11, ukpt_regs_seen+80(%rip)
        mov     %r12, ukpt_regs_seen+88(%rip)
        mov     %r13, ukpt_regs_seen+96(%rip)
        mov     %r14, ukpt_regs_seen+104(%rip)
        mov     %r15, ukpt_regs_seen+112(%rip)
        pushfq
        popq    ukpt_regs_seen+120(%rip)
        ret
        .size   ukpt_opt_regs_probe, .-ukpt_opt_regs_probe

// void ukpt_on_stack(void (*fn)(const long *), const long *arg, void *sp): fn(arg) with
// the stack pointer at sp (16-byte aligned) for the call.
        FUNC    ukpt_on_stack
        push    %rbx
        mov     %rsp, %rbx
        mov     %rdx, %rsp
        mov     %rdi, %rax
        mov     %rsi, %rdi
        call    *%rax
        mov     %rbx, %rsp
        pop     %rbx
        ret
        .size   ukpt_on_stack, .-ukpt_on_stack

        .bss
        .p2align 6
        .globl  ukpt_regs_seen
ukpt_regs_seen:
        .zero   128
        .globl  ukpt_regs_after
ukpt_regs_after:
        .zero   128
        .text

        .section .note.GNU-stack,"",@progbits

// The post-handler trampoline: where a probed instruction's out-of-line copy goes
// when a post_handler must run, instead of trapping a second time.
//
// The copy ends with:   lea -128(%rsp),%rsp ; push <Point *> ; jmp ukp_post_trampoline
// so on entry   (%rsp) = the Point, 8..135(%rsp) = the program's red zone (untouched),
// and the program's own stack pointer is %rsp + 136.
//
// The trampoline saves every register into a struct pt_regs on the stack, calls
// ukp_post_dispatch(point, regs), and resumes the program with the registers as the
// handlers left them, ip and sp included. Resuming writes nothing into the program's
// red zone and nothing below the stack pointer in force at that moment (where a signal
// frame could land): the return address goes 136 bytes below the new sp, rsp is set to
// point at it in one instruction, and `ret $128` pops it and steps over the red zone.

#define R15 0
#define R14 8
#define R13 16
#define R12 24
#define RBP 32
#define RBX 40
#define R11 48
#define R10 56
#define R9 64
#define R8 72
#define RAX 80
#define RCX 88
#define RDX 96
#define RSI 104
#define RDI 112
#define ORIG_AX 120
#define RIP 128
#define CS 136
#define EFLAGS 144
#define RSP 152
#define SS 160
#define RESUME 168  /* scratch: new sp - 136, where the return address is put */
#define FRAME 176   /* pt_regs (168) + scratch, a multiple of 16 */

// Saves the FPU/SSE/AVX/... state below %rsp (64-byte aligned), leaving %rsp at the
// save area, 16-byte aligned for a call. Clobbers rax, rdx and the flags: call it only
// after those are saved. XSAVE when the OS enabled it (the size is ukp_xsave_size, from
// CPUID leaf 0xD), else FXSAVE (x87 and SSE).
        .macro  SAVE_EXTENDED_STATE
        mov     ukp_xsave_size(%rip), %rax
        test    %rax, %rax
        jz      .Lfx_save\@
        sub     %rax, %rsp
        and     $-64, %rsp
        // XRSTOR faults on garbage in the reserved part of the XSAVE header: clear it.
        xor     %eax, %eax
        mov     %rax, 512(%rsp)
        mov     %rax, 520(%rsp)
        mov     %rax, 528(%rsp)
        mov     %rax, 536(%rsp)
        mov     %rax, 544(%rsp)
        mov     %rax, 552(%rsp)
        mov     %rax, 560(%rsp)
        mov     %rax, 568(%rsp)
        mov     $-1, %eax
        mov     $-1, %edx
        xsave   (%rsp)
        jmp     .Lsaved\@
.Lfx_save\@:
        sub     $512, %rsp
        and     $-16, %rsp
        fxsave  (%rsp)
.Lsaved\@:
        .endm

// Restores what SAVE_EXTENDED_STATE saved at (%rsp). Clobbers rax, rdx and the flags.
        .macro  RESTORE_EXTENDED_STATE
        mov     ukp_xsave_size(%rip), %rax
        test    %rax, %rax
        jz      .Lfx_restore\@
        mov     $-1, %eax
        mov     $-1, %edx
        xrstor  (%rsp)
        jmp     .Lrestored\@
.Lfx_restore\@:
        fxrstor (%rsp)
.Lrestored\@:
        .endm

        .text
        .globl  ukp_post_trampoline
        .hidden ukp_post_trampoline
        .type   ukp_post_trampoline, @function
        .p2align 4
ukp_post_trampoline:
        .cfi_startproc
        .cfi_undefined rip
        lea     -FRAME(%rsp), %rsp      // lea, not sub: the flags are not saved yet
        mov     %r15, R15(%rsp)
        mov     %r14, R14(%rsp)
        mov     %r13, R13(%rsp)
        mov     %r12, R12(%rsp)
        mov     %rbp, RBP(%rsp)
        mov     %rbx, RBX(%rsp)
        mov     %r11, R11(%rsp)
        mov     %r10, R10(%rsp)
        mov     %r9, R9(%rsp)
        mov     %r8, R8(%rsp)
        mov     %rax, RAX(%rsp)
        mov     %rcx, RCX(%rsp)
        mov     %rdx, RDX(%rsp)
        mov     %rsi, RSI(%rsp)
        mov     %rdi, RDI(%rsp)
        movq    $-1, ORIG_AX(%rsp)
        pushfq
        popq    EFLAGS(%rsp)
        lea     FRAME+136(%rsp), %rax   // the program's stack pointer
        mov     %rax, RSP(%rsp)
        mov     %cs, %eax
        mov     %rax, CS(%rsp)
        mov     %ss, %eax
        mov     %rax, SS(%rsp)
        movq    $0, RIP(%rsp)           // ukp_post_dispatch fills in the next address
        cld                             // the ABI's promise to the C code we call
        mov     FRAME(%rsp), %rdi       // Point *
        mov     %rsp, %rsi              // struct pt_regs *
        mov     %rsp, %rbx              // callee-saved: the frame, across the call
        // The handlers, and the C code around them, use vector registers the program
        // may hold live values in (arguments in xmm0-7, results in xmm0).
        SAVE_EXTENDED_STATE
        call    ukp_post_dispatch
        RESTORE_EXTENDED_STATE
        mov     %rbx, %rsp

        mov     RSP(%rsp), %rax         // new sp, as the handlers left it
        lea     -136(%rax), %rax
        mov     %rax, RESUME(%rsp)
        mov     RIP(%rsp), %rcx
        mov     %rcx, (%rax)            // the return address, just below the red zone
        pushq   EFLAGS(%rsp)
        popfq
        mov     R15(%rsp), %r15
        mov     R14(%rsp), %r14
        mov     R13(%rsp), %r13
        mov     R12(%rsp), %r12
        mov     RBP(%rsp), %rbp
        mov     RBX(%rsp), %rbx
        mov     R11(%rsp), %r11
        mov     R10(%rsp), %r10
        mov     R9(%rsp), %r9
        mov     R8(%rsp), %r8
        mov     RAX(%rsp), %rax
        mov     RCX(%rsp), %rcx
        mov     RDX(%rsp), %rdx
        mov     RSI(%rsp), %rsi
        mov     RDI(%rsp), %rdi
        mov     RESUME(%rsp), %rsp
        ret     $128
        .cfi_endproc
        .size   ukp_post_trampoline, .-ukp_post_trampoline

        .section .note.GNU-stack,"",@progbits

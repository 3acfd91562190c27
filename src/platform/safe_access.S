// Fault-safe memory access and a recovery point, for code that runs in signal handlers.
//
// Like the kernel's exception tables: the instruction that may fault sits at a known
// address; the agent's SIGSEGV/SIGBUS handler recognises it (ukp_fixup_for) and resumes
// at the matching fixup label, which returns -EFAULT. No system call per access.
        .text

// The label of one of ukp_safe_copy's access instructions: a fault there resumes at
// ukp_safe_copy_fixup (regs.cpp, fixup_for), which returns -EFAULT.
        .macro  SAFE_ACCESS name
        .globl  \name
        .hidden \name
\name:
        .endm

// int ukp_safe_copy(void *dst, const void *src, size_t n): 0, or -EFAULT (-14).
        .globl  ukp_safe_copy
        .hidden ukp_safe_copy
        .type   ukp_safe_copy, @function
ukp_safe_copy:
        .cfi_startproc
        // 8 to 256 bytes (a pointer, a return address, a string's first chunk): words,
        // the last one overlapping the one before it; every byte read lies in
        // [src, src + n), as with REP MOVSB, whose start-up would cost more than the
        // copy for any size up to 64 bytes.
        cmp     $8, %rdx
        jb      3f
        cmp     $256, %rdx
        ja      3f
        lea     -8(%rsi,%rdx), %r8      // the last word's source
        lea     -8(%rdi,%rdx), %r9      // and destination
        cmp     %r8, %rsi
        jae     4f                      // one word
2:
        SAFE_ACCESS ukp_safe_copy_loop_load
        mov     (%rsi), %rax
        SAFE_ACCESS ukp_safe_copy_loop_store
        mov     %rax, (%rdi)
        add     $8, %rsi
        add     $8, %rdi
        cmp     %r8, %rsi
        jb      2b
4:
        SAFE_ACCESS ukp_safe_copy_last_load
        mov     (%r8), %rax
        SAFE_ACCESS ukp_safe_copy_last_store
        mov     %rax, (%r9)
        xor     %eax, %eax
        ret
3:
        cld                     // the interrupted code may have left DF set
        mov     %rdx, %rcx
        SAFE_ACCESS ukp_safe_copy_insn
        rep movsb
        xor     %eax, %eax
        ret
        .globl  ukp_safe_copy_fixup
        .hidden ukp_safe_copy_fixup
ukp_safe_copy_fixup:
        mov     $-14, %eax
        ret
        .cfi_endproc
        .size   ukp_safe_copy, .-ukp_safe_copy

// int ukp_safe_load_seg64(uint64_t offset, int seg /* 0 = fs, 1 = gs */, uint64_t *out):
// reads seg:offset, the way an instruction with a segment override would. 0 or -EFAULT.
        .globl  ukp_safe_load_seg64
        .hidden ukp_safe_load_seg64
        .type   ukp_safe_load_seg64, @function
ukp_safe_load_seg64:
        .cfi_startproc
        test    %esi, %esi
        jnz     1f
        .globl  ukp_safe_load_fs_insn
        .hidden ukp_safe_load_fs_insn
ukp_safe_load_fs_insn:
        mov     %fs:(%rdi), %rax
        jmp     2f
1:
        .globl  ukp_safe_load_gs_insn
        .hidden ukp_safe_load_gs_insn
ukp_safe_load_gs_insn:
        mov     %gs:(%rdi), %rax
2:
        mov     %rax, (%rdx)
        xor     %eax, %eax
        ret
        .globl  ukp_safe_load_seg_fixup
        .hidden ukp_safe_load_seg_fixup
ukp_safe_load_seg_fixup:
        mov     $-14, %eax
        ret
        .cfi_endproc
        .size   ukp_safe_load_seg64, .-ukp_safe_load_seg64

// int ukp_recovery_save(struct ukp_recovery *r): saves the callee-saved registers, the
// stack pointer and the return address; returns 0. A fault handler that writes them back
// into the faulting thread's signal context (with rax = 1) makes this call return again
// with 1 once the kernel's sigreturn has restored the signal mask: a setjmp that needs
// no system call on the way in and restores the mask on the way out.
        .globl  ukp_recovery_save
        .hidden ukp_recovery_save
        .type   ukp_recovery_save, @function
ukp_recovery_save:
        .cfi_startproc
        mov     %rbx, 0(%rdi)
        mov     %rbp, 8(%rdi)
        mov     %r12, 16(%rdi)
        mov     %r13, 24(%rdi)
        mov     %r14, 32(%rdi)
        mov     %r15, 40(%rdi)
        lea     8(%rsp), %rax   // rsp as the caller sees it after we return
        mov     %rax, 48(%rdi)
        mov     (%rsp), %rax
        mov     %rax, 56(%rdi)
        xor     %eax, %eax
        ret
        .cfi_endproc
        .size   ukp_recovery_save, .-ukp_recovery_save

        .section .note.GNU-stack,"",@progbits

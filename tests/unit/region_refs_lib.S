// A shared library for region_test's ObjectRefs cases (build_object_refs() on a real
// file): each function below is a case, named by what the check must say at its entry.
        .text

// A tail call through a loaded pointer: optimizable with the object's references.
        .globl  ukp_refs_tail_call
        .type   ukp_refs_tail_call, @function
        .p2align 4
ukp_refs_tail_call:
        .cfi_startproc
        xorl    %eax, %eax
        movq    0x10(%rdi), %rax
        jmp     *%rax
        .cfi_endproc
        .size   ukp_refs_tail_call, .-ukp_refs_tail_call

// The same, but entry+2 is address-taken by a lea in another function.
        .globl  ukp_refs_tail_call_taken
        .type   ukp_refs_tail_call_taken, @function
        .p2align 4
ukp_refs_tail_call_taken:
        .cfi_startproc
        xorl    %eax, %eax
.Ltaken:
        movq    0x10(%rdi), %rax
        jmp     *%rax
        .cfi_endproc
        .size   ukp_refs_tail_call_taken, .-ukp_refs_tail_call_taken

// The same, but entry+2 is in a data word with a relocation (R_X86_64_RELATIVE).
        .globl  ukp_refs_tail_call_reloc
        .type   ukp_refs_tail_call_reloc, @function
        .p2align 4
ukp_refs_tail_call_reloc:
        .cfi_startproc
        xorl    %eax, %eax
.Lreloc:
        movq    0x10(%rdi), %rax
        jmp     *%rax
        .cfi_endproc
        .size   ukp_refs_tail_call_reloc, .-ukp_refs_tail_call_reloc

// The same, but another function jumps to entry+2.
        .globl  ukp_refs_tail_call_jumped
        .type   ukp_refs_tail_call_jumped, @function
        .p2align 4
ukp_refs_tail_call_jumped:
        .cfi_startproc
        xorl    %eax, %eax
.Ljumped:
        movq    0x10(%rdi), %rax
        jmp     *%rax
        .cfi_endproc
        .size   ukp_refs_tail_call_jumped, .-ukp_refs_tail_call_jumped

        .globl  ukp_refs_taker
        .type   ukp_refs_taker, @function
        .p2align 4
ukp_refs_taker:
        .cfi_startproc
        leaq    .Ltaken(%rip), %rax
        testq   %rdi, %rdi
        jne     .Ljumped
        ret
        .cfi_endproc
        .size   ukp_refs_taker, .-ukp_refs_taker

// Shorter than 5 bytes, ends in ret, nop padding after it: optimizable into the padding.
        .globl  ukp_refs_short
        .type   ukp_refs_short, @function
        .p2align 4
ukp_refs_short:
        .cfi_startproc
        xorl    %eax, %eax
        ret
        .cfi_endproc
        .size   ukp_refs_short, .-ukp_refs_short

// The same, but another function jumps into the padding.
        .globl  ukp_refs_short_reached
        .type   ukp_refs_short_reached, @function
        .p2align 4
ukp_refs_short_reached:
        .cfi_startproc
        xorl    %eax, %eax
        ret
        .cfi_endproc
.Lpadding:
        .size   ukp_refs_short_reached, .-ukp_refs_short_reached
        .p2align 4

        .globl  ukp_refs_into_padding
        .type   ukp_refs_into_padding, @function
        .p2align 4
ukp_refs_into_padding:
        .cfi_startproc
        jmp     .Lpadding
        .cfi_endproc
        .size   ukp_refs_into_padding, .-ukp_refs_into_padding

        .section .data.rel.ro,"aw"
        .p2align 3
ukp_refs_table:
        .quad   .Lreloc

        .section .note.GNU-stack,"",@progbits

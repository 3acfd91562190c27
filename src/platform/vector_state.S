// ukp_call_saving_vectors: a call into code that is not lean, from code that is.
#include "platform/vector_state.inc"

        .text

// void ukp_call_saving_vectors(void (*fn)(void *), void *arg): fn(arg) with the vector
// state saved around it, as the trampolines save it.
        .globl  ukp_call_saving_vectors
        .hidden ukp_call_saving_vectors
        .type   ukp_call_saving_vectors, @function
        .p2align 4
ukp_call_saving_vectors:
        .cfi_startproc
        ENTER_FRAME
        push    %rbx
        .cfi_offset %rbx, -24
        push    %r12
        .cfi_offset %r12, -32
        push    %r13
        .cfi_offset %r13, -40
        mov     %rdi, %r13
        mov     %rsi, %rdi
        mov     %rsp, %rbx
        SAVED_VECTOR_CALL *%r13
        mov     %rbx, %rsp
        pop     %r13
        pop     %r12
        pop     %rbx
        pop     %rbp
        .cfi_def_cfa %rsp, 8
        ret
        .cfi_endproc
        .size   ukp_call_saving_vectors, .-ukp_call_saving_vectors

        .section .note.GNU-stack,"",@progbits

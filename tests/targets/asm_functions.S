// Functions with known instructions, so tests can probe an exact instruction kind.
// Each is a leaf of the System V ABI. Symbols ukpt_*_at_* mark probe sites.
        .text
        .macro  FUNC name
        .globl  \name
        .type   \name, @function
        .p2align 4
\name:
        .endm
        .macro  SITE name
        .globl  \name
\name:
        .endm

// long ukpt_load(const long *p) { return *p; }  — the load faults on a bad pointer.
        FUNC    ukpt_load
        SITE    ukpt_load_at_mov
        mov     (%rdi), %rax
        ret
        .size   ukpt_load, .-ukpt_load

// long ukpt_rip_load(void) { return ukpt_data; } via a RIP-relative load, then a store.
        FUNC    ukpt_rip_load
        SITE    ukpt_rip_load_at_mov
        mov     ukpt_data(%rip), %rax
        SITE    ukpt_rip_load_at_store
        mov     %rax, ukpt_data_copy(%rip)
        SITE    ukpt_rip_load_at_lea
        lea     ukpt_data(%rip), %rdx
        add     (%rdx), %rax
        ret
        .size   ukpt_rip_load, .-ukpt_rip_load

// long ukpt_branches(long x): exercises jcc (both ways), jmp, call, ret.
//   x < 0  -> returns -1;  otherwise returns ukpt_twice(x) + 1
        FUNC    ukpt_branches
        SITE    ukpt_branches_at_test
        test    %rdi, %rdi
        SITE    ukpt_branches_at_jcc
        js      1f
        SITE    ukpt_branches_at_call
        call    ukpt_twice
        SITE    ukpt_branches_at_inc
        inc     %rax
        SITE    ukpt_branches_at_jmp
        jmp     2f
1:      mov     $-1, %rax
2:
        SITE    ukpt_branches_at_ret
        ret
        .size   ukpt_branches, .-ukpt_branches

        FUNC    ukpt_twice
        lea     (%rdi,%rdi), %rax
        ret
        .size   ukpt_twice, .-ukpt_twice

// long ukpt_indirect(long (*fn)(long), long x): call *%rsi-style and a tail jmp *%rax.
        FUNC    ukpt_indirect
        push    %rbx
        mov     %rdi, %rbx
        mov     %rsi, %rdi
        SITE    ukpt_indirect_at_call
        call    *%rbx
        pop     %rbx
        mov     %rax, %rdi
        lea     ukpt_twice(%rip), %rax
        SITE    ukpt_indirect_at_jmp
        jmp     *%rax
        .size   ukpt_indirect, .-ukpt_indirect

// long ukpt_loop(long n): sum 1..n with the loop instruction; jrcxz guards n == 0.
        FUNC    ukpt_loop
        mov     %rdi, %rcx
        xor     %eax, %eax
        SITE    ukpt_loop_at_jrcxz
        jrcxz   2f
1:      add     %rcx, %rax
        SITE    ukpt_loop_at_loop
        loop    1b
2:      ret
        .size   ukpt_loop, .-ukpt_loop

// long ukpt_red_zone(long x): keeps x in the red zone across probed instructions.
        FUNC    ukpt_red_zone
        mov     %rdi, -8(%rsp)
        movq    $0x5a5a5a5a, -128(%rsp)
        SITE    ukpt_red_zone_at_nop
        nop
        SITE    ukpt_red_zone_at_xor
        xor     %eax, %eax
        add     -8(%rsp), %rax
        add     -128(%rsp), %rax
        ret
        .size   ukpt_red_zone, .-ukpt_red_zone

// long ukpt_getpid_syscall(void): the raw getpid system call; rcx must hold the return
// address afterwards, as the CPU sets it. Returns rcx - (address after syscall).
        FUNC    ukpt_syscall_rcx
        mov     $39, %eax
        SITE    ukpt_syscall_rcx_at_syscall
        syscall
3:      lea     3b(%rip), %rax
        sub     %rax, %rcx
        mov     %rcx, %rax
        ret
        .size   ukpt_syscall_rcx, .-ukpt_syscall_rcx

// void ukpt_int3(void): the program's own breakpoint.
        FUNC    ukpt_int3
        int3
        ret
        .size   ukpt_int3, .-ukpt_int3

        .data
        .p2align 3
        .globl  ukpt_data, ukpt_data_copy
ukpt_data:      .quad 0x1234
ukpt_data_copy: .quad 0
        .section .note.GNU-stack,"",@progbits

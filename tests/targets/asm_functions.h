// Declarations for asm_functions.S.
#pragma once
extern "C" {
long ukpt_load(const long *p);
long ukpt_rip_load(void);
long ukpt_branches(long x);
long ukpt_twice(long x);
long ukpt_indirect(long (*fn)(long), long x);
long ukpt_loop(long n);
long ukpt_red_zone(long x);
long ukpt_syscall_rcx(void);
void ukpt_int3(void);
extern long ukpt_data, ukpt_data_copy;
extern char ukpt_load_at_mov[], ukpt_rip_load_at_mov[], ukpt_rip_load_at_store[], ukpt_rip_load_at_lea[],
    ukpt_branches_at_test[], ukpt_branches_at_jcc[], ukpt_branches_at_call[], ukpt_branches_at_inc[],
    ukpt_branches_at_jmp[], ukpt_branches_at_ret[], ukpt_indirect_at_call[], ukpt_indirect_at_jmp[],
    ukpt_loop_at_jrcxz[], ukpt_loop_at_loop[], ukpt_red_zone_at_nop[], ukpt_red_zone_at_xor[],
    ukpt_syscall_rcx_at_syscall[];
}

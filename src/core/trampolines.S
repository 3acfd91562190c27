// Trampolines: code the program reaches without a trap, which saves its registers in a
// struct pt_regs, calls into the agent, and resumes the program with the registers as
// the handlers left them, ip and sp included.
//
// Both enter with one word pushed below the program's stack: a context for the C
// dispatcher. Resuming writes nothing into the program's red zone and nothing below the
// stack pointer in force at that moment (where a signal frame could land): the return
// address goes 136 bytes below the new sp, rsp is set to point at it in one instruction,
// and `ret $128` pops it and steps over the red zone.

#include "core/asm_offsets.h" // generated from src/core/asm_offsets.cpp

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
#define AT_HIT 176  /* a second pt_regs: the registers at the hit (SAVE_PT_REGS snap=1) */
#define FRAME 352   /* pt_regs (168) + scratch + pt_regs, a multiple of 16 */

#include "platform/vector_state.inc"



// Saves the general registers and flags into a pt_regs frame at %rsp - FRAME, leaving
// %rsp there. \prog_sp is the program's stack pointer's distance from %rsp on entry.
// With \snap, also into the frame's second pt_regs at AT_HIT (the general registers,
// flags and sp; the dispatcher fills in the rest if it needs it): where a handler that
// faults is rolled back to, which costs less written here than copied later. The stores
// go in address order, each copy's in one run: the same stores interleaved between the
// two copies made a hit measurably dearer.
        .macro  SAVE_PT_REGS prog_sp, snap=0
        lea     -FRAME(%rsp), %rsp      // lea, not sub: the flags are not saved yet
        .cfi_adjust_cfa_offset FRAME
        SAVE_GPRS 0
        .if \snap
        SAVE_GPRS AT_HIT
        .endif
        // The flags without PUSHFQ, which alone was a fifth of a jump path's hit: LAHF
        // gives SF ZF AF PF CF, SETO gives OF, and a string instruction tells DF by the
        // way it steps. IF is always set in user mode. TF, AC, ID and NT, which only a
        // POPF of the program can set, are shown clear (RESTORE_FLAGS_AND_GPRS never
        // changes them unless a handler wrote flags).
        lahf
        seto    %cl
        lea     RDI(%rsp), %rsi
        lodsb                           // rsi: RDI(%rsp) + 1, or - 1 under DF
        movzbl  %ah, %eax
        movzbl  %cl, %ecx
        shl     $11, %ecx
        or      %ecx, %eax
        lea     RDI(%rsp), %rdx
        sub     %rdx, %rsi              // 1 or -1
        shr     $63, %rsi               // DF
        jz      .Ldf_clear\@
        cld                             // the ABI's promise to the C code we call
        or      $0x400, %eax
.Ldf_clear\@:
        or      $0x200, %eax            // IF (LAHF gave bit 1, always set)
        movq    $-1, ORIG_AX(%rsp)
        movq    $0x33, CS(%rsp)         // Linux's __USER_CS and __USER_DS: constants, and
        mov     %rax, EFLAGS(%rsp)      // reading the segment registers costs more
        lea     FRAME+\prog_sp(%rsp), %rcx
        mov     %rcx, RSP(%rsp)
        movq    $0x2b, SS(%rsp)         // (RIP: each dispatcher fills in where to resume)
        .if \snap
        mov     %rax, AT_HIT+EFLAGS(%rsp)
        mov     %rcx, AT_HIT+RSP(%rsp)
        .endif
        .endm

// The general registers but rsp, into a pt_regs at \at(%rsp).
        .macro  SAVE_GPRS at
        mov     %r15, \at+R15(%rsp)
        mov     %r14, \at+R14(%rsp)
        mov     %r13, \at+R13(%rsp)
        mov     %r12, \at+R12(%rsp)
        mov     %rbp, \at+RBP(%rsp)
        mov     %rbx, \at+RBX(%rsp)
        mov     %r11, \at+R11(%rsp)
        mov     %r10, \at+R10(%rsp)
        mov     %r9, \at+R9(%rsp)
        mov     %r8, \at+R8(%rsp)
        mov     %rax, \at+RAX(%rsp)
        mov     %rcx, \at+RCX(%rsp)
        mov     %rdx, \at+RDX(%rsp)
        mov     %rsi, \at+RSI(%rsp)
        mov     %rdi, \at+RDI(%rsp)
        .endm


// Calls \fn(context, regs) with the vector state saved around it. rbx keeps the frame
// across the call.
        .macro  CALL_DISPATCH fn, ctx=FRAME
        mov     \ctx(%rsp), %rdi        // the context pushed on entry
        mov     %rsp, %rsi              // struct pt_regs *
        lea     AT_HIT(%rsp), %rcx      // the registers at the hit, if SAVE_PT_REGS saved them
        mov     %rsp, %rbx
        .cfi_def_cfa_register rbx
        SAVED_VECTOR_CALL \fn
        mov     %rbx, %rsp
        .cfi_def_cfa_register rsp
        .endm

// CALL_DISPATCH, or, when the byte \flag is set (hit.cpp, lean_dispatch_init: the scan
// proved \fn lean), a call of \fn with nothing saved and rdx = 0: the dispatcher saves
// the vector state itself before any code that is not lean.
        .macro  CALL_DISPATCH_GPR fn, ctx, flag
        cmpb    $0, \flag(%rip)
        je      .Lsaving\@
        mov     \ctx(%rsp), %rdi
        mov     %rsp, %rsi
        xor     %edx, %edx              // vector state not saved
        lea     AT_HIT(%rsp), %rcx
        mov     %rsp, %rbx
        .cfi_def_cfa_register rbx
        and     $-16, %rsp              // the probe may be anywhere: sp has any alignment
        call    \fn
        mov     %rbx, %rsp
        .cfi_def_cfa_register rsp
        jmp     .Lcalled\@
.Lsaving\@:
        CALL_DISPATCH \fn, \ctx
.Lcalled\@:
        .endm

// The fast cases' first steps: goes to \declined, with nothing changed, unless the
// thread runs no handler and no agent work (depth and quiet, one 8-byte word) and has a
// reader cell of its own outside any section; else begins a read section there (loads
// after its store are ordered by the writer's membarrier) at depth 1, so that a signal
// handler's probe hit meanwhile leaves the thread's state alone, as in the dispatcher.
// Leaves r12 the thread's state (an %fs offset), r13 its reader cell, r15 the cell's word
// once the section ends (FAST_SECTION_END). Depth and quiet are written as the one 8-byte
// word they are read as (quiet is 0 here, and back to 0 when the section ends: agent
// work is scoped): a 4-byte store under an 8-byte load cannot be forwarded, and the next
// hit's load waited for the store, and every store before it, to reach the cache (a
// tenth of a kretprobe's cost, whose two trampolines each begin a section).
        .macro  FAST_SECTION_BEGIN declined
        mov     ukp_thread_state@gottpoff(%rip), %r12
        cmpq    $0, %fs:UKP_TS_DEPTH(%r12)
        jne     \declined
        mov     %fs:UKP_TS_READER(%r12), %r13
        test    %r13, %r13                      // the first hit: the dispatcher claims a reader cell
        jz      \declined
        mov     (%r13), %r15
        test    $UKP_SECTION_DEPTH_MASK, %r15d  // a section this hit interrupted, or the
        jnz     \declined                       // shared counters' stand-in reader cell
        lea     UKP_SECTION_NEW(%r15), %rax
        add     $UKP_SECTION_NEW-1, %r15
        movq    $1, %fs:UKP_TS_DEPTH(%r12)
        mov     %rax, (%r13)
        .endm

// Ends the section FAST_SECTION_BEGIN began, and the thread's depth with it.
        .macro  FAST_SECTION_END
        mov     %r15, (%r13)
        movq    $0, %fs:UKP_TS_DEPTH(%r12)
        .endm

// The fast cases' call of the handler at *%rax, its first argument in rdi and the
// pt_regs frame at %rsp its second (r12: the thread's state, as an %fs offset). Unless
// ZF is set (the agent's own handler, called as it is), with the frame as the thread's
// recovery point (ThreadState::fast_frame) and \resume in its RESUME word, for the
// recovery code to know what faulted. rbx keeps the frame across the call.
        .macro  FAST_HANDLER_CALL resume
        jz      .Lunguarded\@
        mov     %rsp, %fs:UKP_TS_FAST_FRAME(%r12)
        mov     \resume, RESUME(%rsp)
.Lunguarded\@:
        mov     %rsp, %rsi                      // struct pt_regs *
        mov     %rsp, %rbx
        .cfi_def_cfa_register rbx
        and     $-16, %rsp
        call    *%rax
        mov     %rbx, %rsp
        .cfi_def_cfa_register rsp
        movq    $0, %fs:UKP_TS_FAST_FRAME(%r12)
        .endm

// Resumes the program from the pt_regs frame at %rsp.
        .macro  RESUME_PT_REGS
        mov     RSP(%rsp), %rax         // new sp, as the handlers left it
        lea     -136(%rax), %rax
        mov     %rax, RESUME(%rsp)
        mov     RIP(%rsp), %rcx
        mov     %rcx, (%rax)            // the return address, just below the red zone
        RESTORE_FLAGS_AND_GPRS
        mov     RESUME(%rsp), %rsp
        ret     $128
        .endm

// Loads the flags and the general registers but rsp from the pt_regs frame at %rsp.
        .macro  RESTORE_FLAGS_AND_GPRS
        // POPFQ costs more than all the rest of this; when the flags differ from what the
        // C code leaves (IF and bit 1 set, DF, TF, AC... clear) in arithmetic bits only,
        // SAHF sets SF ZF AF PF CF and an ADD sets OF, as the instrumentation tools do.
        mov     EFLAGS(%rsp), %rax
        mov     %rax, %rcx
        and     $~0x8d5, %rcx
        cmp     $0x202, %rcx
        jne     .Lpopf\@
        mov     %rax, %rcx
        shr     $11, %ecx
        and     $1, %ecx                // OF
        mov     %al, %ah                // SF ZF AF PF CF
        mov     %cl, %al
        add     $0x7f, %al              // OF = (al == 1)
        sahf
        jmp     .Lflags\@
.Lpopf\@:
        pushq   EFLAGS(%rsp)
        popfq
.Lflags\@:
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
        .endm

// Before RESUME_PT_REGS in the optprobe, post and return trampolines, whose frames end
// 144, 136 and 136 bytes below the program's stack pointer: a handler may have lowered that pointer (pushed
// a return address to send the thread into a function first; the dispatcher does it too
// when it emulates a probed `call` for a post_handler that came while the jump was in
// place). The word RESUME_PT_REGS resumes through, 136 bytes below the new sp, would then
// land in this frame (on RESUME itself, 16 or 8 lower) or below %rsp, where a signal frame
// could overwrite it. Then the frame moves down below that word first: %rsp goes down before the copy, so
// both copies stay above the stack pointer. Clobbers rax, rcx, rsi, rdi and the flags.
        .macro  FRAME_BELOW_RESUME
        mov     RSP(%rsp), %rax
        sub     $136+FRAME, %rax        // the highest frame start below that word
        cmp     %rsp, %rax
        jae     .Lframe_ok\@
        and     $-16, %rax
        mov     %rsp, %rsi
        mov     %rax, %rdi
        mov     %rax, %rsp
        mov     $FRAME/8, %ecx
        rep movsq                       // upwards (DF is clear): the copy is lower, overlap is fine
.Lframe_ok\@:
        .endm


        .text

// The post-handler trampoline: where a probed instruction's out-of-line copy goes when a
// post_handler must run, instead of trapping a second time. The copy ends with
//     lea -128(%rsp),%rsp ; push <Point *> ; jmp ukp_post_trampoline
// so on entry (%rsp) = the Point, 8..135(%rsp) = the program's red zone (untouched), and
// the program's stack pointer is %rsp + 136.
        .globl  ukp_post_trampoline
        .hidden ukp_post_trampoline
        .type   ukp_post_trampoline, @function
        .p2align 4
ukp_post_trampoline:
        .cfi_startproc
        .cfi_undefined rip              // where it returns to is decided by the handlers
        SAVE_PT_REGS 136
        CALL_DISPATCH ukp_post_dispatch
        FRAME_BELOW_RESUME
        RESUME_PT_REGS
        .globl  ukp_post_trampoline_end
        .hidden ukp_post_trampoline_end
ukp_post_trampoline_end:
        .cfi_endproc
        .size   ukp_post_trampoline, .-ukp_post_trampoline

// The optprobe trampoline: what a detour (detour.hpp) calls after
//     lea -128(%rsp),%rsp ; push <Point *>
// so on entry (%rsp) = the return address in the detour, 8(%rsp) = the Point, and the
// program's stack pointer at the probe is %rsp + 144. The dispatcher sets regs->ip to the
// region copy, which follows the detour's `lea 136(%rsp),%rsp` (DETOUR_BACK_LEN
// bytes, detour.cpp) after the return address, or to where a pre_handler sent the thread.
// The usual case returns with `ret`, which the CPU predicts from its return stack; a
// jump to the copy instead (`ret $128` as the other trampolines) would miss twice, there
// and at the probed function's own return.
#define DETOUR_BACK_LEN 8
        .globl  ukp_optprobe_trampoline
        .hidden ukp_optprobe_trampoline
        .type   ukp_optprobe_trampoline, @function
        .p2align 4
ukp_optprobe_trampoline:
        .cfi_startproc
        .cfi_undefined rip
        SAVE_PT_REGS 144, 1
        // The fast case (asm_offsets.cpp): the point's one probe has a lean pre_handler
        // (ProbeList::fast), the thread runs no handler and no agent work, and has a
        // reader cell of its own, outside any section. Then the handler is called from
        // here, as ukp_optprobe_dispatch would call it, without the C dispatcher's
        // checks, loops and setjmp: a fault in it resumes at ukp_optprobe_fast_recovery
        // with rsp at this frame. Anything else goes to the dispatcher. Callee-saved
        // here: r12 the thread's state (an %fs offset), r13 its reader cell, r14 the Point,
        // r15 the cell's word after the section ends; all are in the frame already.
        mov     FRAME+8(%rsp), %r14
        FAST_SECTION_BEGIN .Lopt_dispatch
        cmpb    $0, ukp_handlers_silenced(%rip)
        jne     .Lopt_fast_declined
        mov     UKP_PT_LIST(%r14), %rax
        test    %rax, %rax
        jz      .Lopt_fast_declined
        movzbl  UKP_LIST_FAST(%rax), %ecx
        cmp     $UKP_FAST_NONE, %ecx
        je      .Lopt_fast_declined
        mov     UKP_LIST_PROBE0(%rax), %rdi     // the probe
        testl   $UKP_KP_OFF_FLAGS, UKP_KP_FLAGS(%rdi)
        jnz     .Lopt_fast_declined
        mov     UKP_KP_PRE_HANDLER(%rdi), %rax
        test    %rax, %rax
        jz      .Lopt_fast_declined
        mov     UKP_PT_ADDR(%r14), %rdx
        inc     %rdx
        mov     %rdx, RIP(%rsp)                 // regs->ip: the probe address + 1
        cmp     $UKP_FAST_OWN, %ecx
        FAST_HANDLER_CALL %rdi                  // RESUME: the probe, for ukp_optprobe_fast_fault
        test    %eax, %eax
        jnz     .Lopt_fast_answered
        FAST_SECTION_END                        // (a signal handler's own, inside it, ended
.Lopt_fast_copy:                                // before it returned)
                                                // resume at the copy, as the handler left
        lea     FRAME+144(%rsp), %rax           // the registers: by `ret` if sp is unmoved
        cmp     RSP(%rsp), %rax
        jne     .Lopt_fast_sp_moved
        .cfi_remember_state
        RESTORE_FLAGS_AND_GPRS
        lea     FRAME(%rsp), %rsp
        .cfi_adjust_cfa_offset -FRAME
        ret
        .cfi_restore_state
.Lopt_fast_answered:                            // a non-zero answer with ip changed goes
        mov     RIP(%rsp), %rcx                 // there ("Changing Execution Path"), in
        sub     UKP_PT_ADDR(%r14), %rcx         // the copy if that is past the first byte
        dec     %rcx                            // of the region (ukp_optprobe_into_copy):
        jz      .Lopt_fast_unchanged            // rcx = ip - (probe address + 1)
        cmp     $15, %rcx                       // no region is longer than 16 bytes
        jae     .Lopt_fast_away
        CALL_DISPATCH ukp_optprobe_into_copy, FRAME+8 // in the section: the Point stays
        mov     ukp_thread_state@gottpoff(%rip), %r12 // (the call took r12)
.Lopt_fast_away:
        FAST_SECTION_END
        jmp     .Lopt_elsewhere
.Lopt_fast_unchanged:
        FAST_SECTION_END
        jmp     .Lopt_fast_copy
.Lopt_fast_sp_moved:
        mov     UKP_PT_COPY(%r14), %rax
        mov     %rax, RIP(%rsp)
        jmp     .Lopt_elsewhere
        .globl  ukp_optprobe_fast_recovery
        .hidden ukp_optprobe_fast_recovery
ukp_optprobe_fast_recovery:
        mov     RESUME(%rsp), %r8               // the probe whose handler faulted, or
        test    $1, %r8b                        // the return trampoline's instance + 1
        jnz     .Lret_fast_recovery
        CALL_DISPATCH ukp_optprobe_fast_fault, FRAME+8
        jmp     .Lopt_dispatched
.Lopt_fast_declined:
        FAST_SECTION_END                        // unused
.Lopt_dispatch:
        CALL_DISPATCH_GPR ukp_optprobe_dispatch, FRAME+8, ukp_lean_jump_path
.Lopt_dispatched:
        mov     FRAME(%rsp), %rax
        add     $DETOUR_BACK_LEN, %rax
        cmp     RIP(%rsp), %rax
        jne     .Lopt_kret_back
        lea     FRAME+144(%rsp), %rax
        cmp     RSP(%rsp), %rax
        jne     .Lopt_elsewhere
.Lopt_ret:
        .cfi_remember_state
        RESTORE_FLAGS_AND_GPRS
        lea     FRAME(%rsp), %rsp       // lea: the flags are the program's again
        .cfi_adjust_cfa_offset -FRAME
        ret
        .cfi_restore_state
.Lopt_kret_back:                                // entered through a kretprobe detour,
        sub     $DETOUR_BACK_LEN, %rax          // which jumps through the word 8 below the
        mov     FRAME+8(%rsp), %rcx             // program's sp (dead: the detour is at a
        cmp     UKP_PT_KRET_BACK(%rcx), %rax    // function's entry, reached by a call): a
        jne     .Lopt_elsewhere                 // `ret` gets there wherever the thread goes
        lea     FRAME+144(%rsp), %rax           // with sp unmoved, the return stack kept in
        cmp     RSP(%rsp), %rax                 // step (the stub that calls the function, see
        jne     .Lopt_elsewhere                 // finish_kret_entry in kretprobe.cpp)
        mov     RIP(%rsp), %rax
        mov     %rax, FRAME+136(%rsp)
        jmp     .Lopt_ret
.Lopt_elsewhere:
        FRAME_BELOW_RESUME
        RESUME_PT_REGS
        .cfi_endproc
        .size   ukp_optprobe_trampoline, .-ukp_optprobe_trampoline

// What a kretprobe's own detour (detour.hpp, emit_kret_detour) calls, entered as
// ukp_optprobe_trampoline is. In the usual case, the point's one probe a kretprobe without
// an entry_handler, it does what kretprobe_pre (kretprobe.cpp) would, another way: takes
// the thread's spare instance, or one from its home shard, saves the return address in it and puts it
// on the thread's list, but leaves the return address in place: the detour goes on to the
// instance's stub (trampoline.hpp), which drops it and calls the region copy, so
// that the function returns to the stub where the CPU's return stack predicts, and the
// return trampoline leaves by a predicted `ret` too. The stub's address and the region's
// go 8 and 16 bytes below the program's stack pointer, in the red zone of a function
// that has not started. It saves the 8 registers that takes (10 when the instance comes
// from a shard) and the arithmetic flags (LAHF and SETO), where a pt_regs and the C code
// cost three times as much.
// Left to ukp_optprobe_trampoline, with the registers and flags as they came and the
// region's address where the detour jumps: what its fast case declines (this thread runs
// a handler or agent work, or has no reader cell of its own); a thread's first entry (its
// id, home shard and exit hook are set there); another probe at the point, or none; an
// entry_handler; no spare and an empty home shard; and a return address outside the page of the
// detour's push below the red zone, the page this thread just wrote, where
// kretprobe_pre's fault-safe copies are needed.
#define KSAVE 88        /* rax rcx rdx r8 rbx r12 r13 r15; rsi r11 on the shard's way; the flags */
#define KFLAGS 80
        .macro  KRET_RESTORE
        movzwl  KFLAGS(%rsp), %eax
        add     $0x7f, %al              // OF = (al == 1)
        sahf                            // SF ZF AF PF CF
        mov     (%rsp), %rax
        mov     8(%rsp), %rcx
        mov     16(%rsp), %rdx
        mov     24(%rsp), %r8
        mov     32(%rsp), %rbx
        mov     40(%rsp), %r12
        mov     48(%rsp), %r13
        mov     56(%rsp), %r15
        lea     KSAVE(%rsp), %rsp       // lea: the flags are the program's again
        .cfi_adjust_cfa_offset -KSAVE
        .endm

        .globl  ukp_kret_entry_trampoline
        .hidden ukp_kret_entry_trampoline
        .type   ukp_kret_entry_trampoline, @function
        .p2align 4
ukp_kret_entry_trampoline:
        .cfi_startproc
        .cfi_undefined rip
        lea     -KSAVE(%rsp), %rsp
        .cfi_adjust_cfa_offset KSAVE
        mov     %rax, (%rsp)
        mov     %rcx, 8(%rsp)
        mov     %rdx, 16(%rsp)
        mov     %r8, 24(%rsp)
        mov     %rbx, 32(%rsp)
        mov     %r12, 40(%rsp)
        mov     %r13, 48(%rsp)
        mov     %r15, 56(%rsp)
        lahf
        seto    %al
        mov     %ax, KFLAGS(%rsp)
        FAST_SECTION_BEGIN .Lkret_declined
        cmpb    $0, ukp_handlers_silenced(%rip)
        jne     .Lkret_section_declined
        mov     KSAVE+8(%rsp), %rax             // the Point
        mov     UKP_PT_LIST(%rax), %rax
        test    %rax, %rax
        jz      .Lkret_section_declined
        mov     UKP_LIST_KRET_POOL(%rax), %r8   // the pool of the point's one probe, a
        test    %r8, %r8                        // kretprobe without an entry_handler
        jz      .Lkret_section_declined         // (ProbeList::kret_pool)
        mov     UKP_LIST_PROBE0(%rax), %rcx     // the probe
        testl   $UKP_KP_OFF_FLAGS, UKP_KP_FLAGS(%rcx)
        jnz     .Lkret_section_declined
        mov     ukp_ret_thread@gottpoff(%rip), %rbx
        cmpb    $0, %fs:UKP_RT_HOOKED(%rbx)
        je      .Lkret_section_declined
        cmpl    $0, %fs:UKP_RT_TID(%rbx)
        je      .Lkret_section_declined
        mov     %fs:UKP_RT_HOME(%rbx), %eax
        test    %eax, %eax
        jz      .Lkret_section_declined
        lea     KSAVE+144+7(%rsp), %rdx         // the last byte of the return address, at
        lea     KSAVE+8(%rsp), %rcx             // the program's sp, and the detour's push
        xor     %rcx, %rdx
        shr     $12, %rdx
        jnz     .Lkret_section_declined
        cmp     UKP_SLOT_SPARE_POOL(%r13), %r8  // the spare the thread's last return kept
        jne     .Lkret_shard                    // in its reader cell (kretprobe.cpp, "spare
        cmpl    $0, UKP_SLOT_SPARE_LOCK(%r13)   // instances"), unless another thread is
        jne     .Lkret_shard                    // taking it
        mov     UKP_SLOT_SPARE(%r13), %rdx
        movq    $0, UKP_SLOT_SPARE_POOL(%r13)
.Lkret_taken:                                   // the instance in rdx
        movl    $UKP_RI_LIVE, UKP_RI_STATE(%rdx)
        mov     KSAVE+144(%rsp), %rax           // the return address, at the program's sp
        mov     %rax, UKP_RI_RET_ADDR(%rdx)
        mov     %fs:UKP_RT_TID(%rbx), %eax
        mov     %eax, UKP_RI_TASK(%rdx)
        lea     KSAVE+144(%rsp), %rax
        mov     %rax, UKP_RI_FP(%rdx)
        movb    $1, UKP_RI_CALLED(%rdx)
        mov     UKP_RI_INDEX(%rdx), %eax
        shl     $UKP_STUB_SHIFT, %rax
        add     UKP_POOL_SLED(%r8), %rax        // the instance's stub (UKP_STUB_CALL: 0)
        mov     %rax, KSAVE+136(%rsp)           // where the detour jumps, and the copy of
        mov     KSAVE+8(%rsp), %rcx             // the region the stub calls: 8 and 16
        mov     UKP_PT_COPY(%rcx), %rcx         // below the program's sp
        mov     %rcx, KSAVE+128(%rsp)
        mov     %fs:UKP_RT_HEAD(%rbx), %rax
        mov     %rax, UKP_RI_NEXT(%rdx)
        mov     %rdx, %fs:UKP_RT_HEAD(%rbx)     // the newest of the thread's list
        FAST_SECTION_END
        .cfi_remember_state
        KRET_RESTORE
        ret
        .cfi_restore_state
.Lkret_shard:                                   // from the home shard: rsi and r11 are
        mov     %rsi, 64(%rsp)                  // needed too, saved on this way only
        mov     %r11, 72(%rsp)
        shl     $6, %eax
        lea     UKP_POOL_SHARDS-64(%r8,%rax), %rsi // the home shard's free list
        mov     (%rsi), %rax
.Lkret_pop:                                     // (a tag << 32) | (index + 1) on top
        test    %eax, %eax
        jz      .Lkret_shard_empty
        lea     -1(%rax), %edx
        imul    UKP_POOL_STRIDE(%r8), %rdx
        add     UKP_POOL_MEM(%r8), %rdx         // the instance on top
        mov     UKP_RI_NEXT_FREE(%rdx), %ecx
        mov     %rax, %r11
        shr     $32, %r11
        inc     %r11                            // a new tag, so that a stale next_free
        shl     $32, %r11                       // (popped and pushed back meanwhile)
        or      %rcx, %r11                      // makes the exchange fail
        lock cmpxchg %r11, (%rsi)
        jne     .Lkret_pop
        mov     64(%rsp), %rsi
        mov     72(%rsp), %r11
        jmp     .Lkret_taken
.Lkret_shard_empty:
        mov     64(%rsp), %rsi
        mov     72(%rsp), %r11
.Lkret_section_declined:
        FAST_SECTION_END
.Lkret_declined:                                // where the detour jumps if the usual
        mov     KSAVE+8(%rsp), %rax             // trampoline returns to it: the copy
        mov     UKP_PT_COPY(%rax), %rax
        mov     %rax, KSAVE+136(%rsp)
        KRET_RESTORE
        jmp     ukp_optprobe_trampoline
        .cfi_endproc
        .size   ukp_kret_entry_trampoline, .-ukp_kret_entry_trampoline

// The return trampoline of kretprobes. A hijacked return address, or the return address
// of the stub's call, points at an instance's stub in its pool's sled (trampoline.hpp):
//     push literal(%rip) ; jmp *trampoline(%rip)
// so on entry (%rsp) = the literal, the address of the instance's ret_addr, and the
// program's stack pointer, after its function returned, is %rsp + 8. Below it is dead:
// the caller made a call, so it keeps nothing in its red zone. The frame still goes 128
// bytes lower, as in the other trampolines: the word RESUME_PT_REGS resumes through (136
// bytes below the sp the handler leaves) then lies above the frame, or
// FRAME_BELOW_RESUME moves the frame when a handler lowered sp.
//
// When the handler left sp alone, it leaves by `jmp *-8(%rsp)` from the program's sp,
// with the return address where the literal was: a signal arriving between the two steps
// keeps off that word, the 128 bytes below a user stack pointer that the kernel skips.
// The probed function's `ret` to a hijacked address missed the return stack's prediction
// once; a `ret` here would miss it again (the stub made no call), where the indirect jump
// is predicted from its own history, and the return stack stays in step with the program.
// When the stub called the function (RetInstance::called) its `ret` was predicted, and
// the caller's return address is on top of the return stack: then it leaves by `ret`.
        .globl  ukp_kretprobe_trampoline
        .hidden ukp_kretprobe_trampoline
        .type   ukp_kretprobe_trampoline, @function
        .p2align 4
ukp_kretprobe_trampoline:
        .cfi_startproc
        .cfi_def_cfa rsp, 8
        // For unwinders (a backtrace taken in a return handler), this frame returns to
        // the instance's ret_addr: *(*(CFA - 8)), valid wherever the CFA lives.
        // DW_CFA_val_expression(rip, 4 bytes: lit8 minus deref deref)
        .cfi_escape 0x16, 0x10, 0x04, 0x38, 0x1c, 0x06, 0x06
        lea     -128(%rsp), %rsp
        .cfi_adjust_cfa_offset 128
        SAVE_PT_REGS 136
        // The fast case (asm_offsets.cpp): the thread runs no handler and no agent work, has a
        // reader cell of its own outside any section, and its instance is the newest of its
        // list with the next older one's frame above it (nothing for ukp_kretprobe_dispatch to
        // release as unwound); the kretprobe is registered and its handler, if any, is lean.
        // Then the instance is taken off the list, the handler called, and the instance kept as
        // the thread's spare or given back to its shard from here, with this frame as the
        // recovery point for a user's handler (ukp_optprobe_fast_recovery, tagged by bit 0 of
        // RESUME). Callee-saved: r12 to r15 as FAST_SECTION_BEGIN leaves them, r14 the
        // instance; rbx the list head (an %fs offset) until the handler's call.
        mov     FRAME+128(%rsp), %r14
        sub     $UKP_RI_RET_ADDR, %r14          // the stub's literal: &ri->pub.ret_addr
        movzbl  UKP_RI_CALLED(%r14), %eax       // how to leave, kept where the frame
        mov     %rax, AT_HIT(%rsp)              // has room (SAVE_PT_REGS's snap is unused)
        FAST_SECTION_BEGIN .Lret_dispatch
        mov     ukp_ret_thread@gottpoff(%rip), %rbx
        cmp     %fs:UKP_RT_HEAD(%rbx), %r14     // the thread's newest instance
        jne     .Lret_fast_declined
        cmpl    $UKP_RI_LIVE, UKP_RI_STATE(%r14)
        jne     .Lret_fast_declined
        mov     UKP_RI_NEXT(%r14), %rax
        test    %rax, %rax
        jz      .Lret_list_ok
        cmpl    $UKP_RI_LIVE, UKP_RI_STATE(%rax)
        jne     .Lret_fast_declined
        mov     UKP_RI_FP(%rax), %rcx           // the next older frame lies above: live
        cmp     UKP_RI_FP(%r14), %rcx
        jbe     .Lret_fast_declined
.Lret_list_ok:
        cmpb    $0, ukp_handlers_silenced(%rip)
        jne     .Lret_fast_declined
        mov     UKP_RI_POOL(%r14), %rcx
        cmpq    $0, UKP_POOL_RP(%rcx)           // null once unregistered
        je      .Lret_fast_declined
        mov     UKP_POOL_HANDLER(%rcx), %rax    // rp->handler
        test    %rax, %rax
        jz      .Lret_fast_take
        cmpb    $0, UKP_POOL_HANDLER_GPR(%rcx)
        je      .Lret_fast_declined
.Lret_fast_take:
        mov     UKP_RI_NEXT(%r14), %rdx         // off the thread's list
        mov     %rdx, %fs:UKP_RT_HEAD(%rbx)
        mov     UKP_RI_RET_ADDR(%r14), %rdx     // regs->ip: the real return address
        mov     %rdx, RIP(%rsp)
        test    %rax, %rax
        jz      .Lret_fast_release
        lea     UKP_RI_PUB(%r14), %rdi          // struct kretprobe_instance *
        lea     1(%r14), %rdx                   // RESUME: the instance + 1, for .Lret_fast_recovery
        cmpb    $1, UKP_POOL_HANDLER_OWN(%rcx)
        FAST_HANDLER_CALL %rdx
.Lret_fast_release:                             // kept as the thread's spare if it has
        mov     UKP_RI_POOL(%r14), %rcx         // none (kretprobe.cpp, "spare instances")
        cmpq    $0, UKP_SLOT_SPARE_POOL(%r13)
        jne     .Lret_shard_push
        cmpl    $0, UKP_SLOT_SPARE_LOCK(%r13)
        jne     .Lret_shard_push
        cmpb    $0, UKP_POOL_NO_SPARES(%rcx)
        jne     .Lret_shard_push
        movl    $UKP_RI_FREE, UKP_RI_STATE(%r14)
        mov     %r14, UKP_SLOT_SPARE(%r13)
        mov     %rcx, UKP_SLOT_SPARE_POOL(%r13)
        FAST_SECTION_END
        jmp     .Lret_dispatched
.Lret_shard_push:                               // else back to its shard's free list
        movzwl  UKP_RI_SHARD(%r14), %eax
        shl     $6, %eax
        lea     UKP_POOL_SHARDS(%rcx,%rax), %rsi
        movl    $UKP_RI_FREE, UKP_RI_STATE(%r14)
        mov     UKP_RI_INDEX(%r14), %edi
        inc     %edi                            // the list's link: index + 1
        mov     (%rsi), %rax
.Lret_push:
        mov     %eax, UKP_RI_NEXT_FREE(%r14)
        mov     %rax, %rdx
        shr     $32, %rdx
        inc     %rdx                            // a new tag in the high half
        shl     $32, %rdx
        or      %rdi, %rdx
        lock cmpxchg %rdx, (%rsi)
        jne     .Lret_push
        FAST_SECTION_END
        jmp     .Lret_dispatched
.Lret_fast_recovery:                            // from ukp_optprobe_fast_recovery
        lea     -1(%r8), %rdi                   // the instance
        mov     %rsp, %rbx
        .cfi_def_cfa_register rbx
        SAVED_VECTOR_CALL ukp_kretprobe_fast_fault
        mov     %rbx, %rsp
        .cfi_def_cfa_register rsp
        jmp     .Lret_dispatched
.Lret_fast_declined:
        FAST_SECTION_END                        // unused
.Lret_dispatch:
        CALL_DISPATCH_GPR ukp_kretprobe_dispatch, FRAME+128, ukp_lean_return_path
.Lret_dispatched:
        lea     FRAME+136(%rsp), %rax
        cmp     RSP(%rsp), %rax
        jne     .Lret_elsewhere
        mov     RIP(%rsp), %rax
        mov     %rax, FRAME+128(%rsp)   // over the literal, 8 below the program's sp
        cmpq    $0, AT_HIT(%rsp)
        jne     .Lret_by_ret
        .cfi_remember_state
        .cfi_offset rip, -8             // from here on, the frame returns through that word
        RESTORE_FLAGS_AND_GPRS
        lea     FRAME+136(%rsp), %rsp   // lea: the flags are the program's again
        .cfi_adjust_cfa_offset -FRAME-136
        .globl  ukp_kretprobe_trampoline_exit   // for tests: a debugger stops here
        .hidden ukp_kretprobe_trampoline_exit
ukp_kretprobe_trampoline_exit:
        jmp     *-8(%rsp)
        .cfi_restore_state
.Lret_by_ret:                           // the stub called the function: the CPU's return
        .cfi_remember_state             // stack holds the caller's return address on top
        .cfi_offset rip, -8
        RESTORE_FLAGS_AND_GPRS
        lea     FRAME+128(%rsp), %rsp
        .cfi_adjust_cfa_offset -FRAME-128
        .globl  ukp_kretprobe_trampoline_ret    // for tests: a debugger stops here
        .hidden ukp_kretprobe_trampoline_ret
ukp_kretprobe_trampoline_ret:
        ret
        .cfi_restore_state
.Lret_elsewhere:
        FRAME_BELOW_RESUME
        RESUME_PT_REGS
        .cfi_endproc
        .size   ukp_kretprobe_trampoline, .-ukp_kretprobe_trampoline

// int ukp_call_handler(fn, a, b): returns fn(a, b). The optprobe dispatcher calls every
// function pointer through it (handlers, and closures that ukp_call_saving_vectors is not
// needed for), so that the scan that proves the dispatcher lean (vector_use.hpp) can
// treat its one indirect jump as vouched for.
        .globl  ukp_call_handler
        .hidden ukp_call_handler
        .type   ukp_call_handler, @function
        .p2align 4
ukp_call_handler:
        .cfi_startproc
        mov     %rdi, %rax
        mov     %rsi, %rdi
        mov     %rdx, %rsi
        jmp     *%rax
        .cfi_endproc
        .size   ukp_call_handler, .-ukp_call_handler

// void jprobe_return(void): ends a jprobe handler. Its int3 is recognised by the agent's
// SIGTRAP handler, which restores the probed function's registers and stack and lets
// it run; control never comes back here.
        .globl  jprobe_return
        .type   jprobe_return, @function
        .p2align 4
jprobe_return:
        .cfi_startproc
        .globl  ukp_jprobe_return_trap
        .hidden ukp_jprobe_return_trap
ukp_jprobe_return_trap:
        int3
        ud2
        .cfi_endproc
        .size   jprobe_return, .-jprobe_return

// void ukp_call_on_stack(void (*fn)(void *), void *arg, void *stack_top): calls fn(arg)
// with %rsp at stack_top (16-byte aligned), and returns on the caller's stack. The frame
// pointer chain and the CFI lead unwinders back to the caller.
        .globl  ukp_call_on_stack
        .hidden ukp_call_on_stack
        .type   ukp_call_on_stack, @function
        .p2align 4
ukp_call_on_stack:
        .cfi_startproc
        ENTER_FRAME
        mov     %rdx, %rsp
        mov     %rdi, %rax
        mov     %rsi, %rdi
        call    *%rax
        mov     %rbp, %rsp
        .cfi_def_cfa_register %rsp
        pop     %rbp
        .cfi_def_cfa_offset 8
        ret
        .cfi_endproc
        .size   ukp_call_on_stack, .-ukp_call_on_stack

        .section .note.GNU-stack,"",@progbits

// The proof that code leaves the vector and floating-point state alone
// (arch/x86_64/vector_use.hpp), and the jump path that uses it: a dispatcher that
// saves no vector state, handlers proven clean called as they are, the rest with the
// state saved around them.
#include <ukprobes/kprobes.h>
#include <ukprobes/trace.h>

#include "arch/x86_64/trampoline.hpp"
#include "arch/x86_64/vector_use.hpp"
#include "core/core.hpp"
#include "opt_functions_decl.h"

#include <gtest/gtest.h>

#include <mutex>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <sys/mman.h>
#include <xmmintrin.h>

// Hand-written code, so that each case is exactly what it says.
asm(R"(
        .text
        .macro  VU_FUNC name
        .globl  \name
        .type   \name, @function
        .p2align 4
\name:
        .endm
        VU_FUNC vu_ret
        ret
        VU_FUNC vu_int
        lea     1(%rdi), %rax
        imul    %rsi, %rax
        ret
        VU_FUNC vu_loop
        xor     %eax, %eax
1:      add     %rdi, %rax
        dec     %rsi
        jnz     1b
        ret
        VU_FUNC vu_calls_int
        call    vu_int
        ret
        VU_FUNC vu_system
        mfence
        lfence
        sfence
        pause
        lock addq $1, (%rdi)
        rdtsc
        push    %rbx
        cpuid
        pop     %rbx
        mov     $39, %eax
        syscall
        rep movsb
        ret
        VU_FUNC vu_trap_ends_the_path
        test    %rdi, %rdi
        jnz     1f
        ud2
        pxor    %xmm0, %xmm0
1:      ret
        VU_FUNC vu_xmm
        movq    %rdi, %xmm0
        ret
        .size   vu_xmm, .-vu_xmm
        VU_FUNC vu_xmm_on_one_branch
        test    %rdi, %rdi
        je      1f
        ret
1:      pxor    %xmm1, %xmm1
        ret
        VU_FUNC vu_calls_xmm
        call    vu_xmm
        ret
        VU_FUNC vu_ymm
        vpxor   %ymm3, %ymm3, %ymm3
        ret
        VU_FUNC vu_stmxcsr
        stmxcsr -4(%rsp)
        ret
        VU_FUNC vu_ldmxcsr
        ldmxcsr -4(%rsp)
        ret
        VU_FUNC vu_x87
        fldz
        fstp    %st(0)
        ret
        VU_FUNC vu_fnstcw
        fnstcw  -2(%rsp)
        ret
        VU_FUNC vu_emms
        emms
        ret
        VU_FUNC vu_vzeroupper
        vzeroupper
        ret
        VU_FUNC vu_fxsave
        fxsave  (%rdi)
        ret
        VU_FUNC vu_xsave
        xsave   (%rdi)
        ret
        VU_FUNC vu_kmask
        kmovw   %k1, %eax
        ret
        VU_FUNC vu_indirect_call
        call    *%rdi
        ret
        VU_FUNC vu_indirect_jump
        jmp     *%rdi
        VU_FUNC vu_calls_stop
        call    vu_xmm
        lea     1(%rax), %rax
        ret
# Handlers in assembly, so that no build (the sanitizers' instrumentation) adds calls to
# them: int (void *, struct pt_regs *). vu_count counts its calls in vu_hits, returns 0.
        VU_FUNC vu_count
        lock incq vu_hits(%rip)
        xor     %eax, %eax
        ret
# vu_faulting changes regs->ax and regs->di, then faults.
        VU_FUNC vu_faulting
        movq    $0xbad, 80(%rsi)
        movq    $0xbad, 112(%rsi)
        movq    $1, 16
        xor     %eax, %eax
        ret
        .data
        .globl  vu_hits
        .p2align 3
vu_hits:
        .quad   0
        .text
)");

extern "C" {
void vu_ret();
void vu_int();
void vu_loop();
void vu_calls_int();
void vu_system();
void vu_trap_ends_the_path();
void vu_xmm();
void vu_xmm_on_one_branch();
void vu_calls_xmm();
void vu_ymm();
void vu_stmxcsr();
void vu_ldmxcsr();
void vu_x87();
void vu_fnstcw();
void vu_emms();
void vu_vzeroupper();
void vu_fxsave();
void vu_xsave();
void vu_kmask();
void vu_indirect_call();
void vu_indirect_jump();
void vu_calls_stop();
int vu_count(void *, pt_regs *);
int vu_faulting(void *, pt_regs *);
extern long vu_hits;
}

namespace {

using ukp::arch::scan_vector_use;
using ukp::arch::VectorScan;

uint64_t addr_of(void (*fn)()) { return reinterpret_cast<uint64_t>(fn); }

VectorScan scan(void (*fn)()) { return scan_vector_use(addr_of(fn), nullptr, 0); }

// The first registration sets the agent up: its signal handlers make the scan's reads
// fault-safe, and it decides on the dispatcher.
void init_agent() {
    kprobe kp{};
    kp.symbol_name = "ukpt_opt_work";
    ASSERT_EQ(register_kprobe(&kp), 0);
    unregister_kprobe(&kp);
}

TEST(VectorUse, CodeOfGeneralRegistersOnlyIsClean) {
    for (auto *fn : {vu_ret, vu_int, vu_loop, vu_calls_int, vu_system, vu_trap_ends_the_path}) {
        const VectorScan s = scan(fn);
        EXPECT_TRUE(s.clean) << std::hex << s.at - addr_of(fn) << ": " << s.why;
    }
    // Every instruction of the callee was decoded too.
    EXPECT_EQ(scan(vu_calls_int).instructions, 2 + scan(vu_int).instructions);
}

TEST(VectorUse, EachWayOfTouchingTheStateIsFound) {
    const struct {
        void (*fn)();
        const char *name;
        size_t culprit; // offset of the instruction to blame
    } cases[] = {
        {vu_xmm, "xmm", 0},
        {vu_xmm_on_one_branch, "one branch", 6},
        {vu_calls_xmm, "callee", 0},
        {vu_ymm, "ymm", 0},
        {vu_stmxcsr, "stmxcsr", 0},
        {vu_ldmxcsr, "ldmxcsr", 0},
        {vu_x87, "x87", 0},
        {vu_fnstcw, "fnstcw", 0},
        {vu_emms, "emms", 0},
        {vu_vzeroupper, "vzeroupper", 0},
        {vu_fxsave, "fxsave", 0},
        {vu_xsave, "xsave", 0},
        {vu_kmask, "AVX-512 mask", 0},
    };
    for (const auto &c : cases) {
        const VectorScan s = scan(c.fn);
        EXPECT_FALSE(s.clean) << c.name;
        const uint64_t blamed = c.fn == vu_calls_xmm ? addr_of(vu_xmm) : addr_of(c.fn) + c.culprit;
        EXPECT_EQ(s.at, blamed) << c.name << ": " << s.why;
    }
}

TEST(VectorUse, IndirectBranchesEndTheProof) {
    VectorScan s = scan(vu_indirect_call);
    EXPECT_FALSE(s.clean);
    EXPECT_STREQ(s.why, "indirect call");
    s = scan(vu_indirect_jump);
    EXPECT_FALSE(s.clean);
    EXPECT_STREQ(s.why, "indirect jump");
    // A call of a library function goes through the PLT, an indirect jump: unproven.
    s = scan_vector_use(reinterpret_cast<uint64_t>(&std::puts), nullptr, 0);
    EXPECT_FALSE(s.clean);
}

TEST(VectorUse, ACallToAStopIsNotFollowed) {
    EXPECT_FALSE(scan(vu_calls_stop).clean);
    const uint64_t stop = addr_of(vu_xmm);
    const VectorScan s = scan_vector_use(addr_of(vu_calls_stop), &stop, 1);
    EXPECT_TRUE(s.clean) << s.why;
    EXPECT_EQ(s.instructions, 3u);
}

TEST(VectorUse, UnreadableCodeAndTooMuchCodeAreNotProven) {
    init_agent();
    void *page = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(page, MAP_FAILED);
    VectorScan s = scan_vector_use(reinterpret_cast<uint64_t>(page), nullptr, 0);
    EXPECT_FALSE(s.clean);
    EXPECT_STREQ(s.why, "unreadable code");
    munmap(page, 4096);
    s = scan_vector_use(addr_of(vu_loop), nullptr, 0, 3);
    EXPECT_FALSE(s.clean);
    EXPECT_STREQ(s.why, "too much code to follow");
}

// ---- the jump path --------------------------------------------------------------------

std::atomic<long> g_vector_hits{0};

// vu_count's calls: a handler proven clean in every build (the sanitizers instrument C).
long clean_hits() { return __atomic_load_n(&vu_hits, __ATOMIC_RELAXED); }

// Float math on purpose: sets MXCSR's sticky flags and changes its rounding, and leaves
// xmm registers changed.
__attribute__((noinline)) int vector_pre(kprobe *, pt_regs *) {
    _mm_setcsr((_mm_getcsr() & ~0x6000u) | 0x4000u); // round up
    volatile float zero = 0.0f, one = 1.0f;
    volatile float q = one / zero; // divide-by-zero flag
    g_vector_hits.fetch_add(std::isinf(q) ? 1 : 100, std::memory_order_relaxed);
    return 0;
}

bool optimized(const kprobe &kp) { return (kp.flags & KPROBE_FLAG_OPTIMIZED) != 0; }

// The lean bits of the list at kp's address.
std::string gpr_bits(const kprobe &kp) {
    const ukp::core::Point *pt = ukp::core::find_point(reinterpret_cast<uint64_t>(kp.addr));
    if (pt == nullptr) return "no point";
    const ukp::core::ProbeList *list = pt->list.load();
    std::string bits;
    for (uint32_t i = 0; list != nullptr && i < list->count; ++i) bits += list->lean(i) ? '1' : '0';
    return bits;
}

// Calls ukpt_opt_vectors (ymm0-15 held across a call of ukpt_opt_vec_probe) three
// times with its own MXCSR (round down, no flags): the registers and MXCSR must come back.
void calls_keep_vectors_and_mxcsr(unsigned seed, const char *what) {
    alignas(32) unsigned char in[512], out[512];
    for (size_t i = 0; i < sizeof in; ++i) in[i] = static_cast<unsigned char>(i * seed + 1);
    const unsigned csr = _mm_getcsr();
    const unsigned program_csr = (csr & ~0x603fu) | 0x2000u;
    for (int round = 0; round < 3; ++round) {
        std::memset(out, 0, sizeof out);
        _mm_setcsr(program_csr);
        ukpt_opt_vectors(in, out);
        const unsigned after = _mm_getcsr();
        _mm_setcsr(csr);
        EXPECT_EQ(after, program_csr) << what << ", round " << round;
        EXPECT_EQ(std::memcmp(in, out, sizeof in), 0) << what << ", round " << round;
    }
}

class VectorPath : public ::testing::Test {
protected:
    void SetUp() override {
        ASSERT_EQ(ukp_set_kprobes_optimization(1), 0);
        __atomic_store_n(&vu_hits, 0, __ATOMIC_RELAXED);
        g_vector_hits = 0;
    }
};

TEST_F(VectorPath, TheDispatchersAreProvenClean) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    GTEST_SKIP() << "the sanitizers' checks call out through the PLT: the dispatchers save the state";
#else
    init_agent();
    for (auto which : {ukp::core::Dispatcher::kOptprobe, ukp::core::Dispatcher::kKretprobe}) {
        const VectorScan &s = ukp::core::lean_dispatch_scan(which);
        EXPECT_TRUE(s.clean) << std::hex << s.at << ": " << s.why;
        EXPECT_GT(s.instructions, 100u);
    }
    EXPECT_EQ(ukp_lean_dispatch(), UKP_LEAN_KPROBE | UKP_LEAN_KRETPROBE);
    // The kretprobe's own pre_handler (which takes an instance and hijacks the return
    // address) is proven too: the entry of an optimized `ro` saves nothing either.
    kretprobe rp{};
    rp.kp.symbol_name = "ukpt_opt_work";
    rp.handler = [](kretprobe_instance *, pt_regs *) { return 0; };
    ASSERT_EQ(register_kretprobe(&rp), 0);
    EXPECT_EQ(gpr_bits(rp.kp), "1");
    unregister_kretprobe(&rp);
#endif
}

// The same in the shared library, where a call from one of the agent's files to another
// goes through the PLT (an indirect jump the scan cannot follow) unless the callee is
// hidden.
TEST_F(VectorPath, TheSharedLibrarysDispatchersAreProvenClean) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    GTEST_SKIP() << "the sanitizers' checks call out through the PLT: the dispatchers save the state";
#else
    FILE *out = popen(UKP_LEAN_TARGET, "r");
    ASSERT_NE(out, nullptr);
    char line[64] = {};
    ASSERT_NE(std::fgets(line, sizeof line, out), nullptr);
    EXPECT_EQ(pclose(out), 0);
    int dispatch = -1, trace = -1;
    ASSERT_EQ(std::sscanf(line, "%d %d", &dispatch, &trace), 2) << line;
    EXPECT_EQ(dispatch, UKP_LEAN_KPROBE | UKP_LEAN_KRETPROBE) << line;
    EXPECT_EQ(trace, 1) << "an event's hit handlers call nothing through the PLT: " << line;
#endif
}

// The tracer's hit handlers (fetch, ring buffer, filter, histogram, triggers) are proven
// too: they call into the C library only through saving_vectors (core::agent_call: a
// thread's first hit, a clock segment, a trigger's action), and read the CPU from rseq.
TEST_F(VectorPath, TheTracersHitHandlersAreProvenClean) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    GTEST_SKIP() << "the sanitizers' checks call out through the PLT";
#else
    EXPECT_EQ(ukp_trace_lean(), 1);
#endif
}

// The agent's own handlers (the tracer's, asked about at every event's registration) are
// scanned once; any other function at every question, as another library may since have
// been loaded where its own was.
TEST_F(VectorPath, AnOwnHandlerIsScannedOnceOthersAtEveryQuestion) {
    const void *own = reinterpret_cast<const void *>(vu_int);
    const void *other = reinterpret_cast<const void *>(vu_loop);
    ukp::core::mark_own_handler(own);
    // The scan reads the code as it was before the probes: under the registry mutex.
    std::lock_guard lock(ukp::core::registry_mutex());
    ASSERT_TRUE(ukp::core::handler_is_lean(own));
    const uint64_t scans = ukp::arch::vector_scans();
    EXPECT_TRUE(ukp::core::handler_is_lean(own));
    EXPECT_EQ(ukp::arch::vector_scans(), scans) << "the verdict on an own handler is kept";
    EXPECT_TRUE(ukp::core::handler_is_lean(other));
    EXPECT_TRUE(ukp::core::handler_is_lean(other));
    EXPECT_EQ(ukp::arch::vector_scans(), scans + 2);
    EXPECT_FALSE(ukp::core::handler_is_lean(reinterpret_cast<const void *>(vu_xmm)));
}

// A probe on a function that a handler calls: the scan reads the code under the int3,
// which would otherwise look like the end of the path, and judges the function by it.
TEST_F(VectorPath, AProbeOnCalledCodeDoesNotHideItFromTheScan) {
    ASSERT_EQ(ukp_set_kprobes_optimization(0), 0); // the int3 stays (a jump would be read through too)
    kprobe on_callee{};
    on_callee.addr = reinterpret_cast<kprobe_opcode_t *>(vu_xmm);
    ASSERT_EQ(register_kprobe(&on_callee), 0);
    ASSERT_EQ(*reinterpret_cast<const volatile uint8_t *>(vu_xmm), 0xcc);
    kprobe kp{};
    kp.symbol_name = "ukpt_opt_work";
    kp.pre_handler = reinterpret_cast<kprobe_pre_handler_t>(vu_calls_xmm);
    EXPECT_EQ(register_kprobe(&kp), 0);
    EXPECT_EQ(gpr_bits(kp), "0");
    unregister_kprobe(&kp);
    unregister_kprobe(&on_callee);
    ukp_set_kprobes_optimization(1);
}

// Each probe of an aggregate keeps its own bit as others come and go.
TEST_F(VectorPath, EachHandlerIsJudgedOnItsOwn) {
    kprobe a{}, b{}, c{}, d{};
    for (kprobe *p : {&a, &b, &c, &d}) p->symbol_name = "ukpt_opt_vec_probe";
    a.pre_handler = reinterpret_cast<kprobe_pre_handler_t>(vu_count);
    b.pre_handler = vector_pre;
    c.pre_handler = reinterpret_cast<kprobe_pre_handler_t>(vu_count);
    // d has no pre_handler: nothing to save anything for.
    ASSERT_EQ(register_kprobe(&a), 0);
    ASSERT_EQ(register_kprobe(&b), 0);
    EXPECT_EQ(gpr_bits(a), "10");
    ASSERT_EQ(register_kprobe(&c), 0);
    ASSERT_EQ(register_kprobe(&d), 0);
    EXPECT_EQ(gpr_bits(a), "1011");
    unregister_kprobe(&a);
    EXPECT_EQ(gpr_bits(b), "011");
    unregister_kprobe(&c);
    EXPECT_EQ(gpr_bits(b), "01");
    unregister_kprobe(&b);
    unregister_kprobe(&d);
}

// A handler proven clean beside one that is not, on one optimized probe: both run, and
// the vector registers and MXCSR the program holds come back as they were.
TEST_F(VectorPath, TheProgramsVectorStateSurvivesAMixedAggregate) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx")) GTEST_SKIP() << "no AVX";
    kprobe a{}, b{};
    a.symbol_name = b.symbol_name = "ukpt_opt_vec_probe";
    a.pre_handler = reinterpret_cast<kprobe_pre_handler_t>(vu_count);
    b.pre_handler = vector_pre;
    ASSERT_EQ(register_kprobe(&a), 0);
    ASSERT_EQ(register_kprobe(&b), 0);
    ukp_optimizer_flush();
    EXPECT_TRUE(optimized(a));
    EXPECT_EQ(gpr_bits(a), "10");
    calls_keep_vectors_and_mxcsr(13, "aggregate");
    EXPECT_EQ(clean_hits(), 3);
    EXPECT_EQ(g_vector_hits.load(), 3);
    unregister_kprobe(&a);
    unregister_kprobe(&b);
}

int vector_ret_handler(kretprobe_instance *, pt_regs *regs) { return vector_pre(nullptr, regs); }

// A kretprobe on an optimized entry: its entry and return handlers are not proven, and
// run on the two paths without the saved state; the ymm registers and MXCSR the caller
// keeps across the call come back as they were. The same with handlers proven clean.
TEST_F(VectorPath, TheProgramsVectorStateSurvivesAKretprobe) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx")) GTEST_SKIP() << "no AVX";
    for (bool proven : {false, true}) {
        __atomic_store_n(&vu_hits, 0, __ATOMIC_RELAXED);
        g_vector_hits = 0;
        kretprobe rp{};
        rp.kp.symbol_name = "ukpt_opt_vec_probe";
        if (proven) {
            rp.entry_handler = reinterpret_cast<kretprobe_handler_t>(vu_count);
            rp.handler = rp.entry_handler;
        } else {
            rp.entry_handler = vector_ret_handler;
            rp.handler = vector_ret_handler;
        }
        ASSERT_EQ(register_kretprobe(&rp), 0);
        ukp_optimizer_flush();
        EXPECT_TRUE(optimized(rp.kp));
        calls_keep_vectors_and_mxcsr(29, proven ? "proven" : "unproven");
        EXPECT_EQ(proven ? clean_hits() : g_vector_hits.load(), 6) << proven;
        unregister_kretprobe(&rp);
    }
}

std::atomic<long> g_faults{0};

// Not clean: float math, and a change of rounding the program must not see.
int vector_fault_handler(kprobe *, pt_regs *, int) {
    _mm_setcsr((_mm_getcsr() & ~0x6000u) | 0x6000u); // round toward zero
    volatile double d = 3.0;
    g_faults.fetch_add(static_cast<long>(d / 3.0), std::memory_order_relaxed);
    return 0;
}

// A clean handler that faults on the path without the saved state: the registers roll
// back, and the fault_handler (not clean) runs with the state saved around it.
TEST_F(VectorPath, ACleanHandlersFaultRollsBackAndItsFaultHandlerKeepsTheState) {
    kprobe kp{};
    kp.symbol_name = "ukpt_opt_work";
    kp.pre_handler = reinterpret_cast<kprobe_pre_handler_t>(vu_faulting); // proven, changes ax and di, faults
    kp.fault_handler = vector_fault_handler;
    g_faults = 0;
    ASSERT_EQ(register_kprobe(&kp), 0);
    ukp_optimizer_flush();
    EXPECT_TRUE(optimized(kp));
    EXPECT_EQ(gpr_bits(kp), "1");
    const unsigned csr = _mm_getcsr();
    for (long i = 0; i < 5; ++i) {
        EXPECT_EQ(ukpt_opt_work(i), ((i + 1) * 3) ^ i) << i;
        EXPECT_EQ(_mm_getcsr(), csr) << i;
    }
    EXPECT_EQ(g_faults.load(), 5);
    EXPECT_EQ(kp.nmissed, 5u);
    unregister_kprobe(&kp);
}

} // namespace

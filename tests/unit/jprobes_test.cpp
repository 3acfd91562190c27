// Jprobes (kprobes.txt, "How Does a Jprobe Work?", register_jprobe, "Features and
// Limitations"): the handler runs on entry with the probed function's arguments (integer
// and floating-point registers, and arguments on the stack), ends with jprobe_return(),
// and the function then runs with its ORIGINAL arguments, even when the handler changed
// its own copies, the argument registers, the stack arguments or the vector registers.
#include <ukprobes/kprobes.h>

#include "asm_functions.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#define NOIPA __attribute__((noipa))

// What the probed functions received, and what their jprobe handlers received.
long g_fn[12], g_h[12];
double g_fnd[12], g_hd[12];
std::atomic<int> g_fn_calls{0}, g_h_calls{0};
double g_fp_work = 0;
unsigned long g_handler_sp = 0, g_fn_sp = 0;

// Overwrites an argument in place: for an argument passed on the stack, that is the
// caller's outgoing-argument area, which the callee owns. (A plain volatile store to a
// parameter is dropped by GCC before a noreturn call; hiding the pointer keeps it.)
#define SMASH(x, val)                                                                                                  \
    do {                                                                                                               \
        auto *p_ = &(x);                                                                                               \
        asm volatile("" : "+r"(p_));                                                                                   \
        *p_ = (val);                                                                                                   \
        asm volatile("" : : "r"(p_) : "memory");                                                                       \
    } while (0)
// Fills every integer argument register with garbage (the handler may: it never returns).
#define CLOBBER_INT_ARG_REGS()                                                                                         \
    asm volatile("mov $-1, %%rdi\n\tmov $-1, %%rsi\n\tmov $-1, %%rdx\n\t"                                              \
                 "mov $-1, %%rcx\n\tmov $-1, %%r8\n\tmov $-1, %%r9\n\tmov $-1, %%rax" ::                               \
                     : "rdi", "rsi", "rdx", "rcx", "r8", "r9", "rax", "memory")
// Fills every vector register with all-ones (a NaN pattern), as floating-point work would.
#define CLOBBER_XMM_REGS()                                                                                             \
    asm volatile("pcmpeqd %%xmm0, %%xmm0\n\tpcmpeqd %%xmm1, %%xmm1\n\tpcmpeqd %%xmm2, %%xmm2\n\t"                      \
                 "pcmpeqd %%xmm3, %%xmm3\n\tpcmpeqd %%xmm4, %%xmm4\n\tpcmpeqd %%xmm5, %%xmm5\n\t"                      \
                 "pcmpeqd %%xmm6, %%xmm6\n\tpcmpeqd %%xmm7, %%xmm7\n\tpcmpeqd %%xmm8, %%xmm8\n\t"                      \
                 "pcmpeqd %%xmm15, %%xmm15" ::                                                                         \
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm15", "memory")

// ---- probed functions: 1..8 integer arguments (7 and 8 on the stack) -------------------------

extern "C" {
NOIPA long ukj_a1(long a) {
    g_fn[0] = a;
    ++g_fn_calls;
    return a + 1;
}
NOIPA long ukj_a2(long a, long b) {
    g_fn[0] = a, g_fn[1] = b;
    ++g_fn_calls;
    return a * 2 + b;
}
NOIPA long ukj_a3(long a, long b, long c) {
    g_fn[0] = a, g_fn[1] = b, g_fn[2] = c;
    ++g_fn_calls;
    return a + b * 3 + c;
}
NOIPA long ukj_a4(long a, long b, long c, long d) {
    g_fn[0] = a, g_fn[1] = b, g_fn[2] = c, g_fn[3] = d;
    ++g_fn_calls;
    return a + b + c * 4 + d;
}
NOIPA long ukj_a5(long a, long b, long c, long d, long e) {
    g_fn[0] = a, g_fn[1] = b, g_fn[2] = c, g_fn[3] = d, g_fn[4] = e;
    ++g_fn_calls;
    return a + b + c + d * 5 + e;
}
NOIPA long ukj_a6(long a, long b, long c, long d, long e, long f) {
    g_fn[0] = a, g_fn[1] = b, g_fn[2] = c, g_fn[3] = d, g_fn[4] = e, g_fn[5] = f;
    ++g_fn_calls;
    return a + b + c + d + e * 6 + f;
}
NOIPA long ukj_a7(long a, long b, long c, long d, long e, long f, long g) {
    g_fn[0] = a, g_fn[1] = b, g_fn[2] = c, g_fn[3] = d, g_fn[4] = e, g_fn[5] = f, g_fn[6] = g;
    ++g_fn_calls;
    return a + b + c + d + e + f * 7 + g;
}
NOIPA long ukj_a8(long a, long b, long c, long d, long e, long f, long g, long h) {
    g_fn[0] = a, g_fn[1] = b, g_fn[2] = c, g_fn[3] = d, g_fn[4] = e, g_fn[5] = f, g_fn[6] = g, g_fn[7] = h;
    ++g_fn_calls;
    return a + b + c + d + e + f + g * 8 + h;
}

// Floating point: a..h in xmm0..xmm7, i and j on the stack.
NOIPA double ukj_fp(double a, float b, double c, float d, double e, double f, double g, double h, double i, float j) {
    const double v[10] = {a, b, c, d, e, f, g, h, i, j};
    std::memcpy(g_fnd, v, sizeof v);
    ++g_fn_calls;
    return a + b + c + d + e + f + g + h + i * 2 + j;
}

// Mixed: a c e g h i in rdi rsi rdx rcx r8 r9; b d f k in xmm0..xmm3; j and l on the stack.
NOIPA long ukj_mix(int a, double b, long c, float d, char e, double f, short g, unsigned char h, long i, long j,
                   double k, int l) {
    g_fn[0] = a, g_fn[1] = c, g_fn[2] = e, g_fn[3] = g, g_fn[4] = h, g_fn[5] = i, g_fn[6] = j, g_fn[7] = l;
    g_fnd[0] = b, g_fnd[1] = d, g_fnd[2] = f, g_fnd[3] = k;
    ++g_fn_calls;
    return a + c + e + g + h + i + j + l + static_cast<long>(b + d + f + k);
}
}

// Larger than 16 bytes: passed in memory, on the stack.
struct Big {
    long a, b, c, d;
};

extern "C" NOIPA long ukj_struct(long x, Big s, long y) {
    g_fn[0] = x, g_fn[1] = s.a, g_fn[2] = s.b, g_fn[3] = s.c, g_fn[4] = s.d, g_fn[5] = y;
    ++g_fn_calls;
    return x + s.a + s.b * 2 + s.c * 3 + s.d * 4 + y * 5;
}

extern "C" NOIPA long ukj_rec(long n, long tag) {
    g_fn[0] = n;
    if (n == 0) return tag;
    long r = ukj_rec(n - 1, tag);
    asm volatile("" : "+r"(r) : : "memory");
    return r + 1;
}

extern "C" NOIPA long ukj_plain(long x) {
    asm volatile("" ::: "memory");
    return x * 10 + 3;
}

namespace {

// ---- handlers ---------------------------------------------------------------------------------

long h_a1(long a) {
    g_h[0] = a;
    ++g_h_calls;
    CLOBBER_INT_ARG_REGS();
    jprobe_return();
}
long h_a2(long a, long b) {
    g_h[0] = a, g_h[1] = b;
    ++g_h_calls;
    CLOBBER_INT_ARG_REGS();
    jprobe_return();
}
long h_a3(long a, long b, long c) {
    g_h[0] = a, g_h[1] = b, g_h[2] = c;
    ++g_h_calls;
    CLOBBER_INT_ARG_REGS();
    jprobe_return();
}
long h_a4(long a, long b, long c, long d) {
    g_h[0] = a, g_h[1] = b, g_h[2] = c, g_h[3] = d;
    ++g_h_calls;
    CLOBBER_INT_ARG_REGS();
    jprobe_return();
}
long h_a5(long a, long b, long c, long d, long e) {
    g_h[0] = a, g_h[1] = b, g_h[2] = c, g_h[3] = d, g_h[4] = e;
    ++g_h_calls;
    CLOBBER_INT_ARG_REGS();
    jprobe_return();
}
long h_a6(long a, long b, long c, long d, long e, long f) {
    g_h[0] = a, g_h[1] = b, g_h[2] = c, g_h[3] = d, g_h[4] = e, g_h[5] = f;
    ++g_h_calls;
    CLOBBER_INT_ARG_REGS();
    jprobe_return();
}
long h_a7(long a, long b, long c, long d, long e, long f, long g) {
    g_h[0] = a, g_h[1] = b, g_h[2] = c, g_h[3] = d, g_h[4] = e, g_h[5] = f, g_h[6] = g;
    ++g_h_calls;
    // The callee owns its stack arguments: change the one on the stack.
    SMASH(g, -7);
    CLOBBER_INT_ARG_REGS();
    jprobe_return();
}
long h_a8(long a, long b, long c, long d, long e, long f, long g, long h) {
    g_h[0] = a, g_h[1] = b, g_h[2] = c, g_h[3] = d, g_h[4] = e, g_h[5] = f, g_h[6] = g, g_h[7] = h;
    ++g_h_calls;
    SMASH(g, -7);
    SMASH(h, -8);
    CLOBBER_INT_ARG_REGS();
    jprobe_return();
}

double h_fp(double a, float b, double c, float d, double e, double f, double g, double h, double i, float j) {
    const double v[10] = {a, b, c, d, e, f, g, h, i, j};
    std::memcpy(g_hd, v, sizeof v);
    ++g_h_calls;
    // Floating-point work, then every vector register and the stack arguments changed.
    volatile double x = a;
    g_fp_work = std::sqrt(x * x + 2.0) / (1.0 + std::fabs(static_cast<double>(b))) + std::sin(x);
    SMASH(i, -1.5);
    SMASH(j, -2.5f);
    CLOBBER_XMM_REGS();
    CLOBBER_INT_ARG_REGS();
    jprobe_return();
}

long h_mix(int a, double b, long c, float d, char e, double f, short g, unsigned char h, long i, long j, double k,
           int l) {
    g_h[0] = a, g_h[1] = c, g_h[2] = e, g_h[3] = g, g_h[4] = h, g_h[5] = i, g_h[6] = j, g_h[7] = l;
    g_hd[0] = b, g_hd[1] = d, g_hd[2] = f, g_hd[3] = k;
    ++g_h_calls;
    SMASH(j, -9);
    SMASH(l, -10);
    CLOBBER_XMM_REGS();
    CLOBBER_INT_ARG_REGS();
    jprobe_return();
}

long h_struct(long x, Big s, long y) {
    g_h[0] = x, g_h[1] = s.a, g_h[2] = s.b, g_h[3] = s.c, g_h[4] = s.d, g_h[5] = y;
    ++g_h_calls;
    SMASH(s, (Big{-1, -2, -3, -4}));
    CLOBBER_INT_ARG_REGS();
    jprobe_return();
}

long h_rec(long n, long tag) {
    g_h[0] = n, g_h[1] = tag;
    ++g_h_calls;
    CLOBBER_INT_ARG_REGS();
    jprobe_return();
}

long h_plain(long x) {
    g_h[0] = x;
    ++g_h_calls;
    // A large frame: the handler's own stack use must not disturb the function.
    volatile char big[8192];
    for (size_t k = 0; k < sizeof big; k += 512) big[k] = static_cast<char>(k);
    (void)big[100];
    jprobe_return();
}

long h_plain_other(long x) {
    g_h[1] = x;
    jprobe_return();
}

std::string list() {
    char *text = ukp_kprobes_list();
    std::string s = text != nullptr ? text : "";
    std::free(text);
    return s;
}

jprobe make_jp(void *fn, void *handler) {
    jprobe jp{};
    jp.kp.addr = reinterpret_cast<kprobe_opcode_t *>(fn);
    jp.entry = handler;
    return jp;
}

jprobe make_jp(const char *sym, void *handler) {
    jprobe jp{};
    jp.kp.symbol_name = sym;
    jp.entry = handler;
    return jp;
}

class JprobesTest : public ::testing::Test {
protected:
    void SetUp() override {
        std::memset(g_fn, 0, sizeof g_fn);
        std::memset(g_h, 0, sizeof g_h);
        std::memset(g_fnd, 0, sizeof g_fnd);
        std::memset(g_hd, 0, sizeof g_hd);
        g_fn_calls = 0;
        g_h_calls = 0;
        ASSERT_EQ(ukp_kprobes_enabled(), 1);
    }
    void TearDown() override { EXPECT_EQ(list(), "") << "a test left probes registered"; }

    void expect_ints(int n, const long *expected) {
        for (int i = 0; i < n; ++i) {
            SCOPED_TRACE(i);
            EXPECT_EQ(g_h[i], expected[i]) << "the handler got the argument";
            EXPECT_EQ(g_fn[i], expected[i]) << "the function got its original argument";
        }
    }
};

// ---- argument mirroring ------------------------------------------------------------------------

TEST_F(JprobesTest, IntegerArguments1To8) {
    std::vector<jprobe> jps = {
        make_jp(reinterpret_cast<void *>(&ukj_a1), JPROBE_ENTRY(h_a1)),
        make_jp(reinterpret_cast<void *>(&ukj_a2), JPROBE_ENTRY(h_a2)),
        make_jp(reinterpret_cast<void *>(&ukj_a3), JPROBE_ENTRY(h_a3)),
        make_jp(reinterpret_cast<void *>(&ukj_a4), JPROBE_ENTRY(h_a4)),
        make_jp(reinterpret_cast<void *>(&ukj_a5), JPROBE_ENTRY(h_a5)),
        make_jp(reinterpret_cast<void *>(&ukj_a6), JPROBE_ENTRY(h_a6)),
        make_jp(reinterpret_cast<void *>(&ukj_a7), JPROBE_ENTRY(h_a7)),
        make_jp(reinterpret_cast<void *>(&ukj_a8), JPROBE_ENTRY(h_a8)),
    };
    for (auto &jp : jps) ASSERT_EQ(register_jprobe(&jp), 0);
    const long v[8] = {0x1111, -0x2222, 0x33333333333L, 4, -5, 0x6666, 0x7777777, -0x888888888L};
    for (int round = 0; round < 3; ++round) {
        SCOPED_TRACE(round);
        const int calls = g_fn_calls;
        EXPECT_EQ(ukj_a1(v[0]), v[0] + 1);
        expect_ints(1, v);
        EXPECT_EQ(ukj_a2(v[0], v[1]), v[0] * 2 + v[1]);
        expect_ints(2, v);
        EXPECT_EQ(ukj_a3(v[0], v[1], v[2]), v[0] + v[1] * 3 + v[2]);
        expect_ints(3, v);
        EXPECT_EQ(ukj_a4(v[0], v[1], v[2], v[3]), v[0] + v[1] + v[2] * 4 + v[3]);
        expect_ints(4, v);
        EXPECT_EQ(ukj_a5(v[0], v[1], v[2], v[3], v[4]), v[0] + v[1] + v[2] + v[3] * 5 + v[4]);
        expect_ints(5, v);
        EXPECT_EQ(ukj_a6(v[0], v[1], v[2], v[3], v[4], v[5]), v[0] + v[1] + v[2] + v[3] + v[4] * 6 + v[5]);
        expect_ints(6, v);
        EXPECT_EQ(ukj_a7(v[0], v[1], v[2], v[3], v[4], v[5], v[6]), v[0] + v[1] + v[2] + v[3] + v[4] + v[5] * 7 + v[6]);
        expect_ints(7, v);
        EXPECT_EQ(ukj_a8(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]),
                  v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] * 8 + v[7]);
        expect_ints(8, v);
        EXPECT_EQ(g_fn_calls, calls + 8);
        EXPECT_EQ(g_h_calls, g_fn_calls) << "one handler call per function call";
    }
    for (auto &jp : jps) unregister_jprobe(&jp);
    const int h = g_h_calls;
    EXPECT_EQ(ukj_a8(1, 2, 3, 4, 5, 6, 7, 8), 1 + 2 + 3 + 4 + 5 + 6 + 7 * 8 + 8);
    EXPECT_EQ(g_h_calls, h) << "no handler after unregister";
}

TEST_F(JprobesTest, FloatingPointArguments) {
    jprobe jp = make_jp("ukj_fp", JPROBE_ENTRY(h_fp));
    ASSERT_EQ(register_jprobe(&jp), 0);
    const double v[10] = {1.25, 2.5f, -3.75, 4.5f, 1e100, -6.125, 7.0 / 3.0, 8e-300, 9.875, -10.5f};
    const double expected = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7] + v[8] * 2 + v[9];
    // Computed the same way as the function does, so the result is bit-identical.
    const double got = ukj_fp(v[0], static_cast<float>(v[1]), v[2], static_cast<float>(v[3]), v[4], v[5], v[6], v[7],
                              v[8], static_cast<float>(v[9]));
    EXPECT_EQ(got, expected);
    EXPECT_EQ(g_h_calls, 1);
    EXPECT_EQ(g_fn_calls, 1);
    for (int i = 0; i < 10; ++i) {
        SCOPED_TRACE(i);
        EXPECT_EQ(g_hd[i], v[i]) << "the handler got the argument";
        EXPECT_EQ(g_fnd[i], v[i]) << "the function got its original argument";
    }
    EXPECT_TRUE(std::isfinite(g_fp_work));
    unregister_jprobe(&jp);
}

TEST_F(JprobesTest, MixedIntegerAndFloatingPointArguments) {
    jprobe jp = make_jp("ukj_mix", JPROBE_ENTRY(h_mix));
    ASSERT_EQ(register_jprobe(&jp), 0);
    const long ints[8] = {-123456, 0x123456789aL, 'z', -3210, 250, -0x7fffffffffL, 0x5555aaaa5555L, 77777};
    const double fps[4] = {0.5, -1.75f, 3.0e10, -42.25};
    const long result =
        ukj_mix(static_cast<int>(ints[0]), fps[0], ints[1], static_cast<float>(fps[1]), static_cast<char>(ints[2]),
                fps[2], static_cast<short>(ints[3]), static_cast<unsigned char>(ints[4]), ints[5], ints[6], fps[3],
                static_cast<int>(ints[7]));
    long sum = 0;
    for (long x : ints) sum += x;
    EXPECT_EQ(result, sum + static_cast<long>(fps[0] + fps[1] + fps[2] + fps[3]));
    EXPECT_EQ(g_h_calls, 1);
    expect_ints(8, ints);
    for (int i = 0; i < 4; ++i) {
        SCOPED_TRACE(i);
        EXPECT_EQ(g_hd[i], fps[i]);
        EXPECT_EQ(g_fnd[i], fps[i]);
    }
    unregister_jprobe(&jp);
}

TEST_F(JprobesTest, StructPassedByValueOnTheStack) {
    jprobe jp = make_jp("ukj_struct", JPROBE_ENTRY(h_struct));
    ASSERT_EQ(register_jprobe(&jp), 0);
    const Big s{11, -22, 0x3333333333L, 44};
    EXPECT_EQ(ukj_struct(5, s, -6), 5 + 11 - 22 * 2 + 0x3333333333L * 3 + 44 * 4 - 6 * 5);
    const long expected[6] = {5, 11, -22, 0x3333333333L, 44, -6};
    EXPECT_EQ(g_h_calls, 1);
    expect_ints(6, expected);
    unregister_jprobe(&jp);
}

TEST_F(JprobesTest, RecursiveFunctionEveryCall) {
    jprobe jp = make_jp("ukj_rec", JPROBE_ENTRY(h_rec));
    ASSERT_EQ(register_jprobe(&jp), 0);
    EXPECT_EQ(ukj_rec(200, 1000), 1200);
    EXPECT_EQ(g_h_calls, 201);
    EXPECT_EQ(g_h[0], 0) << "last handler call: the deepest";
    EXPECT_EQ(g_h[1], 1000);
    unregister_jprobe(&jp);
}

TEST_F(JprobesTest, HandlerWithALargeFrame) {
    jprobe jp = make_jp("ukj_plain", JPROBE_ENTRY(h_plain));
    ASSERT_EQ(register_jprobe(&jp), 0);
    for (long i = 0; i < 50; ++i) EXPECT_EQ(ukj_plain(i), i * 10 + 3);
    EXPECT_EQ(g_h_calls, 50);
    EXPECT_EQ(g_h[0], 49);
    unregister_jprobe(&jp);
}

// ---- many threads ------------------------------------------------------------------------------

thread_local long t_expect = 0;
std::atomic<long> g_mt_bad{0}, g_mt_handled{0};

long h_mt(long a, long b, long c, long d, long e, long f, long g, long h) {
    const long got[8] = {a, b, c, d, e, f, g, h};
    for (int i = 0; i < 8; ++i)
        if (got[i] != t_expect + i) g_mt_bad.fetch_add(1);
    g_mt_handled.fetch_add(1);
    SMASH(g, -1);
    SMASH(h, -1);
    CLOBBER_INT_ARG_REGS();
    jprobe_return();
}

} // namespace

extern "C" NOIPA long ukj_mt(long a, long b, long c, long d, long e, long f, long g, long h) {
    asm volatile("" ::: "memory");
    return a + b * 2 + c * 3 + d * 4 + e * 5 + f * 6 + g * 7 + h * 8;
}

namespace {

TEST_F(JprobesTest, ManyThreadsAtOnce) {
    g_mt_bad = 0;
    g_mt_handled = 0;
    jprobe jp = make_jp("ukj_mt", JPROBE_ENTRY(h_mt));
    ASSERT_EQ(register_jprobe(&jp), 0);
    constexpr int kThreads = 6, kCalls = 2000;
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
        threads.emplace_back([&, t] {
            for (int i = 0; i < kCalls; ++i) {
                const long x = (t + 1) * 1000000L + i * 16;
                t_expect = x;
                const long want =
                    x + (x + 1) * 2 + (x + 2) * 3 + (x + 3) * 4 + (x + 4) * 5 + (x + 5) * 6 + (x + 6) * 7 + (x + 7) * 8;
                if (ukj_mt(x, x + 1, x + 2, x + 3, x + 4, x + 5, x + 6, x + 7) != want) wrong.fetch_add(1);
            }
        });
    for (auto &t : threads) t.join();
    EXPECT_EQ(wrong, 0) << "the function saw its original arguments";
    EXPECT_EQ(g_mt_bad, 0) << "each handler saw its own thread's arguments";
    EXPECT_EQ(g_mt_handled, kThreads * kCalls);
    unregister_jprobe(&jp);
}

// ---- registration ------------------------------------------------------------------------------

TEST_F(JprobesTest, ErrorsOfRegistration) {
    jprobe first = make_jp("ukj_plain", JPROBE_ENTRY(h_plain));
    ASSERT_EQ(register_jprobe(&first), 0);
    EXPECT_EQ(reinterpret_cast<void *>(first.kp.addr), reinterpret_cast<void *>(&ukj_plain));
    jprobe second = make_jp("ukj_plain", JPROBE_ENTRY(h_plain_other));
    EXPECT_EQ(register_jprobe(&second), -EBUSY) << "at most one jprobe per function";
    jprobe second_by_addr = make_jp(reinterpret_cast<void *>(&ukj_plain), JPROBE_ENTRY(h_plain_other));
    EXPECT_EQ(register_jprobe(&second_by_addr), -EBUSY);
    EXPECT_EQ(register_jprobe(&first), -EINVAL) << "registered twice";
    EXPECT_EQ(ukj_plain(4), 43);
    EXPECT_EQ(g_h_calls, 1) << "only the first jprobe runs";
    EXPECT_EQ(g_h[1], 0);
    unregister_jprobe(&first);
    // Once the first is gone, another may take its place.
    second.kp.addr = nullptr;
    ASSERT_EQ(register_jprobe(&second), 0);
    EXPECT_EQ(ukj_plain(5), 53);
    EXPECT_EQ(g_h[1], 5);
    unregister_jprobe(&second);

    jprobe mid = make_jp(reinterpret_cast<void *>(ukpt_branches_at_call), JPROBE_ENTRY(h_a1));
    EXPECT_EQ(register_jprobe(&mid), -EINVAL) << "not the first instruction of a function";
    jprobe offset = make_jp("ukpt_branches", JPROBE_ENTRY(h_a1));
    offset.kp.offset = static_cast<unsigned>(ukpt_branches_at_jcc - reinterpret_cast<char *>(&ukpt_branches));
    EXPECT_EQ(register_jprobe(&offset), -EINVAL);
    jprobe unknown = make_jp("no_such_function_anywhere", JPROBE_ENTRY(h_a1));
    EXPECT_EQ(register_jprobe(&unknown), -ENOENT);
    EXPECT_EQ(list(), "");
}

long g_kp_di = 0;
std::atomic<int> g_kp_hits{0};
int kp_pre(kprobe *, pt_regs *regs) {
    ++g_kp_hits;
    g_kp_di = static_cast<long>(regs->di);
    return 0;
}

TEST_F(JprobesTest, JprobeAndKprobeOnTheSameFunctionBothRun) {
    g_kp_hits = 0;
    for (bool kprobe_first : {true, false}) {
        SCOPED_TRACE(kprobe_first);
        g_kp_hits = 0;
        g_h_calls = 0;
        kprobe kp{};
        kp.symbol_name = "ukj_a2";
        kp.pre_handler = kp_pre;
        jprobe jp = make_jp("ukj_a2", JPROBE_ENTRY(h_a2));
        if (kprobe_first) {
            ASSERT_EQ(register_kprobe(&kp), 0);
        }
        ASSERT_EQ(register_jprobe(&jp), 0);
        if (!kprobe_first) {
            ASSERT_EQ(register_kprobe(&kp), 0);
        }
        EXPECT_EQ(ukj_a2(20, 3), 43);
        EXPECT_EQ(g_kp_hits, 1);
        EXPECT_EQ(g_kp_di, 20);
        EXPECT_EQ(g_h_calls, 1);
        const long v[2] = {20, 3};
        expect_ints(2, v);
        unregister_jprobe(&jp);
        EXPECT_EQ(ukj_a2(1, 1), 3);
        EXPECT_EQ(g_kp_hits, 2) << "the kprobe stays";
        EXPECT_EQ(g_h_calls, 1);
        unregister_kprobe(&kp);
    }
}

std::atomic<int> g_rp_hits{0};
long g_rp_value = 0;
int rp_ret(kretprobe_instance *, pt_regs *regs) {
    ++g_rp_hits;
    g_rp_value = static_cast<long>(regs_return_value(regs));
    return 0;
}

TEST_F(JprobesTest, JprobeAndKretprobeOnTheSameFunctionBothRun) {
    g_rp_hits = 0;
    jprobe jp = make_jp("ukj_a3", JPROBE_ENTRY(h_a3));
    kretprobe rp{};
    rp.kp.symbol_name = "ukj_a3";
    rp.handler = rp_ret;
    rp.maxactive = 4;
    ASSERT_EQ(register_jprobe(&jp), 0);
    ASSERT_EQ(register_kretprobe(&rp), 0);
    EXPECT_EQ(ukj_a3(1, 2, 3), 1 + 6 + 3);
    EXPECT_EQ(g_h_calls, 1);
    EXPECT_EQ(g_rp_hits, 1);
    EXPECT_EQ(g_rp_value, 10);
    const long v[3] = {1, 2, 3};
    expect_ints(3, v);
    unregister_kretprobe(&rp);
    unregister_jprobe(&jp);
}

TEST_F(JprobesTest, BatchRegistration) {
    jprobe a = make_jp("ukj_a1", JPROBE_ENTRY(h_a1)), b = make_jp("ukj_a2", JPROBE_ENTRY(h_a2));
    jprobe *ok[] = {&a, &b};
    ASSERT_EQ(register_jprobes(ok, 2), 0);
    EXPECT_EQ(ukj_a1(1), 2);
    EXPECT_EQ(ukj_a2(1, 2), 4);
    EXPECT_EQ(g_h_calls, 2);
    unregister_jprobes(ok, 2);
    EXPECT_EQ(list(), "");
    EXPECT_EQ(ukj_a1(1), 2);
    EXPECT_EQ(g_h_calls, 2);

    jprobe good = make_jp("ukj_a3", JPROBE_ENTRY(h_a3)), bad = make_jp("no_such_function_anywhere", JPROBE_ENTRY(h_a1));
    jprobe *mixed[] = {&good, &bad};
    EXPECT_EQ(register_jprobes(mixed, 2), -ENOENT);
    EXPECT_EQ(list(), "") << "the probes before the bad one were unregistered";
    EXPECT_EQ(ukj_a3(1, 1, 1), 5);
    EXPECT_EQ(g_h_calls, 2);
    // Two jprobes on one function in one batch: the second is busy, the first undone.
    jprobe d1 = make_jp("ukj_a4", JPROBE_ENTRY(h_a4)), d2 = make_jp("ukj_a4", JPROBE_ENTRY(h_a4));
    jprobe *dup[] = {&d1, &d2};
    EXPECT_EQ(register_jprobes(dup, 2), -EBUSY);
    EXPECT_EQ(list(), "");
    EXPECT_EQ(register_jprobes(ok, 0), -EINVAL);
}

TEST_F(JprobesTest, ListShowsTypeJ) {
    jprobe jp = make_jp("ukj_a1", JPROBE_ENTRY(h_a1));
    ASSERT_EQ(register_jprobe(&jp), 0);
    const std::string text = list();
    const std::regex row("([0-9a-f]{16})  j  ukj_a1\\+0x0  jprobes_test \n");
    std::smatch m;
    ASSERT_TRUE(std::regex_match(text, m, row)) << text;
    EXPECT_EQ(std::stoul(m[1].str(), nullptr, 16), reinterpret_cast<unsigned long>(&ukj_a1));
    unregister_jprobe(&jp);
}

TEST_F(JprobesTest, UnregisteredFunctionIsUnaffected) {
    jprobe jp = make_jp("ukj_mix", JPROBE_ENTRY(h_mix));
    ASSERT_EQ(register_jprobe(&jp), 0);
    unregister_jprobe(&jp);
    const long r = ukj_mix(1, 0.5, 2, 0.25f, 3, 0.25, 4, 5, 6, 7, 1.0, 8);
    EXPECT_EQ(r, 1 + 2 + 3 + 4 + 5 + 6 + 7 + 8 + 2);
    EXPECT_EQ(g_h_calls, 0);
    EXPECT_EQ(g_fn[6], 7);
    EXPECT_EQ(g_fn[7], 8);
}

} // namespace

// Ordinary C++ functions for tests/unit/sweep_test.cpp, which probes every one of their
// instructions in turn and checks that the results do not change.
//
// sweep.cmake compiles this file three times into one executable, at -O0, -O2 and -Os:
// each copy lives in namespace SWEEP_NS (sweep_O0, ...) and exposes its functions through
// extern "C" ukpt_sweep_table_<SWEEP_LEVEL>(). Every function is deterministic, kept out
// of line (noinline, noclone) and exercised by a driver `long drive(long seed)` that calls
// it with inputs derived from the seed, resets any global state it touches first, and
// folds all outputs into one value.
//
// Between them the functions cover: RIP-relative loads, stores, read-modify-writes with
// an immediate, lock-prefixed RIP-relative updates, GOT loads, %fs-relative TLS, lea of
// string literals and of functions, a jump table, recursion, loops and conditional
// branches, direct/indirect/RIP-relative-indirect calls and tail jumps, SSE arithmetic
// on .rodata constants, structs passed and returned by value (registers, stack, hidden
// pointer), memcpy/memset-like loops, a VLA and alloca, stack arguments, bit tricks,
// virtual calls, std::function, 64-bit division, cmov/setcc, and red-zone leaves.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

#if !defined(SWEEP_NS) || !defined(SWEEP_LEVEL)
#error "compile with -DSWEEP_NS=sweep_<level> -DSWEEP_LEVEL=<level> (O0, O2, Os)"
#endif

#define SWEEP_CAT2(a, b) a##b
#define SWEEP_CAT(a, b) SWEEP_CAT2(a, b)
// Out of line and not cloned (no .isra/.constprop copies): the table's address is the
// code the driver runs.
#define SWEEP_FN __attribute__((noinline, noclone))

extern "C" {
// One function to probe: its entry point and how to exercise it. Same definition in
// tests/unit/sweep_test.cpp.
struct ukpt_sweep_fn {
    const char *name;
    void *fn;
    long (*drive)(long seed);
};
}

namespace SWEEP_NS {

// ---- data ------------------------------------------------------------------------------

namespace {
// Internal linkage: accessed RIP-relative directly even under -fPIC.
long g_counter = 0;
int g_table[16];
long g_hist[8];
double g_scale = 1.5;
thread_local long t_calls = 0;
// Called through memory: `call *g_hook(%rip)` / `jmp *g_hook(%rip)` once optimized.
long (*g_hook)(long) = nullptr;
} // namespace

// Default visibility: under -fPIC, reached through the GOT.
long g_exported = 0;

// ---- the functions ---------------------------------------------------------------------

// Folds v into r without signed overflow: r * k + v, modulo 2^64.
inline long mix(long r, long v, unsigned long k = 31) {
    return static_cast<long>(static_cast<unsigned long>(r) * k + static_cast<unsigned long>(v));
}

// Globals read and written: RIP-relative loads, stores, `add $imm, g(%rip)`, an indexed
// array behind a lea of RIP, a locked add, a GOT access and a TLS variable.
SWEEP_FN long global_rw(long x) {
    g_counter += 5;
    g_table[x & 15] += static_cast<int>(x);
    g_exported = g_exported * 3 + x;
    __atomic_fetch_add(&g_hist[x & 7], 1, __ATOMIC_RELAXED);
    ++t_calls;
    if (g_counter > 40) g_counter = 1;
    g_scale = g_scale * 0.5 + static_cast<double>(x);
    return g_counter + g_table[(x + 3) & 15] + g_exported + t_calls;
}

long drive_global_rw(long seed) {
    g_counter = seed;
    for (int i = 0; i < 16; ++i) g_table[i] = i * 3;
    for (long &h : g_hist) h = 0;
    g_exported = seed;
    t_calls = 0;
    g_scale = 1.5;
    long r = 0;
    for (long i = 0; i < 10; ++i) r = mix(r, global_rw(seed * 11 + i * 5), 7);
    for (long h : g_hist) r = mix(r, h, 3);
    long bits;
    std::memcpy(&bits, &g_scale, sizeof bits);
    return r ^ bits;
}

// String literals: a table of pointers to them, a lea of RIP for another, a strlen call.
SWEEP_FN unsigned long string_hash(long x) {
    static const char *const words[] = {"kprobe", "int3",     "single-step", "out-of-line",
                                        "boost",  "red zone", "jump table"};
    const char *s = words[static_cast<unsigned long>(x) % 7];
    unsigned long h = 1469598103934665603ul;
    for (const char *p = s; *p != '\0'; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 1099511628211ul;
    const char *parity = (x & 1) != 0 ? "odd" : "even";
    return h + static_cast<unsigned char>(parity[0]) + std::strlen(s) * 131;
}

long drive_string_hash(long seed) {
    unsigned long r = 0;
    for (long i = 0; i < 7; ++i) r = r * 31 + string_hash(seed + i);
    return static_cast<long>(r);
}

// Dense enough for a jump table at every level.
SWEEP_FN long switch_table(int op, long a) {
    switch (op) {
    case 0:
        return a + 1;
    case 1:
        return a * 3;
    case 2:
        return a - 17;
    case 3:
        return a ^ 0x5a5a;
    case 4:
        return a << 3;
    case 5:
        return a >> 2;
    case 6:
        return -a;
    case 7:
        return a * a;
    case 8:
        return a | 0x100;
    case 9:
        return a & 0xff0;
    case 10:
        return a % 13;
    case 11:
        return a / 5;
    case 12:
        return ~a;
    case 13:
        return a + op * 1000;
    default:
        return 424242;
    }
}

long drive_switch_table(long seed) {
    long r = 0;
    for (int op = -1; op < 16; ++op) r = mix(r, switch_table(op, seed * 37 + op), 5);
    return r;
}

SWEEP_FN long fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

long drive_fib(long seed) { return fib(7 + static_cast<int>(seed % 3)); }

// A loop with data-dependent conditional branches.
SWEEP_FN long collatz(unsigned long n) {
    long steps = 0;
    while (n != 1 && steps < 200) {
        if ((n & 1) != 0)
            n = 3 * n + 1;
        else
            n /= 2;
        ++steps;
    }
    return steps;
}

long drive_collatz(long seed) { return collatz(static_cast<unsigned long>(seed) * 7 + 3) * 1000 + collatz(6); }

SWEEP_FN long add3(long x) { return x + 3; }

SWEEP_FN long mul5(long x) { return x * 5; }

long drive_add3(long seed) { return add3(seed) * 100 + add3(-seed); }

long drive_mul5(long seed) { return mul5(seed) * 100 + mul5(-seed - 1); }

// Calls through a function pointer argument, in a loop.
SWEEP_FN long apply_n(long (*f)(long), long x, int n) {
    for (int i = 0; i < n; ++i) x = f(x) - i;
    return x;
}

long drive_apply_n(long seed) { return apply_n(add3, seed, 5) * 1000 + apply_n(mul5, seed, 4) + apply_n(mul5, 9, 0); }

// A call through a global function pointer (RIP-relative memory operand)...
SWEEP_FN long call_hook(long x) { return g_hook(x * 2) + 1; }

// ...and a tail call through it.
SWEEP_FN long tail_hook(long x) { return g_hook(x + 1); }

long drive_call_hook(long seed) {
    g_hook = add3;
    long r = call_hook(seed);
    g_hook = mul5;
    return r * 1000 + call_hook(seed + 1);
}

long drive_tail_hook(long seed) {
    g_hook = mul5;
    long r = tail_hook(seed);
    g_hook = add3;
    return r * 1000 + tail_hook(seed + 2);
}

// Tail calls to one of two functions (two jmps out at -O2).
SWEEP_FN long tail_dispatch(long x) {
    if ((x & 1) != 0) return add3(x);
    return mul5(x);
}

long drive_tail_dispatch(long seed) { return tail_dispatch(seed) * 1000 + tail_dispatch(seed + 1); }

// SSE arithmetic with constants from .rodata, conversions, fabs (andpd with a mask),
// sqrt, float and double compares.
SWEEP_FN double fp_mix(double x, float y) {
    double r = x * 3.25 + 0.125 / (x + 7.5);
    if (r > 10.0) r -= __builtin_fabs(x) * 0.75;
    float f = y * 1.5f + 0.25f;
    if (f < static_cast<float>(r)) r += f;
    r += __builtin_sqrt(__builtin_fabs(r) + 1.0);
    r += static_cast<double>(static_cast<long>(r * 16.0)) / 64.0;
    return r * g_scale;
}

long drive_fp_mix(long seed) {
    g_scale = 1.5;
    long r = 0;
    for (int i = 0; i < 4; ++i) {
        const double d = fp_mix(static_cast<double>(seed) * 0.7 - i * 2.3, static_cast<float>(seed + i) * 0.5f);
        long bits;
        std::memcpy(&bits, &d, sizeof bits);
        r = mix(r, bits, 3);
    }
    return r;
}

// 24-byte structs: passed on the stack, returned through a hidden pointer.
struct Vec3 {
    double x, y, z;
};

SWEEP_FN Vec3 vec_cross(Vec3 a, Vec3 b) {
    return Vec3{a.y * b.z - a.z * b.y, a.z * b.x - a.x * b.z, a.x * b.y - a.y * b.x};
}

long drive_vec_cross(long seed) {
    const double s = static_cast<double>(seed);
    const Vec3 v = vec_cross(Vec3{s, 2.0, -1.5}, Vec3{0.5, s * s, 3.0});
    return static_cast<long>(v.x * 1000) + static_cast<long>(v.y * 100000) * 3 + static_cast<long>(v.z * 10);
}

// 16-byte struct: passed and returned in registers (rdi:rsi, rax:rdx).
struct Pair {
    long lo, hi;
};

SWEEP_FN Pair pair_divmod(Pair p, long d) { return Pair{p.lo / d + p.hi, p.lo % d - p.hi}; }

long drive_pair_divmod(long seed) {
    const Pair a = pair_divmod(Pair{seed * 1001, seed}, 7);
    const Pair b = pair_divmod(Pair{-seed * 333, 5}, seed + 2);
    return a.lo * 1000003 + a.hi * 101 + b.lo * 7 + b.hi;
}

// memcpy/memset-like loops (at -O2 they may become calls to memcpy/memset).
SWEEP_FN void byte_copy(unsigned char *dst, const unsigned char *src, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = src[i];
}

SWEEP_FN void byte_fill(unsigned char *dst, int c, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = static_cast<unsigned char>(c);
}

long checksum(const unsigned char *p, size_t n) {
    long r = 0;
    for (size_t i = 0; i < n; ++i) r = mix(r, p[i], 33);
    return r;
}

long drive_byte_copy(long seed) {
    unsigned char src[40], dst[40];
    for (int i = 0; i < 40; ++i) src[i] = static_cast<unsigned char>(seed * 13 + i * 7);
    std::memset(dst, 0, sizeof dst);
    byte_copy(dst, src, 23 + static_cast<size_t>(seed % 5));
    byte_copy(dst + 30, src, 3);
    return checksum(dst, sizeof dst);
}

long drive_byte_fill(long seed) {
    unsigned char buf[40];
    std::memset(buf, 1, sizeof buf);
    byte_fill(buf, static_cast<int>(seed * 3), 19 + static_cast<size_t>(seed % 4));
    byte_fill(buf + 35, 0x7f, 2);
    return checksum(buf, sizeof buf);
}

// A variable-length array: a frame pointer and `sub %reg, %rsp`.
SWEEP_FN long vla_sum(int n) {
    long a[n];
    for (int i = 0; i < n; ++i) a[i] = static_cast<long>(i) * i ^ n;
    long s = 0;
    for (int i = n - 1; i >= 0; i -= 2) s += a[i] * (i + 1);
    return s;
}

long drive_vla_sum(long seed) { return vla_sum(static_cast<int>(seed) + 3) * 1000 + vla_sum(1); }

// alloca, filled through a call and read back.
SWEEP_FN long alloca_str(int n) {
    char *buf = static_cast<char *>(__builtin_alloca(static_cast<size_t>(n) + 1));
    for (int i = 0; i < n; ++i) buf[i] = static_cast<char>('a' + (i * 7 + n) % 26);
    buf[n] = '\0';
    return static_cast<long>(std::strlen(buf)) * 1000 + buf[n / 2];
}

long drive_alloca_str(long seed) { return alloca_str(static_cast<int>(seed) * 4 + 1) * 100 + alloca_str(0); }

// More arguments than registers, of both kinds: integers and doubles on the stack.
SWEEP_FN long many_args(long a, long b, long c, long d, long e, long f, long g, long h, int i, short j, double d0,
                        double d1, double d2, double d3, double d4, double d5, double d6, double d7, double d8,
                        float d9) {
    const double fs = d0 + d1 * 2 + d2 * 3 + d3 * 4 + d4 * 5 + d5 * 6 + d6 * 7 + d7 * 8 + d8 * 9 + d9 * 10;
    return a - b * 2 + c * 3 - d * 4 + e * 5 - f * 6 + g * 7 - h * 8 + i * 9 - j * 10 + static_cast<long>(fs * 8);
}

long drive_many_args(long seed) {
    const double s = static_cast<double>(seed);
    return many_args(seed, 2, 3, seed * 4, 5, 6, -7, 8, static_cast<int>(seed) * 9, static_cast<short>(-10), s, 0.5,
                     1.5, 2.5, s * 0.25, 3.5, 4.5, -5.5, 6.5, 7.25f);
}

// Bit tricks: a popcount loop (GCC may turn it into a popcount call), a bit-reversal
// loop, count-leading/trailing-zero builtins, rotates.
SWEEP_FN long popcount_loop(unsigned long x) {
    long n = 0;
    while (x != 0) {
        x &= x - 1;
        ++n;
    }
    return n;
}

SWEEP_FN unsigned long bit_tricks(unsigned long x) {
    unsigned long r = 0;
    for (int i = 0; i < 16; ++i) {
        r = (r << 1) | (x & 1);
        x >>= 1;
    }
    const int lz = x != 0 ? __builtin_clzl(x) : 64;
    const int tz = r != 0 ? __builtin_ctzl(r) : 64;
    const unsigned long rot = (x << 13) | (x >> 51);
    return r ^ rot ^ (static_cast<unsigned long>(lz) << 40) ^ (static_cast<unsigned long>(tz) << 48);
}

long drive_popcount_loop(long seed) {
    return popcount_loop(static_cast<unsigned long>(seed) * 0x9e3779b97f4a7c15ul) * 100 + popcount_loop(0);
}

long drive_bit_tricks(long seed) {
    return static_cast<long>(bit_tricks(static_cast<unsigned long>(seed) * 0x12345678abcdul) ^ bit_tricks(0));
}

// Virtual calls through a base reference.
struct Shape {
    virtual ~Shape() = default;
    virtual long area(long s) const = 0;
};
struct Square : Shape {
    long area(long s) const override { return s * s; }
};
struct Triangle : Shape {
    long area(long s) const override { return s * s / 2; }
};
struct Circle : Shape {
    long area(long s) const override { return s * s * 314 / 100; }
};

SWEEP_FN long virtual_area(const Shape &shape, long s) { return shape.area(s) + shape.area(s + 1) * 2; }

long drive_virtual_area(long seed) {
    const Square sq;
    const Triangle tr;
    const Circle ci;
    const Shape *shapes[] = {&sq, &tr, &ci};
    long r = 0;
    for (long i = 0; i < 3; ++i) r = mix(r, virtual_area(*shapes[(seed + i) % 3], seed + i), 1000);
    return r;
}

// A callback through std::function.
SWEEP_FN long via_std_function(const std::function<long(long)> &f, long x) { return f(x) * 2 + f(x + 1); }

long drive_via_std_function(long seed) {
    const long k = seed * 3;
    const std::function<long(long)> add = [k](long v) { return v + k; };
    const std::function<long(long)> sq = [](long v) { return v * v; };
    return via_std_function(add, seed) * 1000 + via_std_function(sq, seed + 1);
}

// 64-bit division: signed and unsigned, by variables (idiv/div) and by constants
// (multiply by a magic number).
SWEEP_FN long div64(long a, long b, unsigned long c, unsigned long d) {
    return a / b + a % b * 3 + static_cast<long>(c / d) * 5 + static_cast<long>(c % d) * 7 + a / 7 +
           static_cast<long>(c % 10) + a % 1000;
}

long drive_div64(long seed) {
    return mix(div64(seed * 123456789, seed + 3, static_cast<unsigned long>(seed) * 987654321987ul, 1000003),
               div64(-seed * 99991, -7, ~0ul / (static_cast<unsigned long>(seed) + 1), 17), 3);
}

// A leaf with a local array: at -O2 it lives in the red zone below %rsp.
SWEEP_FN long red_zone_leaf(long x) {
    long buf[12];
    for (int i = 0; i < 12; ++i) buf[i] = (x * (i + 1)) ^ i;
    const unsigned long k = static_cast<unsigned long>(x);
    return buf[k % 12] + buf[(k / 12) % 12] * 3;
}

long drive_red_zone_leaf(long seed) {
    long r = 0;
    for (long i = 0; i < 4; ++i) r = mix(r, red_zone_leaf(seed * 5 + i * 13), 101);
    return r;
}

// Nested loops, compares and conditional moves.
SWEEP_FN void insertion_sort(int *a, int n) {
    for (int i = 1; i < n; ++i) {
        const int v = a[i];
        int j = i - 1;
        while (j >= 0 && a[j] > v) {
            a[j + 1] = a[j];
            --j;
        }
        a[j + 1] = v;
    }
}

long drive_insertion_sort(long seed) {
    int a[9];
    for (int i = 0; i < 9; ++i) a[i] = static_cast<int>((seed * 7919 + i * 104729) % 97) - 40;
    insertion_sort(a, 9);
    long r = 0;
    for (int v : a) r = mix(r, v, 131);
    return r;
}

// setcc, cmov, min/max, three-way comparisons.
SWEEP_FN long minmax(long a, long b, long c) {
    const long lo = a < b ? (a < c ? a : c) : (b < c ? b : c);
    const long hi = a > b ? (a > c ? a : c) : (b > c ? b : c);
    const int cmp = (a > b) - (a < b);
    return hi * 1000 + lo * 10 + cmp + (c == lo);
}

long drive_minmax(long seed) { return minmax(seed, -seed, 3) * 7 + minmax(5, seed * 2, seed) * 3 + minmax(1, 1, 1); }

// A large struct returned by value and zero-initialized locals: rep stos / rep movs at -Os.
struct Big {
    long v[20];
};

SWEEP_FN Big big_struct(long x) {
    Big b{};
    long scratch[24] = {};
    for (int i = 0; i < 20; i += 3) scratch[i] = x + i;
    for (int i = 0; i < 20; ++i) b.v[i] = scratch[i] * 2 + scratch[i + 4];
    return b;
}

long drive_big_struct(long seed) {
    const Big b = big_struct(seed);
    Big c = b; // a struct copy in the driver too
    c.v[3] += 1;
    long r = 0;
    for (long v : c.v) r = mix(r, v, 7);
    return r;
}

// ---- the table ------------------------------------------------------------------------

#define SWEEP_ENTRY(f)                                                                                                 \
    { #f, reinterpret_cast < void *>(&f), &drive_##f }

const ukpt_sweep_fn kTable[] = {
    SWEEP_ENTRY(global_rw),     SWEEP_ENTRY(string_hash),      SWEEP_ENTRY(switch_table),
    SWEEP_ENTRY(fib),           SWEEP_ENTRY(collatz),          SWEEP_ENTRY(add3),
    SWEEP_ENTRY(mul5),          SWEEP_ENTRY(apply_n),          SWEEP_ENTRY(call_hook),
    SWEEP_ENTRY(tail_hook),     SWEEP_ENTRY(tail_dispatch),    SWEEP_ENTRY(fp_mix),
    SWEEP_ENTRY(vec_cross),     SWEEP_ENTRY(pair_divmod),      SWEEP_ENTRY(byte_copy),
    SWEEP_ENTRY(byte_fill),     SWEEP_ENTRY(vla_sum),          SWEEP_ENTRY(alloca_str),
    SWEEP_ENTRY(many_args),     SWEEP_ENTRY(popcount_loop),    SWEEP_ENTRY(bit_tricks),
    SWEEP_ENTRY(virtual_area),  SWEEP_ENTRY(via_std_function), SWEEP_ENTRY(div64),
    SWEEP_ENTRY(red_zone_leaf), SWEEP_ENTRY(insertion_sort),   SWEEP_ENTRY(minmax),
    SWEEP_ENTRY(big_struct),
};

#undef SWEEP_ENTRY

// Every driver in turn: one number for the whole level.
long run_all(long seed) {
    long r = 0;
    for (const ukpt_sweep_fn &e : kTable) r = mix(r, e.drive(seed));
    return r;
}

} // namespace SWEEP_NS

extern "C" const ukpt_sweep_fn *SWEEP_CAT(ukpt_sweep_table_, SWEEP_LEVEL)(size_t *n) {
    *n = sizeof SWEEP_NS::kTable / sizeof SWEEP_NS::kTable[0];
    return SWEEP_NS::kTable;
}

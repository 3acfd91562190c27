// Unwinders other than libgcc's through kretprobed frames: libunwind (nongnu), which
// finds unwind information through its own registry. With probes, each hijacked frame is
// followed by one frame in a return stub (an address outside any loaded object); with
// those left out, the frames are the same as without probes.
#include <ukprobes/kprobes.h>

#include <gtest/gtest.h>

#include <dlfcn.h>
#include <vector>

namespace {

using UnwBacktrace = int (*)(void **, int);
UnwBacktrace g_unw_backtrace;

struct Trace {
    void *frames[64];
    int n = 0;
};

} // namespace

extern "C" __attribute__((noinline, noipa)) void ukw_capture(Trace *t) {
    t->n = g_unw_backtrace(t->frames, 64);
    asm volatile("" ::: "memory");
}

extern "C" __attribute__((noinline, noipa)) int ukw_level(int depth, Trace *t) {
    int r = 0;
    if (depth == 0)
        ukw_capture(t);
    else
        r = ukw_level(depth - 1, t);
    asm volatile("" : "+r"(r));
    return r + 1;
}

namespace {

// One call instruction for both runs, so that every return address can be the same.
__attribute__((noinline, noipa)) void take(Trace *t, kretprobe *rp) {
    if (rp != nullptr) {
        EXPECT_EQ(register_kretprobe(rp), 0);
    }
    int r = ukw_level(3, t);
    asm volatile("" : "+r"(r)); // no tail call: take's frame is in both traces
    if (rp != nullptr) unregister_kretprobe(rp);
}

std::vector<void *> in_objects(const Trace &t) {
    std::vector<void *> out;
    for (int i = 0; i < t.n; ++i) {
        Dl_info info{};
        if (dladdr(t.frames[i], &info) != 0) out.push_back(t.frames[i]);
    }
    return out;
}

TEST(Unwinders, LibunwindWalksThroughHijackedFramesToTheRealCallers) {
    // Global, as for a program linked with -lunwind: the agent finds it by name.
    void *lib = dlopen("libunwind.so.8", RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) GTEST_SKIP() << "libunwind.so.8 is not installed";
    g_unw_backtrace = reinterpret_cast<UnwBacktrace>(dlsym(lib, "unw_backtrace"));
    ASSERT_NE(g_unw_backtrace, nullptr);

    Trace traces[2];
    kretprobe rp{};
    rp.kp.symbol_name = "ukw_level";
    rp.maxactive = 8;
    for (int pass = 0; pass < 2; ++pass) {
        asm volatile("" : "+r"(pass)); // one loop body: no unrolling into two call sites
        take(&traces[pass], pass == 1 ? &rp : nullptr);
    }
    const Trace &plain = traces[0], &probed = traces[1];

    ASSERT_GE(plain.n, 6);
    EXPECT_EQ(probed.n, plain.n + 4) << "one stub frame for each of the 4 hijacked frames";
    const std::vector<void *> want = in_objects(plain), got = in_objects(probed);
    ASSERT_EQ(got.size(), want.size()) << "the walk goes on as deep, to main and libc";
    // ukw_capture and the four ukw_level frames: the same return addresses. (The frames
    // above may come from different call sites of the two runs.)
    for (size_t i = 0; i < 5; ++i) EXPECT_EQ(got[i], want[i]) << "frame " << i;
}

} // namespace

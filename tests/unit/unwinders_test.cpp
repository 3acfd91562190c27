// Unwinders other than libgcc's through kretprobed frames: libunwind (nongnu), which
// finds unwind information through its own registry. Its walk goes through each
// hijacked frame, and through one frame in a return stub (an address outside any loaded
// object) for each, which the agent's unw_backtrace and unw_step leave out: the frames
// are the same as without probes. The program calls them as one linked with -lunwind
// does, by name, so the agent's definitions come first.
#include <ukprobes/kprobes.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <dlfcn.h>
#include <ucontext.h>
#include <vector>

namespace {

// libunwind's local-unwinding API, UNW_LOCAL_ONLY names (libunwind.h is not needed):
// its context is a ucontext_t on x86-64, its cursor 127 words; 16 is UNW_REG_IP.
using UnwGetContext = int (*)(ucontext_t *);
using UnwInitLocal = int (*)(void *, ucontext_t *);
using UnwGetReg = int (*)(void *, int, uint64_t *);
UnwGetContext g_unw_getcontext;
UnwInitLocal g_unw_init_local;
UnwGetReg g_unw_get_reg;
using UnwInitLocal2 = int (*)(void *, ucontext_t *, int);
UnwInitLocal2 g_unw_init_local2; // libunwind 1.3 and later
bool g_use_step;                 // walk with unw_step instead of unw_backtrace

struct Trace {
    void *frames[64];
    int n = 0;
    void *capture_returns_to = nullptr; // ukw_capture's return address: frames[1]
};

} // namespace

extern "C" {
int unw_backtrace(void **buffer, int size);
int _ULx86_64_step(void *cursor);
}

extern "C" __attribute__((noinline, noipa)) void ukw_capture(Trace *t) {
    if (!g_use_step) {
        t->n = unw_backtrace(t->frames, 64);
    } else {
        // As unw_backtrace does: the first frame is the caller of unw_getcontext, here.
        ucontext_t context;
        alignas(16) uint64_t cursor[127];
        t->n = 0;
        if (g_unw_getcontext(&context) == 0 && g_unw_init_local(cursor, &context) == 0) {
            do {
                uint64_t ip = 0;
                if (g_unw_get_reg(cursor, 16, &ip) != 0) break;
                t->frames[t->n++] = reinterpret_cast<void *>(ip);
            } while (t->n < 64 && _ULx86_64_step(cursor) > 0);
        }
    }
    t->capture_returns_to = __builtin_return_address(0);
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

// ukw_stub_step: a hijacked function that steps libunwind once from inside its own
// return stub, after the stub's push, with a context made up for that instant.
void *g_entry_ret_addr; // the real return address, as the kretprobe's entry saw it
void *g_stepped_ip, *g_stepped_sp;
uint64_t g_fake_sp; // the stack pointer of the made-up context

extern "C" __attribute__((noinline, noipa)) int ukw_stub_step() {
    // The stub's entry is the hijacked return address; its push is 6 bytes on.
    const auto entry = reinterpret_cast<uint64_t>(__builtin_return_address(0));
    alignas(16) uint64_t stack[4] = {0, 0, 0, 0}; // the pushed literal at stack[0]
    ucontext_t context;
    if (g_unw_getcontext(&context) != 0) return -1;
    context.uc_mcontext.gregs[REG_RIP] = static_cast<greg_t>(entry + 6);
    context.uc_mcontext.gregs[REG_RSP] = static_cast<greg_t>(reinterpret_cast<uint64_t>(stack));
    g_fake_sp = reinterpret_cast<uint64_t>(stack);
    alignas(16) uint64_t cursor[127];
    uint64_t ip = 0, sp = 0;
    // As for a thread a signal stopped there (UNW_INIT_SIGNAL_FRAME): the row of the pc
    // itself, not of the instruction before it, as for a return address.
    if (g_unw_init_local2 == nullptr || g_unw_init_local2(cursor, &context, 1) != 0 || _ULx86_64_step(cursor) <= 0 ||
        g_unw_get_reg(cursor, 16, &ip) != 0 || g_unw_get_reg(cursor, 7, &sp) != 0) // UNW_REG_IP, RSP
        return -2;
    g_stepped_ip = reinterpret_cast<void *>(ip);
    g_stepped_sp = reinterpret_cast<void *>(sp);
    asm volatile("" ::: "memory");
    return 1;
}

namespace {

int save_entry_ret_addr(kretprobe_instance *ri, pt_regs *) {
    g_entry_ret_addr = ri->ret_addr;
    return 0;
}

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

// Loads libunwind as a program linked with -lunwind has it: global, so that the agent
// finds it by name. False if it is not installed.
bool load_libunwind() {
    void *lib = dlopen("libunwind.so.8", RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) return false;
    g_unw_getcontext = reinterpret_cast<UnwGetContext>(dlsym(lib, "_Ux86_64_getcontext"));
    g_unw_init_local = reinterpret_cast<UnwInitLocal>(dlsym(lib, "_ULx86_64_init_local"));
    g_unw_get_reg = reinterpret_cast<UnwGetReg>(dlsym(lib, "_ULx86_64_get_reg"));
    g_unw_init_local2 = reinterpret_cast<UnwInitLocal2>(dlsym(lib, "_ULx86_64_init_local2"));
    return g_unw_getcontext != nullptr && g_unw_init_local != nullptr && g_unw_get_reg != nullptr;
}

// The same walk without probes and with a kretprobe on each of the 4 ukw_level frames.
void expect_no_stub_frames() {
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
    for (const Trace *t : {&plain, &probed})
        EXPECT_EQ(t->frames[1], t->capture_returns_to) << "the walk starts in ukw_capture";
    EXPECT_EQ(probed.n, plain.n) << "no frame for the stubs of the 4 hijacked frames";
    const std::vector<void *> want = in_objects(plain), got = in_objects(probed);
    EXPECT_EQ(got.size(), static_cast<size_t>(probed.n)) << "every frame is in a loaded object";
    ASSERT_EQ(got.size(), want.size()) << "the walk goes on as deep, to main and libc";
    // ukw_capture and the four ukw_level frames: the same return addresses. (The frames
    // above may come from different call sites of the two runs.)
    for (size_t i = 0; i < 5; ++i) EXPECT_EQ(got[i], want[i]) << "frame " << i;
}

TEST(Unwinders, LibunwindBacktraceShowsTheRealCallersOnly) {
    if (!load_libunwind()) GTEST_SKIP() << "libunwind.so.8 is not installed";
    g_use_step = false;
    expect_no_stub_frames();
}

TEST(Unwinders, LibunwindStepWalksFromHijackedFramesToTheRealCallers) {
    if (!load_libunwind()) GTEST_SKIP() << "libunwind.so.8 is not installed";
    g_use_step = true;
    expect_no_stub_frames();
}

// The sled's unwind information for libunwind at a stub's second instruction, after its
// push: the caller's pc is the instance's real return address, its sp the one before the
// push.
TEST(Unwinders, LibunwindStepsFromAStubAfterItsPush) {
    if (!load_libunwind()) GTEST_SKIP() << "libunwind.so.8 is not installed";
    kretprobe rp{};
    rp.kp.symbol_name = "ukw_stub_step";
    rp.entry_handler = save_entry_ret_addr;
    rp.maxactive = 2;
    ASSERT_EQ(register_kretprobe(&rp), 0);
    g_entry_ret_addr = g_stepped_ip = g_stepped_sp = nullptr;
    const int r = ukw_stub_step();
    unregister_kretprobe(&rp);
    ASSERT_EQ(r, 1) << "libunwind stepped";
    ASSERT_NE(g_entry_ret_addr, nullptr);
    EXPECT_EQ(g_stepped_ip, g_entry_ret_addr) << "the caller's pc: the instance's real return address";
    EXPECT_EQ(reinterpret_cast<uint64_t>(g_stepped_sp), g_fake_sp + 8) << "the caller's sp: above the pushed literal";
}

} // namespace

// Leaving frames without returning, and looking at them: the hooks that keep return
// probes correct and invisible.
//
// - C++ exceptions unwind through a hijacked frame by themselves: the return stubs carry
//   DWARF CFI (kretprobe.cpp). When a handler is entered (__cxa_begin_catch), the frames
//   below the catching frame are gone: their instances are released at once.
// - longjmp/siglongjmp: the frames below the target stack pointer are gone.
// - backtrace()/_Unwind_Backtrace: a hijacked frame shows its real caller, after one
//   extra frame for the stub itself, which these hooks leave out. libunwind's
//   unw_backtrace and unw_step (local unwinding, as a program linked with -lunwind calls
//   them) leave it out the same way.
// - swapcontext/setcontext/sigaltstack: the stacks a thread runs on besides its own, so
//   that frames are compared (deeper, gone) only with frames of the same stack.
#include "platform/raw_syscall.hpp"
#include "core/core.hpp"
#include "core/kretprobe.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <dlfcn.h>
#include <execinfo.h>
#include <setjmp.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>
#include <unwind.h>

namespace ukp::core {

namespace {

template <typename Fn>
Fn lookup(const char *name, const char *library) {
    void *fn = dlsym(RTLD_NEXT, name);
    if (fn == nullptr) {
        // The agent was loaded after the library (a dependency of a preloaded module).
        if (void *h = dlopen(library, RTLD_LAZY | RTLD_NOLOAD); h != nullptr) {
            fn = dlsym(h, name);
            dlclose(h);
        }
    }
    return reinterpret_cast<Fn>(fn);
}

using BeginCatchFn = void *(*)(void *);
using LongjmpFn = void (*)(struct __jmp_buf_tag *, int);
using BacktraceFn = int (*)(void **, int);
using UnwindBacktraceFn = _Unwind_Reason_Code (*)(_Unwind_Trace_Fn, void *);
using SwapcontextFn = int (*)(ucontext_t *, const ucontext_t *);
using SetcontextFn = int (*)(const ucontext_t *);

BeginCatchFn g_begin_catch;
LongjmpFn g_longjmp, g__longjmp, g_siglongjmp, g_longjmp_chk;
BacktraceFn g_backtrace;
UnwindBacktraceFn g_unwind_backtrace;
SwapcontextFn g_swapcontext;
SetcontextFn g_setcontext;

// libunwind's local-unwinding entry points (libunwind.h with UNW_LOCAL_ONLY, and
// unw_backtrace): the cursor is opaque here, 16 is UNW_REG_IP on x86-64.
using UnwBacktraceFn = int (*)(void **, int);
using UnwStepFn = int (*)(void *);
using UnwGetRegFn = int (*)(void *, int, uint64_t *);
constexpr int kUnwRegIp = 16;
std::atomic<UnwBacktraceFn> g_unw_backtrace;
std::atomic<UnwStepFn> g_unw_step;
std::atomic<UnwGetRegFn> g_unw_get_reg;

// libunwind may be loaded after the agent (dlopen): then looked up on first use, which
// is not async-signal-safe; a program linked with it has them resolved before main.
template <typename Fn>
Fn libunwind_fn(std::atomic<Fn> &slot, const char *name) {
    Fn fn = slot.load(std::memory_order_relaxed);
    if (fn == nullptr) {
        fn = lookup<Fn>(name, "libunwind.so.8");
        slot.store(fn, std::memory_order_relaxed);
    }
    return fn;
}

// Resolved before main: longjmp is often called from signal handlers, dlsym is not safe there.
__attribute__((constructor(101))) void resolve_hooks() {
    g_begin_catch = lookup<BeginCatchFn>("__cxa_begin_catch", "libstdc++.so.6");
    g_longjmp = lookup<LongjmpFn>("longjmp", "libc.so.6");
    g__longjmp = lookup<LongjmpFn>("_longjmp", "libc.so.6");
    g_siglongjmp = lookup<LongjmpFn>("siglongjmp", "libc.so.6");
    g_longjmp_chk = lookup<LongjmpFn>("__longjmp_chk", "libc.so.6");
    g_backtrace = lookup<BacktraceFn>("backtrace", "libc.so.6");
    g_unwind_backtrace = lookup<UnwindBacktraceFn>("_Unwind_Backtrace", "libgcc_s.so.1");
    g_swapcontext = lookup<SwapcontextFn>("swapcontext", "libc.so.6");
    g_setcontext = lookup<SetcontextFn>("setcontext", "libc.so.6");
    g_unw_backtrace.store(lookup<UnwBacktraceFn>("unw_backtrace", "libunwind.so.8"), std::memory_order_relaxed);
    g_unw_step.store(lookup<UnwStepFn>("_ULx86_64_step", "libunwind.so.8"), std::memory_order_relaxed);
    g_unw_get_reg.store(lookup<UnwGetRegFn>("_ULx86_64_get_reg", "libunwind.so.8"), std::memory_order_relaxed);
}

// The known stacks. Entries are added, or grown in place, never removed: a stack that is
// freed and its memory reused for something else only makes fewer frames comparable.
// When the table is full, further stacks count as the threads' own (the one-stack rules).
constexpr uint32_t kMaxStacks = 1024;
struct KnownStack {
    std::atomic<uint64_t> lo{0}; // 0 while the entry is being claimed
    std::atomic<uint64_t> hi{0};
};
KnownStack g_stacks[kMaxStacks];
std::atomic<uint32_t> g_stack_count{0};

void note_context_stack(const ucontext_t *ucp) {
    if (ucp != nullptr && ucp->uc_stack.ss_sp != nullptr && ucp->uc_stack.ss_size > 0)
        note_stack(reinterpret_cast<uint64_t>(ucp->uc_stack.ss_sp), ucp->uc_stack.ss_size);
}

// The stack pointer a glibc jmp_buf restores: saved at index 6, mangled with the
// thread's pointer guard (PTR_MANGLE: xor with %fs:0x30, then rotate left by 17).
uint64_t jmp_buf_sp(const struct __jmp_buf_tag *env) {
    const auto mangled = static_cast<uint64_t>(env->__jmpbuf[6]);
    uint64_t guard;
    asm("mov %%fs:0x30, %0" : "=r"(guard));
    const uint64_t rotated = (mangled >> 17) | (mangled << 47);
    return rotated ^ guard;
}

// The hooks keep errno: glibc's functions they stand for never touch it.
void release_frames_keeping_errno(uint64_t sp) {
    const int saved = errno;
    release_frames_below(sp);
    errno = saved;
}

[[noreturn]] void jump(LongjmpFn real, struct __jmp_buf_tag *env, int val) {
    release_frames_keeping_errno(jmp_buf_sp(env));
    real(env, val);
    __builtin_unreachable();
}

struct TraceFilter {
    _Unwind_Trace_Fn fn;
    void *arg;
    bool skipped_wrapper; // the first frame is our _Unwind_Backtrace, not the caller's
};

_Unwind_Reason_Code skip_stubs(struct _Unwind_Context *ctx, void *arg) {
    auto *f = static_cast<TraceFilter *>(arg);
    if (!f->skipped_wrapper) {
        f->skipped_wrapper = true;
        return _URC_NO_REASON;
    }
    if (in_return_stub(_Unwind_GetIP(ctx))) return _URC_NO_REASON;
    return f->fn(ctx, f->arg);
}

} // namespace

void note_stack(uint64_t lo, uint64_t size) {
    const uint64_t hi = lo + size;
    const uint32_t n = std::min(g_stack_count.load(std::memory_order_acquire), kMaxStacks);
    for (uint32_t i = 0; i < n; ++i) {
        if (g_stacks[i].lo.load(std::memory_order_acquire) != lo) continue;
        uint64_t old = g_stacks[i].hi.load(std::memory_order_relaxed);
        while (old < hi && !g_stacks[i].hi.compare_exchange_weak(old, hi)) {
        }
        return;
    }
    const uint32_t i = g_stack_count.fetch_add(1, std::memory_order_acq_rel);
    if (i >= kMaxStacks) return;
    g_stacks[i].hi.store(hi, std::memory_order_relaxed);
    g_stacks[i].lo.store(lo, std::memory_order_release);
}

uint32_t stack_of(uint64_t addr) {
    const uint32_t n = std::min(g_stack_count.load(std::memory_order_acquire), kMaxStacks);
    for (uint32_t i = 0; i < n; ++i) {
        const uint64_t lo = g_stacks[i].lo.load(std::memory_order_acquire);
        if (lo != 0 && addr >= lo && addr < g_stacks[i].hi.load(std::memory_order_relaxed)) return i + 1;
    }
    return 0;
}

} // namespace ukp::core

using namespace ukp::core;

extern "C" {

__attribute__((visibility("default"))) void *__cxa_begin_catch(void *exception) noexcept {
    // Our CFA is the catching frame's stack pointer: every frame below it was unwound.
    release_frames_keeping_errno(reinterpret_cast<uint64_t>(__builtin_dwarf_cfa()));
    return g_begin_catch(exception);
}

__attribute__((visibility("default"), noreturn)) void longjmp(struct __jmp_buf_tag env[1], int val) {
    jump(g_longjmp, env, val);
}
__attribute__((visibility("default"), noreturn)) void _longjmp(struct __jmp_buf_tag env[1], int val) {
    jump(g__longjmp, env, val);
}
__attribute__((visibility("default"), noreturn)) void siglongjmp(struct __jmp_buf_tag env[1], int val) {
    jump(g_siglongjmp, env, val);
}
__attribute__((visibility("default"), noreturn)) void __longjmp_chk(struct __jmp_buf_tag env[1], int val) {
    jump(g_longjmp_chk, env, val);
}

__attribute__((visibility("default"), noinline)) int backtrace(void **buffer, int size) {
    if (size <= 0) return g_backtrace(buffer, size);
    // Room for the stub frames that are left out.
    constexpr int kMax = 1024;
    void *frames[kMax];
    const int n = g_backtrace(frames, size + 65 < kMax ? size + 65 : kMax);
    int out = 0;
    // frames[0] is this wrapper; the program's backtrace starts at its caller.
    for (int i = 1; i < n && out < size; ++i)
        if (!in_return_stub(reinterpret_cast<uint64_t>(frames[i]))) buffer[out++] = frames[i];
    return out;
}

__attribute__((visibility("default"), noinline)) _Unwind_Reason_Code _Unwind_Backtrace(_Unwind_Trace_Fn fn, void *arg) {
    TraceFilter filter{fn, arg, false};
    return g_unwind_backtrace(skip_stubs, &filter);
}

// libunwind reads the stubs' unwind information from its dynamic registry (kretprobe.cpp)
// and so walks through every hijacked frame, with one frame in the stub for each: left out.
__attribute__((visibility("default"), noinline)) int unw_backtrace(void **buffer, int size) {
    UnwBacktraceFn real = libunwind_fn(g_unw_backtrace, "unw_backtrace");
    if (real == nullptr || size <= 0) return 0;
    constexpr int kMax = 1024;
    void *frames[kMax];
    const int n = real(frames, size + 65 < kMax ? size + 65 : kMax);
    int out = 0;
    // frames[0] is this wrapper, as backtrace() above.
    for (int i = 1; i < n && out < size; ++i)
        if (!in_return_stub(reinterpret_cast<uint64_t>(frames[i]))) buffer[out++] = frames[i];
    return out;
}

// unw_step: a step that lands in a stub goes on to the stub's caller, the hijacked
// frame's real caller (the stub's CFI gives its registers).
__attribute__((visibility("default"))) int _ULx86_64_step(void *cursor) {
    UnwStepFn step = libunwind_fn(g_unw_step, "_ULx86_64_step");
    UnwGetRegFn get_reg = libunwind_fn(g_unw_get_reg, "_ULx86_64_get_reg");
    if (step == nullptr || get_reg == nullptr) return -1; // -UNW_EUNSPEC; cannot happen with a cursor
    for (;;) {
        const int r = step(cursor);
        uint64_t ip = 0;
        if (r <= 0 || get_reg(cursor, kUnwRegIp, &ip) != 0 || !in_return_stub(ip)) return r;
    }
}

// A context made with makecontext() runs on the stack it names: learn it before the switch.
// These may run before the agent's constructors (a sanitizer runtime sets up its signal
// stack first): resolve on first use when needed.
__attribute__((visibility("default"))) int swapcontext(ucontext_t *oucp, const ucontext_t *ucp) {
    note_context_stack(ucp);
    if (g_swapcontext == nullptr) {
        const int saved = errno; // a failed dlsym or dlopen on the way may set it
        g_swapcontext = lookup<SwapcontextFn>("swapcontext", "libc.so.6");
        errno = saved;
    }
    return g_swapcontext(oucp, ucp);
}
__attribute__((visibility("default"))) int setcontext(const ucontext_t *ucp) {
    note_context_stack(ucp);
    if (g_setcontext == nullptr) {
        const int saved = errno;
        g_setcontext = lookup<SetcontextFn>("setcontext", "libc.so.6");
        errno = saved;
    }
    return g_setcontext(ucp);
}
// libc's sigaltstack is the bare system call: make it directly, nothing to resolve.
__attribute__((visibility("default"))) int sigaltstack(const stack_t *ss, stack_t *old) {
    if (ss != nullptr && (ss->ss_flags & SS_DISABLE) == 0 && ss->ss_sp != nullptr)
        note_stack(reinterpret_cast<uint64_t>(ss->ss_sp), ss->ss_size);
    const long r = ukp::platform::raw_syscall(SYS_sigaltstack, reinterpret_cast<long>(ss), reinterpret_cast<long>(old));
    if (r == 0) return 0;
    errno = static_cast<int>(-r);
    return -1;
}

} // extern "C"

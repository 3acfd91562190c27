// Jprobes (kprobes.txt, "Jprobe"; removed from the kernel in 4.15, kept here).
//
// The kprobe at the function's entry saves the registers, a copy of the top of the stack
// (return address and stack arguments) and the x87 and SSE part of the vector state, and
// resumes in the jprobe's handler, which sees the function's arguments as the function
// would. The handler ends with jprobe_return(), whose int3 brings us back: registers,
// stack and the x87 and SSE part of the vector state are restored, the rest of the probe
// chain runs, and the function runs with its original arguments.
#include "core/core.hpp"
#include "core/kretprobe.hpp"

#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <new>
#include <set>
#include <vector>

extern "C" {
extern const char ukp_jprobe_return_trap[];
}

namespace ukp::core {

namespace {

// Bytes of the stack saved from sp up: the return address and up to 31 argument words.
constexpr size_t kStackCopy = 256;
// Handlers in flight at once, all threads (a thread runs at most one: hits inside a
// jprobe handler are missed).
constexpr uint32_t kContexts = 256;
constexpr size_t kFxsaveSize = 512;

struct JprobeContext {
    pt_regs regs; // at the hit
    Point *point;
    const kprobe *probe; // the jprobe: the chain resumes after it
    size_t stack_len;
    uint8_t stack[kStackCopy];
    bool have_fp;
    alignas(16) uint8_t fpstate[kFxsaveSize]; // FXSAVE image: x87, SSE registers, MXCSR
    std::atomic<uint32_t> next_free;
};

JprobeContext *g_contexts;
std::atomic<uint64_t> g_free_head{0}; // (tag << 32) | (index + 1)
thread_local JprobeContext *t_jprobe __attribute__((tls_model("initial-exec")));

std::mutex g_mutex;
// Functions with a jprobe: at most one each.
std::set<uint64_t> &addresses() {
    static auto *value = new std::set<uint64_t>(); // never destroyed: probes outlive static destructors
    return *value;
}
std::set<const kprobe *> &jprobes() {
    static auto *value = new std::set<const kprobe *>(); // never destroyed: probes outlive static destructors
    return *value;
}

JprobeContext *pop_context() {
    uint64_t head = g_free_head.load(std::memory_order_acquire);
    for (;;) {
        const auto top = static_cast<uint32_t>(head);
        if (top == 0) return nullptr;
        const uint32_t next = g_contexts[top - 1].next_free.load(std::memory_order_relaxed);
        if (g_free_head.compare_exchange_weak(head, ((head >> 32) + 1) << 32 | next, std::memory_order_acq_rel))
            return &g_contexts[top - 1];
    }
}

void push_context(JprobeContext *c) {
    const auto index = static_cast<uint32_t>(c - g_contexts);
    uint64_t head = g_free_head.load(std::memory_order_relaxed);
    for (;;) {
        c->next_free.store(static_cast<uint32_t>(head), std::memory_order_relaxed);
        if (g_free_head.compare_exchange_weak(head, ((head >> 32) + 1) << 32 | (index + 1), std::memory_order_acq_rel))
            return;
    }
}

int init_contexts() {
    if (g_contexts != nullptr) return 0;
    g_contexts = new (std::nothrow) JprobeContext[kContexts];
    if (g_contexts == nullptr) return -ENOMEM;
    for (uint32_t i = 0; i < kContexts; ++i) g_contexts[i].next_free.store(i + 1 < kContexts ? i + 2 : 0);
    g_free_head.store(1, std::memory_order_release);
    return 0;
}

// The FXSAVE image inside a signal frame's vector state, and whether the frame also has
// an XSAVE header (which says which components sigreturn restores).
uint8_t *frame_fpstate(ucontext_t *uc) { return reinterpret_cast<uint8_t *>(uc->uc_mcontext.fpregs); }

int setjmp_pre_handler(kprobe *p, pt_regs *regs) {
    auto *jp = reinterpret_cast<jprobe *>(p); // kp is the first member
    ThreadState &ts = thread_state();
    if (t_jprobe != nullptr || ts.hit_context == nullptr) {
        count_missed(p);
        return 0;
    }
    JprobeContext *c = pop_context();
    if (c == nullptr) {
        count_missed(p);
        return 0;
    }
    c->regs = *regs;
    c->point = ts.hit_point;
    c->probe = p;
    // As much of the top of the stack as is mapped, up to kStackCopy.
    size_t len = kStackCopy;
    while (len >= 8 && ukp_safe_copy(c->stack, reinterpret_cast<const void *>(regs->sp), len) != 0) len /= 2;
    c->stack_len = len >= 8 ? len : 0;
    const uint8_t *fp = frame_fpstate(ts.hit_context);
    c->have_fp = fp != nullptr && ukp_safe_copy(c->fpstate, fp, kFxsaveSize) == 0;
    t_jprobe = c;
    // The handler runs as part of the probe: probes it hits are missed, as in the kernel.
    ++ts.depth;
    regs->ip = reinterpret_cast<unsigned long>(jp->entry);
    return 1;
}

} // namespace

bool is_jprobe(const kprobe *p) { return p->pre_handler == setjmp_pre_handler; }

bool on_jprobe_return(uint64_t trap_addr, ucontext_t *uc) {
    if (trap_addr != reinterpret_cast<uint64_t>(ukp_jprobe_return_trap)) return false;
    JprobeContext *c = t_jprobe;
    if (c == nullptr) return false; // jprobe_return() outside a handler: the program's SIGTRAP
    t_jprobe = nullptr;
    --thread_state().depth;
    pt_regs regs = c->regs;
    // The handler may have written over its stack arguments: put them back.
    if (c->stack_len != 0) ukp_safe_copy(reinterpret_cast<void *>(regs.sp), c->stack, c->stack_len);
    if (uint8_t *fp = frame_fpstate(uc); fp != nullptr && c->have_fp) {
        ukp_safe_copy(fp, c->fpstate, kFxsaveSize);
        // With an XSAVE frame (FP_XSTATE_MAGIC1 in the software-reserved bytes), sigreturn
        // restores only the components marked in XSTATE_BV: mark x87 and SSE.
        uint32_t magic;
        ukp_safe_copy(&magic, fp + 464, sizeof magic);
        if (magic == 0x46505853u) {
            uint64_t bv;
            ukp_safe_copy(&bv, fp + 512, sizeof bv);
            bv |= 3;
            ukp_safe_copy(fp + 512, &bv, sizeof bv);
        }
    }
    Point *pt = c->point;
    const kprobe *after = c->probe;
    push_context(c);
    resume_hit(pt, uc, regs, after);
    return true;
}

} // namespace ukp::core

using namespace ukp::core;

extern "C" {

int register_jprobe(struct jprobe *jp) {
    if (jp == nullptr || jp->entry == nullptr) return -EINVAL;
    if (is_registered(&jp->kp)) return -EINVAL;
    uint64_t addr = 0;
    bool entry = false;
    if (int err = resolve_probe(&jp->kp, &addr, &entry); err != 0) return err;
    if (!entry) return -EINVAL; // a jprobe goes on the first instruction of a function
    std::lock_guard lock(g_mutex);
    if (int err = init_contexts(); err != 0) return err;
    if (addresses().count(addr) != 0) return -EBUSY;
    jp->kp.pre_handler = setjmp_pre_handler;
    jp->kp.post_handler = nullptr;
    if (int err = register_kprobe(&jp->kp); err != 0) return err;
    addresses().insert(addr);
    jprobes().insert(&jp->kp);
    return 0;
}

void unregister_jprobes(struct jprobe **jps, int num) {
    if (jps == nullptr || num <= 0) return;
    std::vector<kprobe *> kps;
    {
        std::lock_guard lock(g_mutex);
        for (int i = 0; i < num; ++i) {
            if (jps[i] == nullptr) continue;
            kps.push_back(&jps[i]->kp);
            if (jprobes().erase(&jps[i]->kp) != 0) addresses().erase(reinterpret_cast<uint64_t>(jps[i]->kp.addr));
        }
    }
    unregister_kprobes(kps.data(), static_cast<int>(kps.size()));
}

void unregister_jprobe(struct jprobe *jp) { unregister_jprobes(&jp, 1); }

int register_jprobes(struct jprobe **jps, int num) {
    if (jps == nullptr || num <= 0) return -EINVAL;
    for (int i = 0; i < num; ++i) {
        const int err = jps[i] == nullptr ? -EINVAL : register_jprobe(jps[i]);
        if (err != 0) {
            if (i > 0) unregister_jprobes(jps, i);
            return err;
        }
    }
    return 0;
}

} // extern "C"

// <ukprobes/ukprobes.hpp> - the C++ API: RAII probe handles with lambdas as handlers,
// over the same core as the C API in <ukprobes/kprobes.h>.
//
//   auto probe = ukp::Kprobe::at("libc.so.6:malloc", {
//       .pre = [&](pt_regs &regs) { ++calls; return 0; },
//   });
//   if (!probe) fprintf(stderr, "%s\n", strerror(-probe.error()));
//
// The handlers run inside a signal handler of whatever thread hit the probe: they must
// be async-signal-safe and must not throw.
#pragma once

#include <ukprobes/kprobes.h>

#include <cerrno>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace ukp {

struct KprobeHandlers {
    // Before the probed instruction; return non-zero after changing regs.ip to resume there.
    std::function<int(pt_regs &)> pre;
    // After the probed instruction.
    std::function<void(pt_regs &)> post;
    // A handler or the probed instruction faulted; return 1 if handled.
    std::function<int(pt_regs &, int trapnr)> fault;
};

class Kprobe {
public:
    Kprobe() = default;
    Kprobe(Kprobe &&) noexcept = default;
    Kprobe &operator=(Kprobe &&other) noexcept {
        if (this != &other) {
            reset();
            state_ = std::move(other.state_);
            error_ = std::exchange(other.error_, -EINVAL);
        }
        return *this;
    }
    Kprobe(const Kprobe &) = delete;
    Kprobe &operator=(const Kprobe &) = delete;
    ~Kprobe() { reset(); }

    // Registers a probe at "sym", "OBJECT:sym" (plus offset). Check error() or bool.
    static Kprobe at(std::string_view symbol, KprobeHandlers handlers, unsigned offset = 0, bool disabled = false) {
        Kprobe k(std::move(handlers));
        k.state_->symbol.assign(symbol);
        k.state_->kp.symbol_name = k.state_->symbol.c_str();
        k.state_->kp.offset = offset;
        k.finish(disabled);
        return k;
    }
    // A string literal would otherwise convert to `const void *` and be taken for an address.
    static Kprobe at(const char *symbol, KprobeHandlers handlers, unsigned offset = 0, bool disabled = false) {
        return at(std::string_view(symbol), std::move(handlers), offset, disabled);
    }
    // Registers a probe at an address.
    static Kprobe at(const void *addr, KprobeHandlers handlers, bool disabled = false) {
        Kprobe k(std::move(handlers));
        k.state_->kp.addr = static_cast<kprobe_opcode_t *>(const_cast<void *>(addr));
        k.finish(disabled);
        return k;
    }

    // 0 when registered, else the negative errno register_kprobe() returned.
    int error() const { return error_; }
    explicit operator bool() const { return error_ == 0; }

    int enable() { return error_ == 0 ? enable_kprobe(&state_->kp) : -EINVAL; }
    int disable() { return error_ == 0 ? disable_kprobe(&state_->kp) : -EINVAL; }
    unsigned long nmissed() const { return state_ ? __atomic_load_n(&state_->kp.nmissed, __ATOMIC_RELAXED) : 0; }
    void *address() const { return state_ ? state_->kp.addr : nullptr; }
    // The underlying C probe, for the C API (list, batch calls).
    kprobe *raw() { return state_ ? &state_->kp : nullptr; }

    // Unregisters; when it returns no handler of this probe runs any more.
    void reset() {
        if (state_ && error_ == 0) unregister_kprobe(&state_->kp);
        state_.reset();
        error_ = -EINVAL;
    }

private:
    struct State {
        kprobe kp{}; // first member: the trampolines get from kprobe* back to State*
        std::string symbol;
        KprobeHandlers handlers;
    };

    explicit Kprobe(KprobeHandlers handlers) : state_(std::make_unique<State>()) {
        state_->handlers = std::move(handlers);
    }

    static State *state_of(kprobe *p) { return reinterpret_cast<State *>(p); }
    static int pre_trampoline(kprobe *p, pt_regs *regs) { return state_of(p)->handlers.pre(*regs); }
    static void post_trampoline(kprobe *p, pt_regs *regs, unsigned long) { state_of(p)->handlers.post(*regs); }
    static int fault_trampoline(kprobe *p, pt_regs *regs, int trapnr) {
        return state_of(p)->handlers.fault(*regs, trapnr);
    }

    void finish(bool disabled) {
        kprobe &kp = state_->kp;
        if (state_->handlers.pre) kp.pre_handler = pre_trampoline;
        if (state_->handlers.post) kp.post_handler = post_trampoline;
        if (state_->handlers.fault) kp.fault_handler = fault_trampoline;
        if (disabled) kp.flags |= KPROBE_FLAG_DISABLED;
        error_ = register_kprobe(&kp);
    }

    std::unique_ptr<State> state_;
    int error_ = -EINVAL;
};

struct KretprobeHandlers {
    // On entry; non-zero leaves this call unprobed. ri.data holds data_size bytes.
    std::function<int(kretprobe_instance &, pt_regs &)> entry;
    // On return: regs_return_value(&regs) is the return value.
    std::function<void(kretprobe_instance &, pt_regs &)> ret;
};

// A return probe (see <ukprobes/kprobes.h>, struct kretprobe), unregistered by the destructor.
//
//   auto rp = ukp::Kretprobe::at("libc.so.6:open", {
//       .ret = [&](kretprobe_instance &, pt_regs &regs) { last = (int)regs_return_value(&regs); },
//   });
struct KretprobeOptions {
    int maxactive = 0;    // <= 0: max(10, 2 * CPUs)
    size_t data_size = 0; // bytes of kretprobe_instance::data per call
    bool disabled = false;
};

class Kretprobe {
public:
    using Options = KretprobeOptions;

    Kretprobe() = default;
    Kretprobe(Kretprobe &&) noexcept = default;
    Kretprobe &operator=(Kretprobe &&other) noexcept {
        if (this != &other) {
            reset();
            state_ = std::move(other.state_);
            error_ = std::exchange(other.error_, -EINVAL);
        }
        return *this;
    }
    Kretprobe(const Kretprobe &) = delete;
    Kretprobe &operator=(const Kretprobe &) = delete;
    ~Kretprobe() { reset(); }

    // On the function "sym" or "OBJECT:sym". Check error() or bool.
    static Kretprobe at(std::string_view symbol, KretprobeHandlers handlers, Options options = {}) {
        Kretprobe k(std::move(handlers));
        k.state_->symbol.assign(symbol);
        k.state_->rp.kp.symbol_name = k.state_->symbol.c_str();
        k.finish(options);
        return k;
    }
    static Kretprobe at(const char *symbol, KretprobeHandlers handlers, Options options = {}) {
        return at(std::string_view(symbol), std::move(handlers), options);
    }
    // On the function at addr (its first instruction).
    static Kretprobe at(const void *addr, KretprobeHandlers handlers, Options options = {}) {
        Kretprobe k(std::move(handlers));
        k.state_->rp.kp.addr = static_cast<kprobe_opcode_t *>(const_cast<void *>(addr));
        k.finish(options);
        return k;
    }

    int error() const { return error_; }
    explicit operator bool() const { return error_ == 0; }
    int enable() { return error_ == 0 ? enable_kretprobe(&state_->rp) : -EINVAL; }
    int disable() { return error_ == 0 ? disable_kretprobe(&state_->rp) : -EINVAL; }
    int nmissed() const { return state_ ? __atomic_load_n(&state_->rp.nmissed, __ATOMIC_RELAXED) : 0; }
    unsigned long unwound() const { return state_ ? __atomic_load_n(&state_->rp.ukp_unwound, __ATOMIC_RELAXED) : 0; }
    void *address() const { return state_ ? state_->rp.kp.addr : nullptr; }
    kretprobe *raw() { return state_ ? &state_->rp : nullptr; }

    // Unregisters; calls in flight still return to their callers, without the handler.
    void reset() {
        if (state_ && error_ == 0) unregister_kretprobe(&state_->rp);
        state_.reset();
        error_ = -EINVAL;
    }

private:
    struct State {
        kretprobe rp{}; // first member: the trampolines get from kretprobe* back to State*
        std::string symbol;
        KretprobeHandlers handlers;
    };

    explicit Kretprobe(KretprobeHandlers handlers) : state_(std::make_unique<State>()) {
        state_->handlers = std::move(handlers);
    }

    static State *state_of(kretprobe_instance *ri) { return reinterpret_cast<State *>(ri->rp); }
    static int entry_trampoline(kretprobe_instance *ri, pt_regs *regs) {
        return state_of(ri)->handlers.entry(*ri, *regs);
    }
    static int ret_trampoline(kretprobe_instance *ri, pt_regs *regs) {
        state_of(ri)->handlers.ret(*ri, *regs);
        return 0;
    }

    void finish(const Options &options) {
        kretprobe &rp = state_->rp;
        if (state_->handlers.entry) rp.entry_handler = entry_trampoline;
        if (state_->handlers.ret) rp.handler = ret_trampoline;
        rp.maxactive = options.maxactive;
        rp.data_size = options.data_size;
        if (options.disabled) rp.kp.flags |= KPROBE_FLAG_DISABLED;
        error_ = register_kretprobe(&rp);
    }

    std::unique_ptr<State> state_;
    int error_ = -EINVAL;
};

} // namespace ukp

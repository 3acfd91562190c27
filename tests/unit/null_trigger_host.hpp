// A TriggerHost that does nothing (tracing always on, no snapshot, no event to enable, no
// watch to move): for tests of a TriggerSet alone, without the tracer.
#pragma once

#include "trace/trigger.hpp"

#include <cerrno>

namespace ukp::trace::test_hosts {

class NullHost : public TriggerHost {
public:
    void set_tracing_on(bool) override {}
    bool tracing_is_on() const override { return true; }
    void take_snapshot() override {}
    std::atomic<bool> *event_enable_flag(std::string_view, std::string_view) override { return nullptr; }
    TriggerSet *event_triggers(std::string_view, std::string_view) override { return nullptr; }
    void record_stacktrace(const struct pt_regs &) override {}
    WatchMover *watch_mover(std::string_view, bool, int *err) override {
        *err = -ENOENT;
        return nullptr;
    }
};

} // namespace ukp::trace::test_hosts

#include "trace/trigger.hpp"

#include <cerrno>

namespace ukp::trace {

struct Trigger {};
struct TriggerList {};

TriggerSet::TriggerSet() = default;
TriggerSet::~TriggerSet() = default;

int TriggerSet::write(std::string_view, const std::vector<Field> &, TriggerHost &, FilterError *err) {
    // Interim: the trigger parser lands in a following commit.
    if (err) *err = {"Not implemented yet", 0};
    return -EINVAL;
}
std::string TriggerSet::text() const { return {}; }
std::string TriggerSet::hist_text() const { return {}; }
void TriggerSet::fire(const uint8_t *, uint32_t, const char *, const struct pt_regs &) noexcept {}
bool TriggerSet::empty() const noexcept { return cur_.load(std::memory_order_acquire) == nullptr; }
void TriggerSet::set_symbolizer(Symbolizer sym) { sym_ = std::move(sym); }

} // namespace ukp::trace

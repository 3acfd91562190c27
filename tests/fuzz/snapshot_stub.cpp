// The trigger fuzzer builds the hist and trigger code without the trace ring (ring.cpp and
// the agent under it). A hist trigger's snapshot() action asks the ring for its spare
// buffer when it is written: here there is none, and the trigger is refused as it would be
// when the spare cannot be allocated. Nor are there synthetic events (the tracer's), so no
// action can fire one. Nor the core: the mark of the agent's own work (core::agent_call),
// which only a probe hit reads, marks nothing.
#include "core/agent.hpp"
#include "trace/hist.hpp"
#include "trace/ring.hpp"

#include <cerrno>

namespace ukp::trace {

int snapshot_alloc() { return -ENOMEM; }
bool snapshot_swap() { return false; }
void SynthSink::fire(const uint64_t *, size_t, const struct pt_regs *) noexcept {}

} // namespace ukp::trace

namespace ukp::core {

AgentWork::AgentWork() = default;
AgentWork::~AgentWork() = default;

} // namespace ukp::core

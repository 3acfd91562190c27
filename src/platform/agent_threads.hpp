// The agent's own threads (its control thread, the optimizer, a planner's helper), told
// apart from the program's from their first instruction.
//
// A thread runs libc's code before its function and after it: start_thread, __ctype_init,
// the setjmp of its cancellation buffer; the TLS destructors and the stack's release at
// its end. An event over those functions would show a thread the program never made, in
// the program's name, unless a probe hit can tell the thread is the agent's before the
// function marks its work (AgentWork). It can by where the thread's TLS lies: glibc puts
// a thread's control block and static TLS at the top of the stack it is given, so the
// agent gives its threads stacks of its own mapping and notes their ranges, and a hit
// asks whether the address of its thread's state is in one of them.
#pragma once

#include <cstdint>
#include <pthread.h>

namespace ukp::platform {

// Starts fn(arg) on a thread whose stack the agent mapped and noted. 0 or -errno.
int start_agent_thread(pthread_t *thread, void *(*fn)(void *), void *arg);

// After pthread_join() of a thread start_agent_thread() started: its stack is kept for
// the next one (never unmapped: what points into an ended thread's TLS finds memory).
void release_agent_thread(pthread_t thread);

// Whether addr lies in a stack start_agent_thread() mapped (running a thread or kept).
// Lock-free, async-signal-safe, no system call.
bool in_agent_thread(uint64_t addr) noexcept;

// In the child of fork(): the stacks of the threads that did not come along are kept for
// the child's own (the calling thread's stays in use, if it is one).
void agent_threads_after_fork_child();

} // namespace ukp::platform

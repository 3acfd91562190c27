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

// A stack for a thread that code outside the agent starts to run the agent's work:
// `ukprobe attach`'s loader thread, when the agent is already loaded (its events live), is
// given one, so that its whole life (libc's start of a thread, its dlopen, its exit) is
// the agent's. 0 or -errno, with the stack in [*lo, *lo + *size). The injector calls it on
// a thread stopped anywhere in the program's code, perhaps before the agent's relocations
// are done: it calls nothing through the PLT (raw system calls) and takes no lock.
int take_loader_stack(uint64_t *lo, uint64_t *size) noexcept;

// On a thread running on a stack from take_loader_stack(): the stack is taken again for
// another thread once the kernel has cleared this thread's clear_child_tid word (it has
// ended: glibc's own stack cache waits for the same). Nothing on other threads.
void note_loader_thread() noexcept;

// In the child of fork(): the stacks of the threads that did not come along are kept for
// the child's own (the calling thread's stays in use, if it is one).
void agent_threads_after_fork_child();

} // namespace ukp::platform

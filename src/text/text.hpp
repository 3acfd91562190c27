// Code memory near a point, and writing into live code.
//
// Writes go through /proc/self/mem (opened for each write, or each batch of writes, on
// the program's threads; held by the agent's threads that have a table of their own): no
// page of code is ever writable and executable, and no mprotect() touches pages other
// threads run in. After each step of a patch
// every core is serialized with membarrier(PRIVATE_EXPEDITED_SYNC_CORE), as the
// kernel's text_poke_bp() does with its IPIs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ukp::text {

// Checks that /proc/self/mem opens and registers for membarrier. Idempotent; 0 or -errno.
int init();

// Registers for membarrier's SYNC_CORE command only (init() does it too). The kernel
// registers a process of one thread at once, and one of several only after an RCU grace
// period (milliseconds): the agent does it at load, before it starts a thread.
void register_membarrier();

// Writes n bytes at addr in this process, whatever the page protection. 0 or -errno.
int write(uint64_t addr, const void *data, size_t n);

// Bytes for write_many().
struct Piece {
    uint64_t addr;
    const void *data;
    size_t n;
};
// Writes each piece as write() does, under one lock and through one /proc/self/mem, with
// no call into the C library between them (while int3s stand in every function of libc,
// each such call would trap). ok[i] says whether piece i was written. 0 when all were,
// else the first -errno met.
int write_many(const Piece *pieces, size_t n, bool *ok);

// A scope of many writes by the calling thread (an event over many functions): on one of
// the program's threads, the writes share one /proc/self/mem, kept at a high number and
// checked to be still that file before each write, and closed at the scope's end,
// instead of opening one per write (thousands of openings in an event over a library).
// Nested scopes end with the outermost. Nothing changes on a thread with a table of its own.
void begin_write_batch();
void end_write_batch();

// Gives the calling thread a descriptor table of its own, empty but for 0-2 (which lead
// nowhere) and a /proc/self/mem that write() uses on this thread from then on. For the agent's
// worker threads: a file they open never takes a number the program counts on (open()
// returns the lowest free one: `close(0); open("/dev/null")` expects 0), and they hold
// none of the program's files (a pipe's reader waits for its end of file until every
// copy of the writing end is closed). 0 or -errno: the table could not be unshared (the
// thread goes on with the process's) or write() will fail here. The thread must not keep
// a descriptor for others to use, nor close one of theirs.
int use_own_fd_table();

// Serializes the instruction stream of every thread of the process.
void sync_cores();
// How many times sync_cores() has run (for tests).
uint64_t sync_count();

// Replaces the first byte of the instruction at addr with int3 (or puts `orig` back),
// serializing all cores afterwards. 0 or -errno.
int poke_byte(uint64_t addr, uint8_t byte);

// Slots: kSlotSize bytes of executable memory each, kSlotSize-aligned, placed within
// +-2 GiB of the address they are asked for when the address space allows it.
// A slot is never freed or reused: its owner keeps it for the life of the process (a
// thread may still be executing in it long after its probe went away).
inline constexpr size_t kSlotSize = 256;

// A new slot near `near`; 0 if no memory could be mapped at all.
uint64_t alloc_slot(uint64_t near);

// The slot containing addr if addr lies in one of ours, else 0. Async-signal-safe.
uint64_t slot_containing(uint64_t addr);

// Executable memory at any address, for code reached by absolute jumps (return stubs).
// Written with write(); 0 on failure.
uint64_t alloc_code(size_t size);
void free_code(uint64_t addr, size_t size);

// Whether [addr, addr + n) lies in memory ukprobes mapped for code. Async-signal-safe.
bool is_agent_code(uint64_t addr);

} // namespace ukp::text

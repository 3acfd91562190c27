// A stream's reads of a ring into the merged output (output.hpp): the streams of
// `ukprobe run` (agent_stream.hpp, forked_ring.hpp) and a forked child's ring emptied once.
#pragma once

#include "output.hpp"
#include "reader.hpp"

namespace ukprobe {

// How long a trace_pipe read waits for a record: also how long a stream takes to see a
// drain asked (a process waiting in exit_group) or its process gone.
inline constexpr int kPipeWaitMs = 5;

// What read() returns of `reader`, added to `out`; the read fills a buffer the output
// wrote out (TraceReader::give_buffer).
template <typename Read>
void read_into(TraceReader &reader, Output &out, Read read) {
    reader.give_buffer(out.spare());
    out.add(read());
}

// Empties a ring whose process is held or gone: reads until it counts no entry left,
// what the process's other threads still write meanwhile included. `wait_ms`: how long
// each read waits for a record.
inline void drain_ring(TraceReader &reader, Output &out, int wait_ms) {
    reader.recheck_buffers();
    for (int i = 0; i < 1000 && reader.has_records(); ++i)
        read_into(reader, out, [&] { return reader.pipe(wait_ms, 1 << 20); });
}

} // namespace ukprobe

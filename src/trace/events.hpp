// Trace events: the registry of kprobe events defined through the kprobe_events
// language, their probes on the program (through the public kprobes.h API), the hit that
// fills a record, and the text of every tracefs file the tracer has.
//
// Definitions, enabling and file reads take a mutex; a hit takes none (it reaches its
// event through its kprobe, and reads only what was prepared at definition time).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "trace/errors.hpp"
#include "trace/fetch.hpp"
#include "trace/parse.hpp"
#include "trace/record.hpp"

namespace ukp::trace {

// The file API: `path` is relative to the tracefs root ("kprobe_events",
// "events/kprobes/myprobe/enable"). 0 or a negative errno.
int file_read(std::string_view path, std::string *out);
// Truncating write (`echo X > file`).
int file_write(std::string_view path, std::string_view text);
// Appending write (`echo X >> file`).
int file_append(std::string_view path, std::string_view text);

// trace_pipe with the caller's wait: up to timeout_ms for the first record, at most
// max_bytes of text (whole lines). The file API's read of trace_pipe waits 1 s.
std::string pipe_read(int timeout_ms, size_t max_bytes);

// Applies definitions in the process-start form: semicolon-separated definitions,
// comma-separated words; each event is enabled. 0, or the first error (the rest is
// still applied, as the kernel does with its boot parameter).
int apply_startup_events(std::string_view spec);
// UKP_EVENTS and UKP_NO_INHERIT, once, from whichever of the agent's constructors comes
// first: the control thread's (control.cpp) applies them before it starts, so that it
// finds the buffers made and takes their memfds into its own table. False when the
// process was started under a `ukprobe run` that is gone (UKP_SUPERVISED): then nothing
// is applied, the agent's variables leave the environment, and no control thread is
// to start.
bool apply_environment();

// Prints one record's event part ("myprobe: (f+0x0/0x2a) a=0x1"), for trace and
// trace_pipe.
void print_event(const uint8_t *rec, uint32_t size, std::string &out);

// kprobes/list: the core's rows, but one row for each event over many functions (an f: on
// a glob or a list): "ADDRESS  f  FUNCS[%return]  GRP/EVENT N functions, M [OPTIMIZED]
// [, K passed over][ [DISABLED]]", ADDRESS its first function's.
std::string kprobes_list_text();

// For tests: the fields of an event (as its format file lists them), or empty.
std::vector<Field> event_fields(std::string_view group, std::string_view event);

// "sym+0xoff/0xsize" for an address of the process, "0x..." when no symbol holds it.
std::string symbolize(uint64_t addr, bool with_size);

// Whether the handlers that record an event's hits (entry, kretprobe entry, return) are
// lean (arch/x86_64/vector_use.hpp): on a lean path (ukp_lean_dispatch) an event's hit
// then saves none of the vector state. Scans their code; under the registry mutex, as
// every handler's scan.
bool hit_handlers_lean();

} // namespace ukp::trace

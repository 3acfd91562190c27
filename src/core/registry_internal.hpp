// What the files of the registry share: registry.cpp (registration, points, arming),
// blacklist.cpp, loader.cpp (objects that come and go) and fork.cpp.
#pragma once

#include "core/core.hpp"
#include "symbols/symbols.hpp"

#include <atomic>
#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

namespace ukp::core {

// ---- registry.cpp: the state, under the registry mutex --------------------------------
// Every point prepared, by address.
std::map<uint64_t, Point *> &points();
// Points of unloaded objects, kept for late hits.
std::vector<Point *> &retired_points();
// Registered probes and their points; null for a probe whose object is not loaded.
std::unordered_map<const kprobe *, Point *> &registered();
// Lists retired where no grace period can be waited for (inside a hit): freed after the
// next one.
std::vector<ProbeList *> &deferred_lists();
// The process's objects and symbols; created on first use.
extern sym::Registry *g_symbols;
// Puts p on the point at addr (prepared if new) and arms it. 0 or -errno.
int attach_to_point(kprobe *p, uint64_t addr);
// The other symbols inside fn (asm labels, aliases): entries of it too.
std::vector<uint64_t> symbols_inside(const sym::Object &obj, const sym::Symbol &fn);
// Whether addr is a function's entry.
bool function_entry_locked(uint64_t addr);
// Whether a return probe may go at addr: a function's entry, and not one that returns
// twice (setjmp's family, getcontext, vfork).
bool return_probe_allowed_locked(uint64_t addr);
// Whether symbol is one of the agent's own definitions (not a probe target by name).
bool agent_definition(const sym::Object &obj, const sym::Symbol &symbol);

// ---- blacklist.cpp ------------------------------------------------------------------------
// Whether addr, in fn of obj, is a place no probe may go.
bool is_blacklisted(const sym::Object &obj, const sym::Symbol *fn, uint64_t addr);
// The whole of libukprobes.so is the agent's; a program it is linked into is not.
bool is_agent_object(const sym::Object &obj);
// Whether name is one of the agent's own entry points in obj.
bool agent_symbol(const sym::Object &obj, const std::string &name);

// ---- loader.cpp ---------------------------------------------------------------------------
// The agent's probe on the dynamic linker's r_brk.
extern kprobe g_link_map_probe;
// Set while a thread runs the link-map work on the loader stack.
extern std::atomic<bool> g_loader_stack_busy;
// Puts the agent's probe on the loader's r_brk, once.
void hook_link_map_locked();
// Brings the symbols and the points in step with the objects loaded now.
void sync_objects_locked();

} // namespace ukp::core

// The jump optimizer's verdicts, decided ahead of the registrations and kept.
//
// Whether a jmp may replace the region at a point takes a decode of its whole function and
// a look at everything its object references (arch/x86_64/region.hpp): for an event over
// each of libc's 3,700 functions, most of its definition. plan_jumps() decides the
// verdicts of many points at once before they are registered: the object's reference
// table built on a second core while the calling thread decodes the functions (and the
// second joins in when its table is done). The verdicts are kept by object in memory and,
// where the agent has a cache directory (platform/disk_cache.hpp), on disk: the next
// process that puts the same event on the same file reads them instead. A verdict holds
// only for the bytes it was decided from: the checksum of the function's original code
// goes with it, and opt_prepare decides anew on other bytes. A region that would need an
// island is left to opt_prepare, which plans it under the registry mutex.
#include "core/core.hpp"
#include "core/registry_internal.hpp"

#include "platform/agent_threads.hpp"
#include "platform/async_blocked.hpp"
#include "platform/disk_cache.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <link.h>
#include <map>
#include <mutex>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string>
#include <unordered_map>
#include <vector>

namespace ukp::core {
namespace {

constexpr char kMagic[8] = {'U', 'K', 'P', 'P', 'L', 'A', 'N', '1'};

struct Header {
    platform::CacheStamp stamp;
    uint64_t n_path, n_plans;
    uint64_t checksum; // of everything after the header
};

// The verdicts of one object, by the point's offset from the object's bias.
struct ObjectPlans {
    bool looked = false; // the disk's entry read (or found missing)
    std::unordered_map<uint64_t, RegionPlan> by_offset;
};

std::atomic<uint64_t> g_loaded{0}, g_decided{0};

// By load bias.
std::map<uint64_t, ObjectPlans> &all_plans() {
    static auto *value = new std::map<uint64_t, ObjectPlans>(); // never destroyed, as the points
    return *value;
}

bool safe_read(uint64_t addr, void *out, size_t n) {
    return ukp_safe_copy(out, reinterpret_cast<const void *>(addr), n) == 0;
}

struct EhLookup {
    uint64_t bias;
    uint64_t hdr;
    const char *path;
};

int find_eh_frame_hdr(dl_phdr_info *info, size_t, void *data) {
    auto *l = static_cast<EhLookup *>(data);
    if (info->dlpi_addr != l->bias) return 0;
    l->path = info->dlpi_name;
    for (int i = 0; i < info->dlpi_phnum; ++i)
        if (info->dlpi_phdr[i].p_type == PT_GNU_EH_FRAME) l->hdr = info->dlpi_addr + info->dlpi_phdr[i].p_vaddr;
    return l->hdr != 0;
}

std::string file_of(const char *path) { return *path != '\0' ? path : "/proc/self/exe"; }

// The object's entry from the disk into `into`, if there is one for this file and agent.
void load_plans(const std::string &path, std::vector<RegionPlan> *into) {
    const std::string dir = platform::cache_dir();
    platform::FileKey file{};
    if (dir.empty() || platform::agent_id() == 0 || !platform::file_key(path, &file)) return;
    const std::string bytes =
        platform::read_cache_entry(platform::cache_entry_path(dir, "plans", path, file), sizeof(Header));
    if (bytes.size() < sizeof(Header)) return;
    Header h;
    memcpy(&h, bytes.data(), sizeof h);
    if (!(h.stamp == platform::CacheStamp::of(kMagic, file)) ||
        h.checksum != platform::cache_checksum(bytes.data() + sizeof h, bytes.size() - sizeof h))
        return;
    size_t at = sizeof h;
    std::vector<char> stored_path;
    if (!platform::cache_take(bytes, &at, h.n_path, &stored_path) ||
        std::string(stored_path.begin(), stored_path.end()) != path ||
        !platform::cache_take(bytes, &at, h.n_plans, into) || at != bytes.size())
        into->clear();
}

void store_plans(const std::string &path, const std::vector<RegionPlan> &plans) {
    const std::string dir = platform::cache_dir();
    platform::FileKey file{};
    if (dir.empty() || platform::agent_id() == 0 || !platform::file_key(path, &file)) return;
    std::string body;
    try {
        platform::cache_append(&body, path.data(), path.size());
        platform::cache_append(&body, plans.data(), plans.size());
    } catch (...) {
        return; // out of memory: no entry
    }
    Header h{};
    h.stamp = platform::CacheStamp::of(kMagic, file);
    h.n_path = path.size();
    h.n_plans = plans.size();
    h.checksum = platform::cache_checksum(body.data(), body.size());
    platform::write_cache_entry(dir, platform::cache_entry_path(dir, "plans", path, file), "plans-", &h, sizeof h,
                                body);
}

// A point to decide, with what its verdict is decided from.
struct Item {
    uint64_t addr = 0, fn_start = 0, fn_size = 0, bias = 0, code_sum = 0;
    std::vector<uint8_t> code;
    std::vector<uint64_t> inner; // the other symbols inside the function
    JumpFacts facts;             // decoded, while the check waits for the references
    bool decoded = false;
    bool planned = false;
    RegionPlan plan;
};

// Cores this thread may run on.
int usable_cores() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
    return CPU_COUNT(&set);
}

// Runs other() on a thread of the agent's beside mine() on this one, and waits for both;
// other() then mine() on this thread when there is one core, or no thread to be had (mine
// may wait for what other does first). The thread starts with the program's asynchronous
// signals blocked (platform/async_blocked.hpp).
template <class Other, class Mine>
void run_beside(Other &&other, Mine &&mine) {
    const auto body = [&] {
        const AgentWork quiet; // its calls are not the program's
        try {
            other();
        } catch (...) {
            // Out of memory: what it did not decide is decided at the registration.
        }
    };
    using Body = decltype(body);
    pthread_t thread;
    bool started = false;
    if (usable_cores() > 1) {
        const platform::AsyncSignalsBlocked blocked;
        started = platform::start_agent_thread(
                      &thread,
                      [](void *b) -> void * {
                          (*static_cast<const Body *>(b))();
                          return nullptr;
                      },
                      const_cast<void *>(static_cast<const void *>(&body))) == 0;
    }
    if (!started) body();
    const auto join = [&] {
        if (!started) return;
        pthread_join(thread, nullptr);
        platform::release_agent_thread(thread);
    };
    try {
        mine();
    } catch (...) {
        join(); // the thread uses this frame
        throw;
    }
    join();
}

// Decoded functions kept while the references are built, at most (their bytes): past it,
// the decoding thread waits for them.
constexpr size_t kKeptBytes = 64u << 20;

// Decides the verdicts of items (their code read), two threads at once.
void decide(std::vector<Item> &items) {
    std::map<uint64_t, std::shared_ptr<const arch::ObjectRefs>> refs; // by bias
    std::map<uint64_t, uint64_t> eh;                                  // PT_GNU_EH_FRAME by bias
    for (const Item &it : items) {
        if (eh.count(it.bias) != 0) continue;
        const char *path = nullptr;
        eh[it.bias] = eh_frame_hdr_of(it.bias, &path);
        refs[it.bias] = nullptr;
    }
    std::atomic<bool> refs_ready{false};
    std::atomic<size_t> next{0};
    const auto check = [&](Item &it) {
        const arch::ObjectRefs *r = refs.at(it.bias).get();
        const arch::OptimizeCheck c = arch::check_region(it.facts.f, it.addr, it.facts.entries, 5, r);
        it.plan = plan_of(c, it.facts.f.start_jumped, it.bias, it.fn_start, it.fn_size, it.addr, it.code_sum);
        // An island may let a jump in: planned at the registration, under the mutex.
        if (!c.ok && r != nullptr && !c.entered_by.empty()) it.plan.jump = RegionPlan::kAtRegistration;
        it.planned = true;
    };
    const auto decode = [&](size_t *kept) {
        for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < items.size();) {
            Item &it = items[i];
            it.facts = jump_facts(it.fn_start, it.fn_size, it.code, eh.at(it.bias), it.inner);
            if (!it.facts.pads_known) {
                arch::OptimizeCheck no;
                it.plan = plan_of(no, false, it.bias, it.fn_start, it.fn_size, it.addr, it.code_sum);
                it.planned = true;
                it.facts = JumpFacts{};
                continue;
            }
            if (!refs_ready.load(std::memory_order_acquire)) {
                it.decoded = true; // checked once the references are there
                *kept += it.code.size() * 3;
                if (*kept > kKeptBytes) refs_ready.wait(false, std::memory_order_acquire);
                continue;
            }
            check(it);
            it.facts = JumpFacts{};
        }
    };
    size_t kept_there = 0, kept_here = 0;
    run_beside(
        [&] {
            try {
                for (auto &[bias, r] : refs) {
                    for (const Item &it : items) {
                        if (it.bias != bias) continue;
                        r = opt_object_refs(it.addr);
                        break;
                    }
                }
            } catch (...) {
                // Out of memory: the checks go without the references they lack.
            }
            refs_ready.store(true, std::memory_order_release); // in any case: the caller may wait for it
            refs_ready.notify_all();
            decode(&kept_there);
        },
        [&] { decode(&kept_here); });
    for (Item &it : items) {
        if (!it.decoded) continue;
        check(it);
        it.facts = JumpFacts{};
    }
}

} // namespace

std::mutex &plans_mutex() {
    static auto *value = new std::mutex(); // never destroyed: probes outlive static destructors
    return *value;
}

bool read_function_code(uint64_t fn_start, uint64_t fn_size, std::vector<uint8_t> *code) {
    if (fn_size > kMaxPlannedFunction) return false;
    code->resize(fn_size + arch::kMaxTail);
    if (read_original_code(fn_start, code->data(), code->size()) == 0) return true;
    code->resize(fn_size);
    return read_original_code(fn_start, code->data(), code->size()) == 0;
}

JumpFacts jump_facts(uint64_t fn_start, uint64_t fn_size, const std::vector<uint8_t> &code, uint64_t eh_frame_hdr,
                     const std::vector<uint64_t> &other_symbols) {
    JumpFacts facts;
    facts.f = arch::analyze_function(fn_start, code.data(), fn_size, safe_read);
    facts.entries = other_symbols;
    // Landing pads unknown: a jump into the region cannot be ruled out.
    facts.pads_known = arch::landing_pads(eh_frame_hdr, fn_start, fn_start + fn_size, safe_read, &facts.entries) == 0;
    return facts;
}

uint64_t eh_frame_hdr_of(uint64_t bias, const char **path) {
    EhLookup eh{bias, 0, nullptr};
    dl_iterate_phdr(find_eh_frame_hdr, &eh);
    *path = eh.path;
    return eh.hdr;
}

RegionPlan plan_of(const arch::OptimizeCheck &c, bool start_jumped, uint64_t bias, uint64_t fn_start, uint64_t fn_size,
                   uint64_t addr, uint64_t code_sum) {
    RegionPlan p;
    p.fn_offset = fn_start - bias;
    p.fn_size = fn_size;
    p.offset = addr - bias;
    p.code_sum = code_sum;
    p.start_jumped = start_jumped ? 1 : 0;
    if (!c.ok || c.insns.size() > arch::kMaxDcrInsns || c.dcr_len > sizeof(Point::dcr_orig)) return p;
    p.jump = RegionPlan::kJump;
    p.n_insns = static_cast<uint8_t>(c.insns.size());
    for (size_t i = 0; i < c.insns.size(); ++i) p.insn_offset[i] = static_cast<uint8_t>(c.insns[i] - addr);
    return p;
}

bool find_plan(uint64_t bias, uint64_t addr, uint64_t fn_start, uint64_t fn_size, uint64_t code_sum, RegionPlan *out) {
    std::lock_guard lock(plans_mutex());
    const auto obj = all_plans().find(bias);
    if (obj == all_plans().end()) return false;
    const auto it = obj->second.by_offset.find(addr - bias);
    if (it == obj->second.by_offset.end()) return false;
    const RegionPlan &p = it->second;
    if (p.fn_offset != fn_start - bias || p.fn_size != fn_size || p.code_sum != code_sum) return false;
    *out = p;
    return true;
}

void keep_plan(uint64_t bias, const RegionPlan &plan) {
    std::lock_guard lock(plans_mutex());
    try {
        all_plans()[bias].by_offset[plan.offset] = plan;
    } catch (...) {
        // Out of memory: decided again next time.
    }
}

void forget_plans(uint64_t bias) {
    std::lock_guard lock(plans_mutex());
    all_plans().erase(bias);
}

PlanStats plan_stats() { return {g_loaded.load(), g_decided.load()}; }

void plan_jumps(const std::vector<uint64_t> &addrs) {
    UKP_ASSERT_REGISTRY_NOT_HELD();
    if (!g_opt_enabled.load(std::memory_order_relaxed) || addrs.size() < 2 || prepare_agent() != 0) return;
    try {
        std::vector<Item> items;
        std::map<uint64_t, std::string> files; // by bias: the objects met
        {
            std::lock_guard lock(registry_mutex());
            for (uint64_t addr : addrs) {
                if (points().count(addr) != 0) continue; // prepared before
                const sym::Object *obj = g_symbols->object_at(addr);
                const sym::Symbol *fn = obj != nullptr ? obj->function_at(addr) : nullptr;
                if (fn == nullptr || fn->size == 0 || is_blacklisted(*obj, fn, addr)) continue;
                Item it;
                it.addr = addr;
                it.fn_start = fn->value;
                it.fn_size = fn->size;
                it.bias = obj->bias;
                if (!read_function_code(fn->value, fn->size, &it.code)) continue;
                it.inner = symbols_inside(*obj, *fn);
                files.emplace(obj->bias, "");
                items.push_back(std::move(it));
            }
        }
        // The disk's verdicts for the objects not looked at yet.
        for (auto &[bias, path] : files) {
            const char *name = nullptr;
            eh_frame_hdr_of(bias, &name);
            if (name == nullptr) continue;
            path = file_of(name);
            {
                std::lock_guard lock(plans_mutex());
                ObjectPlans &o = all_plans()[bias];
                if (o.looked) continue;
                o.looked = true;
            }
            std::vector<RegionPlan> stored;
            load_plans(path, &stored);
            if (!stored.empty()) g_loaded.fetch_add(1, std::memory_order_relaxed);
            std::lock_guard lock(plans_mutex());
            ObjectPlans &o = all_plans()[bias];
            for (const RegionPlan &p : stored) o.by_offset.emplace(p.offset, p);
        }
        std::vector<Item> todo;
        for (Item &it : items) {
            it.code_sum = platform::cache_checksum(it.code.data(), it.code.size());
            RegionPlan known;
            if (!find_plan(it.bias, it.addr, it.fn_start, it.fn_size, it.code_sum, &known))
                todo.push_back(std::move(it));
        }
        if (todo.empty()) return;
        decide(todo);
        for (const Item &it : todo) {
            if (!it.planned) continue;
            keep_plan(it.bias, it.plan);
            g_decided.fetch_add(1, std::memory_order_relaxed);
        }
        // Each object's verdicts, all of them, to the disk.
        for (const auto &[bias, path] : files) {
            if (path.empty()) continue;
            std::vector<RegionPlan> plans;
            {
                std::lock_guard lock(plans_mutex());
                for (const auto &[offset, p] : all_plans()[bias].by_offset) plans.push_back(p);
            }
            store_plans(path, plans);
        }
    } catch (...) {
        // Out of memory: each point is decided at its registration.
    }
}

} // namespace ukp::core

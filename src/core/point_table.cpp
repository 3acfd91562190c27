// The points by address, for the breakpoint path: a hash table read without a lock by the
// signal handlers, replaced whole by a bigger one when it fills.
#include "core/core.hpp"

#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace ukp::core {

namespace {

struct TableEntry {
    std::atomic<uint64_t> key; // 0 = empty; written last when inserting
    std::atomic<Point *> value;
};

struct Table {
    size_t mask;
    size_t used;
    TableEntry entries[1];
};

std::atomic<Table *> g_table{nullptr};
// Tables replaced by bigger ones: kept, since a hit may still be walking one; their sizes
// add up to less than the current table's.
std::vector<Table *> &outgrown_tables() {
    static auto *value = new std::vector<Table *>(); // never destroyed: probes outlive static destructors
    return *value;
}

size_t hash_addr(uint64_t a) { return static_cast<size_t>((a * 0x9e3779b97f4a7c15ull) >> 17); }

Table *new_table(size_t capacity) {
    const size_t bytes = sizeof(Table) + (capacity - 1) * sizeof(TableEntry);
    auto *t = static_cast<Table *>(::operator new(bytes));
    t->mask = capacity - 1;
    t->used = 0;
    for (size_t i = 0; i < capacity; ++i) {
        new (&t->entries[i].key) std::atomic<uint64_t>(0);
        new (&t->entries[i].value) std::atomic<Point *>(nullptr);
    }
    return t;
}

void put(Table *t, uint64_t key, Point *value) {
    for (size_t i = hash_addr(key);; ++i) {
        TableEntry &e = t->entries[i & t->mask];
        const uint64_t k = e.key.load(std::memory_order_relaxed);
        if (k == key) {
            e.value.store(value, std::memory_order_release);
            return;
        }
        if (k == 0) {
            e.value.store(value, std::memory_order_relaxed);
            e.key.store(key, std::memory_order_release); // publishes the value with it
            ++t->used;
            return;
        }
    }
}

} // namespace

Point *find_point(uint64_t addr) {
    const Table *t = g_table.load(std::memory_order_acquire);
    if (t == nullptr) return nullptr;
    for (size_t i = hash_addr(addr), n = 0; n <= t->mask; ++i, ++n) {
        const TableEntry &e = t->entries[i & t->mask];
        const uint64_t k = e.key.load(std::memory_order_acquire);
        if (k == 0) return nullptr;
        if (k == addr) return e.value.load(std::memory_order_acquire);
    }
    return nullptr;
}

void insert_point(uint64_t addr, Point *p) {
    Table *t = g_table.load(std::memory_order_relaxed);
    if (t == nullptr || (t->used + 1) * 2 > t->mask + 1) {
        // Grow by copying into a table twice the size. The old table stays allocated:
        // a hit may still be walking it, and their sizes add up to less than the new one.
        Table *bigger = new_table(t == nullptr ? 4096 : (t->mask + 1) * 2);
        if (t != nullptr) {
            for (size_t i = 0; i <= t->mask; ++i) {
                const uint64_t k = t->entries[i].key.load(std::memory_order_relaxed);
                if (k != 0) put(bigger, k, t->entries[i].value.load(std::memory_order_relaxed));
            }
        }
        g_table.store(bigger, std::memory_order_release);
        if (t != nullptr) outgrown_tables().push_back(t);
        t = bigger;
    }
    put(t, addr, p);
}

} // namespace ukp::core

// The reading half of the ring (ring.hpp): what a reader of the shared ring needs, in
// this process or in another one that mapped the memfd (the CLI links it).
#include "trace/ring.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

namespace ukp::trace {

namespace {
constexpr uint32_t kRecHdr = sizeof(RecordHeader);
} // namespace

const RingHeader *RingView::header() const {
    if (base == nullptr || size < sizeof(RingHeader)) return nullptr;
    const auto *h = reinterpret_cast<const RingHeader *>(base);
    if (h->magic != kRingMagic || h->version != kRingVersion) return nullptr;
    if (h->header_size < sizeof(RingHeader) || h->buffer_header_size != sizeof(BufferHeader)) return nullptr;
    if (h->data_size == 0 || h->data_size % 8 != 0 || h->buffer_stride < h->data_size) return nullptr;
    if (h->header_size % alignof(BufferHeader) != 0 ||
        h->data_offset < h->header_size + uint64_t(h->buffer_count) * sizeof(BufferHeader) || h->data_offset > size ||
        (size - h->data_offset) / h->buffer_stride < h->buffer_count)
        return nullptr;
    return h;
}

// buffer() and data() are only called once header() accepted the view: they do not check
// it again (a reader's scan of every buffer would check it once per buffer).
BufferHeader *RingView::buffer(uint32_t i) const {
    const auto *h = reinterpret_cast<const RingHeader *>(base);
    return reinterpret_cast<BufferHeader *>(const_cast<uint8_t *>(base) + h->header_size) + i;
}

const uint8_t *RingView::data(uint32_t i) const {
    const auto *h = reinterpret_cast<const RingHeader *>(base);
    return base + h->data_offset + i * h->buffer_stride;
}

namespace {

// Copies positions [from, to) of a buffer's data into out (they are at most cap bytes).
void copy_span(const uint8_t *data, uint64_t cap, uint64_t from, uint64_t to, uint8_t *out) {
    uint64_t n = to - from, off = from % cap;
    const uint64_t first = std::min(n, cap - off);
    std::memcpy(out, data + off, first);
    if (n > first) std::memcpy(out + first, data, n - first);
}

bool sane(const RecordHeader &rh, uint64_t pos, uint64_t head) {
    if (rh.len < 8 || rh.len % 8 != 0 || pos + rh.len > head) return false;
    if (rh.kind == kPadKind) return true;
    return rh.kind == kRecordKind && rh.len >= kRecHdr && kRecHdr + rh.size <= rh.len;
}

} // namespace

std::vector<RingEntry> ring_collect(const RingView &v, RingCounts *counts) {
    std::vector<RingEntry> out;
    RingCounts c;
    const RingHeader *h = v.header();
    if (h == nullptr) {
        if (counts != nullptr) *counts = c;
        return out;
    }
    const uint64_t cap = h->data_size;
    std::vector<uint8_t> buf;
    for (uint32_t i = 0; i < h->buffer_count; ++i) {
        BufferHeader *s = v.buffer(i);
        c.overrun += s->overrun.load(std::memory_order_acquire) - s->overrun_base;
        c.lost += s->dropped.load(std::memory_order_acquire) - s->dropped_base;
        const uint64_t head = s->head.load(std::memory_order_acquire);
        const uint64_t t0 = s->tail.load(std::memory_order_acquire);
        if (head == t0 || head - t0 > cap) continue;
        buf.resize(head - t0);
        copy_span(v.data(i), cap, t0, head, buf.data());
        std::atomic_thread_fence(std::memory_order_acquire);
        // reserve_end before tail: the writer moves tail past what it evicts before it
        // publishes reserve_end, so this tail bounds every byte the copy may have torn.
        const uint64_t re = s->reserve_end.load(std::memory_order_acquire);
        const uint64_t t2 = s->tail.load(std::memory_order_acquire);
        const uint64_t start = std::max(t0, t2);
        const uint64_t torn_below = re > cap ? re - cap : 0;
        for (uint64_t p = start; p < head;) {
            RecordHeader rh;
            std::memcpy(&rh, buf.data() + (p - t0), kRecHdr <= head - p ? kRecHdr : 8);
            if (!sane(rh, p, head)) break;
            if (rh.kind == kRecordKind && p >= torn_below) {
                RingEntry e;
                e.ts = rh.ts;
                e.cpu = rh.cpu;
                e.buffer = i;
                e.lost_before = rh.dropped_before;
                const uint8_t *r = buf.data() + (p - t0) + kRecHdr;
                e.rec.assign(r, r + rh.size);
                out.push_back(std::move(e));
            }
            p += rh.len;
        }
    }
    std::stable_sort(out.begin(), out.end(), [](const RingEntry &a, const RingEntry &b) { return a.ts < b.ts; });
    for (RingEntry &e : out) e.ts = ring_time_ns(h, e.ts);
    c.lost += h->lost_no_buffer.load(std::memory_order_acquire) - h->lost_no_slot_base;
    c.entries = out.size();
    c.written = c.entries + c.overrun + c.lost;
    if (counts != nullptr) *counts = c;
    return out;
}

namespace {

// The oldest record of buffer i, copied, with its position; false when the buffer is empty.
// Skips pad records (consuming them).
bool peek_slot(const RingView &v, uint32_t i, RecordHeader *rh, std::vector<uint8_t> *rec, uint64_t *pos) {
    const RingHeader *h = v.header();
    const uint64_t cap = h->data_size;
    BufferHeader *s = v.buffer(i);
    for (int attempt = 0; attempt < 1000; ++attempt) {
        const uint64_t head = s->head.load(std::memory_order_acquire);
        uint64_t t = s->tail.load(std::memory_order_acquire);
        if (t == head || head - t > cap) return false;
        const uint8_t *at = v.data(i) + t % cap;
        std::memcpy(rh, at, std::min<uint64_t>(kRecHdr, cap - t % cap));
        if (rh->kind == kRecordKind && rh->len >= kRecHdr && rh->size <= rh->len - kRecHdr && t % cap + rh->len <= cap)
            rec->assign(at + kRecHdr, at + kRecHdr + rh->size);
        std::atomic_thread_fence(std::memory_order_acquire);
        const uint64_t re = s->reserve_end.load(std::memory_order_acquire);
        if ((re > cap && t < re - cap) || !sane(*rh, t, head) || t % cap + rh->len > cap)
            continue; // overwritten meanwhile
        if (rh->kind == kPadKind) {
            s->tail.compare_exchange_strong(t, t + rh->len, std::memory_order_acq_rel);
            continue;
        }
        *pos = t;
        return true;
    }
    return false;
}

} // namespace

namespace {

// The overruns of buffer s not reported yet, up to `overrun` (read before the consumer's
// CAS on tail), claimed: each is reported once, by the consumer that raises overrun_seen
// past it.
uint64_t claim_overruns(BufferHeader *s, uint64_t overrun) {
    std::atomic_ref<uint64_t> seen_ref(s->overrun_seen);
    uint64_t seen = seen_ref.load(std::memory_order_acquire);
    for (;;) {
        const uint64_t from = std::max(seen, s->overrun_base);
        if (overrun <= from) return 0;
        if (seen_ref.compare_exchange_weak(seen, overrun, std::memory_order_acq_rel)) return overrun - from;
    }
}

} // namespace

bool ring_consume_batch(const RingView &v, uint32_t buffer, size_t max_bytes, RingBatch *out) {
    out->records.clear();
    const RingHeader *h = v.header();
    if (h == nullptr || buffer >= h->buffer_count) return false;
    const uint64_t cap = h->data_size;
    BufferHeader *s = v.buffer(buffer);
    for (int attempt = 0; attempt < 16; ++attempt) {
        const uint64_t overrun = s->overrun.load(std::memory_order_acquire);
        const uint64_t t = s->tail.load(std::memory_order_acquire);
        const uint64_t head = s->head.load(std::memory_order_acquire);
        if (t == head) return false;
        if (head - t > cap) continue; // read between the writer's moves: again
        // Whole records up to about max_bytes: the copy may end inside one, left for later.
        const uint64_t end = std::min(head, t + std::max<uint64_t>(max_bytes, kMaxRecordSize + kRecHdr + 8));
        if (out->bytes.size() < end - t) out->bytes.resize(end - t); // kept between calls: no zeroing each time
        copy_span(v.data(buffer), cap, t, end, out->bytes.data());
        std::atomic_thread_fence(std::memory_order_acquire);
        // The writer moves tail past what it evicts before it publishes reserve_end, and
        // both before it overwrites: the copy is whole from the tail read after
        // reserve_end on (a record boundary), and the CAS below makes sure no eviction
        // came after. A writer faster than this reader evicts the oldest part of the copy
        // meanwhile; the rest is kept.
        const uint64_t re = s->reserve_end.load(std::memory_order_acquire);
        const uint64_t from = std::max(t, s->tail.load(std::memory_order_acquire));
        if ((re > cap && from < re - cap) || from >= end) continue;
        out->records.clear();
        uint64_t p = from;
        while (end - p >= 8) {
            RecordHeader rh{};
            std::memcpy(&rh, out->bytes.data() + (p - t), std::min<uint64_t>(kRecHdr, end - p));
            if (!sane(rh, p, head) || p + rh.len > end) break;
            if (rh.kind == kRecordKind) // pads are consumed with the records
                out->records.push_back(
                    RingBatch::Record{rh, static_cast<uint32_t>(p - t + kRecHdr), rh.dropped_before});
            p += rh.len;
        }
        if (p == from) return false; // not one whole record: a writer mid-way; later
        // Tail moved since (a writer evicting the oldest records, or another consumer
        // taking them; either way at a record boundary): the copy is whole from there.
        uint64_t expected = from;
        bool taken = false;
        while (expected >= from && expected < p)
            if ((taken = s->tail.compare_exchange_strong(expected, p, std::memory_order_acq_rel))) break;
        if (!taken) continue;  // all of it gone meanwhile: again
        if (expected > from) { // the records before it are not this consumer's
            const auto first = std::find_if(out->records.begin(), out->records.end(), [&](const RingBatch::Record &r) {
                return t + r.offset - kRecHdr >= expected;
            });
            out->records.erase(out->records.begin(), first);
        }
        if (const uint64_t reported = claim_overruns(s, overrun); reported != 0) {
            if (!out->records.empty())
                out->records.front().lost_before += reported;
            else
                out->records.push_back(
                    RingBatch::Record{RecordHeader{}, 0, reported}); // pads only: kind 0, a loss alone
        }
        return true;
    }
    return false;
}

namespace {

// Takes the record at `pos` of buffer `buffer` (peeked), reporting the overruns before it
// once; false when the writer overwrote it meanwhile (counted as an overrun).
bool take(const RingView &v, const RingHeader *h, uint32_t buffer, uint64_t pos, const RecordHeader &rh,
          std::vector<uint8_t> &rec, RingEntry *out) {
    BufferHeader *s = v.buffer(buffer);
    const uint64_t overrun = s->overrun.load(std::memory_order_acquire);
    uint64_t expected = pos;
    if (!s->tail.compare_exchange_strong(expected, pos + rh.len, std::memory_order_acq_rel)) return false;
    out->lost_before = claim_overruns(s, overrun) + rh.dropped_before;
    out->ts = ring_time_ns(h, rh.ts);
    out->cpu = rh.cpu;
    out->buffer = buffer;
    out->rec.swap(rec);
    return true;
}

} // namespace

bool ring_consume(const RingView &v, RingEntry *out) { return RingMerger(v).next(out); }

RingMerger::RingMerger(const RingView &v) : v_(v), h_(v.header()) {
    if (h_ == nullptr) return;
    for (uint32_t i = 0; i < h_->buffer_count; ++i) {
        BufferHeader *s = v.buffer(i);
        if (s->head.load(std::memory_order_acquire) == s->tail.load(std::memory_order_acquire)) continue;
        Head head;
        if (peek(i, &head)) push(std::move(head));
    }
}

bool RingMerger::peek(uint32_t buffer, Head *h) {
    if (!peek_slot(v_, buffer, &h->rh, &h->rec, &h->pos)) return false;
    h->ts = h->rh.ts;
    h->buffer = buffer;
    return true;
}

void RingMerger::push(Head h) {
    heap_.push_back(std::move(h));
    std::push_heap(heap_.begin(), heap_.end(), [](const Head &a, const Head &b) { return a.ts > b.ts; });
}

RingMerger::Head RingMerger::pop() {
    std::pop_heap(heap_.begin(), heap_.end(), [](const Head &a, const Head &b) { return a.ts > b.ts; });
    Head h = std::move(heap_.back());
    heap_.pop_back();
    return h;
}

bool RingMerger::next(RingEntry *out) {
    for (int attempt = 0; attempt < 1000 && !heap_.empty(); ++attempt) {
        Head h = pop();
        const bool taken = take(v_, h_, h.buffer, h.pos, h.rh, h.rec, out);
        // The buffer's next record (or, not taken, the one that overwrote it): h.rec now
        // holds the storage *out had, reused.
        if (peek(h.buffer, &h)) push(std::move(h));
        if (taken) return true;
    }
    return false;
}

uint64_t ring_time_ns(const RingHeader *h, uint64_t raw) {
    if (h->clock != kClockTsc) return raw;
    const uint32_t n = std::min(h->clock_count.load(std::memory_order_acquire), kClockSegments);
    if (n == 0) return raw;
    uint32_t i = n - 1;
    while (i > 0 && raw < h->segments[i].tsc0) --i;
    return clock_convert(h->segments[i], raw);
}

uint64_t ring_claim_lost_no_buffer(const RingView &v) {
    const RingHeader *h = v.header();
    if (h == nullptr) return 0;
    auto *mh = const_cast<RingHeader *>(h);
    const uint64_t now = h->lost_no_buffer.load(std::memory_order_acquire);
    uint64_t seen = mh->lost_no_slot_seen.load(std::memory_order_acquire);
    for (;;) {
        const uint64_t from = std::max(seen, h->lost_no_slot_base);
        if (now <= from) return 0;
        if (mh->lost_no_slot_seen.compare_exchange_weak(seen, now, std::memory_order_acq_rel)) return now - from;
    }
}

bool ring_has_data(const RingView &v) {
    const RingHeader *h = v.header();
    if (h == nullptr) return false;
    // Losses not reported yet are something to read too (a LOST line).
    const uint64_t lost = h->lost_no_buffer.load(std::memory_order_acquire);
    if (lost > std::max(h->lost_no_slot_seen.load(std::memory_order_acquire), h->lost_no_slot_base)) return true;
    for (uint32_t i = 0; i < h->buffer_count; ++i) {
        BufferHeader *s = v.buffer(i);
        if (s->head.load(std::memory_order_acquire) != s->tail.load(std::memory_order_acquire)) return true;
    }
    return false;
}

RingLevel ring_level(const RingView &v) {
    const RingHeader *h = v.header();
    if (h == nullptr || h->data_size == 0) return {};
    uint64_t most = 0, written = 0;
    for (uint32_t i = 0; i < h->buffer_count; ++i) {
        BufferHeader *s = v.buffer(i);
        const uint64_t head = s->head.load(std::memory_order_acquire);
        const uint64_t tail = s->tail.load(std::memory_order_acquire);
        if (head > tail) most = std::max(most, head - tail);
        written += head;
    }
    return {std::min(1.0, static_cast<double>(most) / static_cast<double>(h->data_size)), written, h->data_size};
}

void ring_clear_view(const RingView &v) {
    const RingHeader *h = v.header();
    if (h == nullptr) return;
    for (uint32_t i = 0; i < h->buffer_count; ++i) {
        BufferHeader *s = v.buffer(i);
        uint64_t t = s->tail.load(std::memory_order_acquire);
        for (;;) {
            const uint64_t head = s->head.load(std::memory_order_acquire);
            if (t >= head || s->tail.compare_exchange_weak(t, head, std::memory_order_acq_rel)) break;
        }
        s->overrun_base = s->overrun.load(std::memory_order_acquire);
        s->overrun_seen = s->overrun_base;
        s->dropped_base = s->dropped.load(std::memory_order_acquire);
        s->dropped_pending.store(0, std::memory_order_relaxed);
    }
    auto *mh = const_cast<RingHeader *>(h);
    mh->lost_no_slot_base = h->lost_no_buffer.load(std::memory_order_acquire);
}

std::string ring_thread_name(const RingView &v, int32_t pid, int32_t tid) {
    if (tid == 0) return "<idle>";
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/task/%d/comm", pid, tid);
    if (FILE *f = std::fopen(path, "re")) {
        char name[64] = {};
        const bool ok = std::fgets(name, sizeof name, f) != nullptr;
        std::fclose(f);
        if (ok) {
            std::string s(name);
            if (!s.empty() && s.back() == '\n') s.pop_back();
            return s;
        }
    }
    if (const RingHeader *h = v.header()) {
        const uint32_t next = h->comm_next.load(std::memory_order_acquire);
        for (uint32_t k = 0; k < kCommEntries; ++k) { // newest first
            const CommEntry &e = h->comms[(next - 1 - k) % kCommEntries];
            if (e.tid.load(std::memory_order_acquire) == tid) return std::string(e.comm, strnlen(e.comm, 16));
        }
        for (uint32_t i = 0; i < h->buffer_count; ++i) { // a buffer's owner, saved at its first record
            const BufferHeader *s = v.buffer(i);
            if (s->comm_tid.load(std::memory_order_acquire) != tid) continue;
            char name[16];
            std::memcpy(name, s->comm, sizeof name);
            std::atomic_thread_fence(std::memory_order_acquire);
            if (s->comm_tid.load(std::memory_order_relaxed) != tid) continue; // rewritten meanwhile
            return std::string(name, strnlen(name, sizeof name));
        }
    }
    return "<...>";
}

} // namespace ukp::trace

// Test records for the ring buffer's tests (ring_test, capture_test): the common header,
// the writer's index and sequence number, then bytes that depend on both, so that a torn
// record shows as a pattern mismatch; and a fixture that starts each test on fresh
// buffers.
#pragma once

#include <gtest/gtest.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "trace/ring.hpp"

namespace ukp::trace::test {

inline uint32_t payload_size(uint32_t seq) { return kCommonSize + 8 + seq % 61; }

// Writes record `seq` of `writer` from the calling thread; false when the ring refused it.
inline bool write_record(uint32_t writer, uint32_t seq) {
    const uint32_t size = payload_size(seq);
    uint8_t *rec = ring_reserve(size);
    if (rec == nullptr) return false;
    CommonHeader c{7, 0, 0, static_cast<int32_t>(syscall(SYS_gettid))};
    std::memcpy(rec, &c, sizeof c);
    std::memcpy(rec + 8, &writer, 4);
    std::memcpy(rec + 12, &seq, 4);
    for (uint32_t k = 16; k < size; ++k) rec[k] = static_cast<uint8_t>(seq * 31 + writer * 7 + k);
    ring_commit(rec, size);
    return true;
}

// Decodes and checks a test record of `size` bytes; false if it is torn or malformed.
inline bool check_record(const uint8_t *rec, size_t size, uint32_t *writer, uint32_t *seq) {
    if (size < 16) return false;
    std::memcpy(writer, rec + 8, 4);
    std::memcpy(seq, rec + 12, 4);
    if (size != payload_size(*seq)) return false;
    uint16_t type;
    std::memcpy(&type, rec, 2);
    if (type != 7) return false;
    for (uint32_t k = 16; k < size; ++k)
        if (rec[k] != static_cast<uint8_t>(*seq * 31 + *writer * 7 + k)) return false;
    return true;
}

// Each test on the main buffers, tracing on, no snapshot, 64 buffers of 1408 KiB.
class FreshRing : public ::testing::Test {
protected:
    void SetUp() override {
        ASSERT_EQ(ring_init(), 0);
        set_tracing_on(true);
        snapshot_free();
        ASSERT_EQ(set_ring_buffer_count(64), 0);
        ASSERT_EQ(set_buffer_size_kb(1408), 0);
    }
};

} // namespace ukp::trace::test

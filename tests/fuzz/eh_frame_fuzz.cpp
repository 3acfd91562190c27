// landing_pads() (src/arch/x86_64/region.hpp) on arbitrary .eh_frame_hdr/.eh_frame/LSDA
// bytes, read through a ReadFn over the input.
//
// Input: int32 lo (relative to the image base), uint16 hi - lo, uint16 offset of the
// .eh_frame_hdr in the image (0xffff: none), then the image, mapped at kBase.
// Checks: no crash or out-of-bounds read (ASan), only the documented return codes, an
// error text with every failure, pads only appended, the same answer twice.
#include "arch/x86_64/region.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            std::fprintf(stderr, "eh_frame_fuzz: %s:%d: %s\n", __FILE__, __LINE__, #cond);                             \
            std::abort();                                                                                              \
        }                                                                                                              \
    } while (0)

constexpr uint64_t kBase = 0x5555'0000'4000;
constexpr uint64_t kSentinel = 0xdead'beef'dead'beef;

template <class T>
T load(const uint8_t *p) {
    T v;
    std::memcpy(&v, p, sizeof(v));
    return v;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 8) return 0;
    const uint64_t lo = kBase + static_cast<uint64_t>(static_cast<int64_t>(load<int32_t>(data)));
    const uint64_t hi = lo + load<uint16_t>(data + 4);
    const uint16_t hdr_off = load<uint16_t>(data + 6);
    const std::vector<uint8_t> image(data + 8, data + size);
    const uint64_t hdr = hdr_off == 0xffff ? 0 : kBase + hdr_off;

    const ukp::arch::ReadFn read = [&image](uint64_t addr, void *out, size_t n) {
        if (addr < kBase || addr - kBase > image.size() || n > image.size() - (addr - kBase)) return false;
        std::memcpy(out, image.data() + (addr - kBase), n);
        return true;
    };

    std::vector<uint64_t> pads = {kSentinel};
    std::string error;
    const int rc = ukp::arch::landing_pads(hdr, lo, hi, read, &pads, &error);
    if (std::getenv("UKP_FUZZ_VERBOSE") != nullptr) {
        std::fprintf(stderr, "eh_frame_fuzz: rc %d, %zu pads, %s\n", rc, pads.size() - 1, error.c_str());
    }
    CHECK(rc == 0 || rc == -ENOENT || rc == -EFAULT || rc == -EPROTO);
    CHECK((rc == -ENOENT) == (hdr == 0));
    CHECK(rc == 0 || !error.empty());
    CHECK(!pads.empty() && pads[0] == kSentinel);

    std::vector<uint64_t> again;
    std::string error2;
    const int rc2 = ukp::arch::landing_pads(hdr, lo, hi, read, &again, &error2);
    CHECK(rc2 == rc && error2 == error);
    CHECK(again.size() == pads.size() - 1 && std::equal(again.begin(), again.end(), pads.begin() + 1));
    return 0;
}

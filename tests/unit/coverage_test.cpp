// Behaviour, not only the count: every entry of libc.so.6 and libstdc++.so.6 that only the
// object-wide rules of the region check make optimizable (trusted indirect jumps, regions
// that run into padding; arch/x86_64/region.hpp) gets an optimized probe in this process,
// and workloads that go through those libraries give the same results as without probes.
#include <ukprobes/kprobes.h>

#include "arch/x86_64/region.hpp"
#include "symbols/symbols.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csetjmp>
#include <iconv.h>
#include <pwd.h>
#include <unistd.h>
#include <wordexp.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cwchar>
#include <locale>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

std::atomic<long> g_hits{0};
kprobe *g_first = nullptr; // the probes' array, to count hits per probe
std::atomic<long> *g_per_probe = nullptr;
int count_pre(kprobe *p, pt_regs *) {
    g_hits.fetch_add(1, std::memory_order_relaxed);
    if (g_first != nullptr) g_per_probe[p - g_first].fetch_add(1, std::memory_order_relaxed);
    return 0;
}

struct NewEntry {
    std::string name;
    uint64_t addr; // run-time
    bool padding;
};

// Entries of the loaded object `file` that pass the check with the object's references
// and fail it without them.
std::vector<NewEntry> newly_covered(const std::string &file) {
    static ukp::sym::Registry reg;
    if (reg.objects().empty()) reg.refresh();
    std::shared_ptr<const ukp::sym::Object> obj;
    for (const auto &o : reg.objects()) {
        if (o->name == file) obj = o;
    }
    std::vector<NewEntry> out;
    if (!obj) return out;
    std::string err;
    auto img = ukp::arch::ElfImage::open(obj->path, obj->bias, &err);
    auto refs = ukp::arch::build_object_refs(obj->path, obj->bias, &err);
    EXPECT_TRUE(img && refs) << err;
    if (!img || !refs) return out;
    uint64_t last = 0;
    for (const ukp::sym::Symbol &s : obj->symbols()) {
        if (!s.function || s.size == 0 || s.value == last || s.ifunc) continue;
        last = s.value;
        const uint8_t *code = img->bytes(s.value, s.size);
        if (code == nullptr) continue;
        const auto f = ukp::arch::analyze_function(s.value, code, s.size, img->reader());
        std::vector<uint64_t> extra;
        if (ukp::arch::landing_pads(img->eh_frame_hdr(), s.value, s.value + s.size, img->reader(), &extra) != 0) {
            continue;
        }
        const auto with = ukp::arch::check_region(f, s.value, extra, 5, refs.get());
        if (with.ok && !ukp::arch::check_region(f, s.value, extra).ok) {
            out.push_back({s.name, s.value, with.into_padding});
        }
    }
    return out;
}

// Work through stdio, strings, numbers, wide characters, locales, streams and exceptions.
std::string workload() {
    std::string r;
    char buf[512];
    std::snprintf(buf, sizeof buf, "%d %5.2f %s %x %lu %e %-8s| %c %p", 42, 3.14159, "str", 0xbeef, 123456789ul, 1e-7,
                  "left", 'z', static_cast<void *>(nullptr));
    r += buf;
    std::vector<int> v{5, 3, 9, 1, 7, 2, 8};
    std::qsort(v.data(), v.size(), sizeof(int), [](const void *a, const void *b) {
        return *static_cast<const int *>(a) - *static_cast<const int *>(b);
    });
    for (int x : v) r += std::to_string(x);
    r += std::to_string(std::strtod("2.5e3", nullptr)) + std::to_string(std::strtol("-77", nullptr, 10));
    char s1[64] = "hello", s2[64];
    std::strcpy(s2, s1);
    std::strcat(s2, " world");
    r += s2;
    r += std::to_string(std::strcmp(s1, s2)) + std::to_string(std::strncmp(s1, s2, 3));
    r += std::to_string(strcasecmp("ABC", "abd"));
    // A memory stream read a character at a time: underflow/uflow.
    char data[] = "line one\nline two\n";
    if (FILE *m = fmemopen(data, std::strlen(data), "r")) {
        int c;
        while ((c = std::fgetc(m)) != EOF) r += static_cast<char>(c);
        std::fclose(m);
    }
    wchar_t w[64];
    std::swprintf(w, 64, L"%ls-%d", L"wide", 7);
    r += std::to_string(std::wcslen(w));
    std::ostringstream os;
    os.imbue(std::locale::classic());
    os << 3.25 << ' ' << std::hex << 255 << ' ' << std::string(5, 'x');
    r += os.str();
    std::istringstream is("10 20 30");
    int a = 0, b = 0, c = 0;
    is >> a >> b >> c;
    r += std::to_string(a + b + c);
    const auto &mp = std::use_facet<std::moneypunct<char>>(std::locale::classic());
    r += mp.decimal_point();
    r += std::to_string(mp.frac_digits());
    try {
        throw std::runtime_error("thrown");
    } catch (const std::exception &e) {
        r += e.what();
    }
    // iconv through the internal gconv steps (UCS-4, UCS-2, UTF-8, ASCII).
    for (const char *to : {"UCS-4", "UCS-4LE", "UCS-2", "UNICODEBIG", "UTF-8", "ASCII", "WCHAR_T"}) {
        iconv_t cd = iconv_open(to, "UTF-8");
        if (cd == reinterpret_cast<iconv_t>(-1)) continue;
        char in[] = "plain text", outbuf[128];
        char *ip = in, *op = outbuf;
        size_t il = std::strlen(in), ol = sizeof outbuf;
        r += std::to_string(iconv(cd, &ip, &il, &op, &ol)) + ":" + std::to_string(sizeof outbuf - ol);
        iconv_close(cd);
    }
    // Shell arithmetic (wordexp's parse_arith) and a user database lookup (nss).
    wordexp_t we;
    if (wordexp("$((3*4+1)) x", &we, WRDE_NOCMD) == 0) {
        for (size_t k = 0; k < we.we_wordc; ++k) r += we.we_wordv[k];
        wordfree(&we);
    }
    if (const passwd *pw = getpwuid(getuid())) r += std::to_string(pw->pw_uid);
    std::jmp_buf env;
    volatile int jumped = 0;
    if (setjmp(env) == 0) {
        jumped = 1;
        std::longjmp(env, 1);
    }
    r += std::to_string(jumped);
    return r;
}

TEST(coverage, NewlyCoveredLibraryEntriesOptimizedBehaveTheSame) {
    ASSERT_EQ(ukp_set_kprobes_optimization(1), 0);
    const std::string expected = workload();
    std::vector<NewEntry> entries;
    for (const char *file : {"libc.so.6", "libstdc++.so.6"}) {
        auto e = newly_covered(file);
        std::printf("coverage: %s: %zu entries newly optimizable\n", file, e.size());
        EXPECT_GT(e.size(), 20u) << file;
        entries.insert(entries.end(), e.begin(), e.end());
    }
    std::vector<kprobe> kps(entries.size());
    std::vector<std::atomic<long>> per_probe(entries.size());
    g_per_probe = per_probe.data();
    g_first = kps.data();
    size_t registered = 0, optimized = 0, padding = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
        kps[i].addr = reinterpret_cast<kprobe_opcode_t *>(entries[i].addr);
        kps[i].pre_handler = count_pre;
        // The blacklist refuses some (the agent's own dependencies): those are skipped.
        if (register_kprobe(&kps[i]) == 0)
            ++registered;
        else
            kps[i].addr = nullptr;
    }
    ukp_optimizer_flush();
    for (size_t i = 0; i < entries.size(); ++i) {
        if (kps[i].addr == nullptr) continue;
        if ((kps[i].flags & KPROBE_FLAG_OPTIMIZED) != 0) {
            ++optimized;
            padding += entries[i].padding;
        } else {
            std::printf("coverage: not optimized: %s\n", entries[i].name.c_str());
        }
    }
    std::printf("coverage: %zu registered, %zu optimized (%zu into padding)\n", registered, optimized, padding);
    EXPECT_GT(registered, entries.size() / 2);
    EXPECT_GE(optimized * 10, registered * 9);
    g_hits = 0;
    for (int round = 0; round < 3; ++round) EXPECT_EQ(workload(), expected);
    EXPECT_GT(g_hits.load(), 0);
    size_t hit = 0, gconv = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
        if (per_probe[i].load() == 0) continue;
        ++hit;
        gconv += entries[i].name.rfind("__gconv_transform", 0) == 0;
    }
    std::printf("coverage: %zu of the probes hit by the workload (%zu in gconv steps)\n", hit, gconv);
    EXPECT_GE(hit, 15u);
    EXPECT_GE(gconv, 1u);
    g_first = nullptr;
    for (auto &kp : kps) {
        if (kp.addr != nullptr) unregister_kprobe(&kp);
    }
    EXPECT_EQ(ukp_verify(nullptr), 0);
    EXPECT_EQ(workload(), expected);
}

} // namespace

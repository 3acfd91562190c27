// The code of the objects this test process has loaded, for tests that sweep a real
// library's instructions (libc's, libstdc++'s).
#pragma once

#include <cstdint>
#include <cstring>
#include <link.h>
#include <string>

// Calls fn(name, bias, lo, hi) for each executable segment [lo, hi) (run-time addresses,
// its bytes readable there) of each loaded object whose path contains one of `parts`
// (a null-terminated list). fn returns false to stop.
template <class Fn>
void for_each_loaded_code(const char *const *parts, Fn fn) {
    struct Walk {
        const char *const *parts;
        Fn *fn;
    } walk{parts, &fn};
    dl_iterate_phdr(
        [](dl_phdr_info *info, size_t, void *data) {
            auto *w = static_cast<Walk *>(data);
            const std::string name = info->dlpi_name != nullptr ? info->dlpi_name : "";
            bool wanted = false;
            for (const char *const *p = w->parts; *p != nullptr; ++p)
                wanted = wanted || name.find(*p) != std::string::npos;
            if (!wanted) return 0;
            for (int i = 0; i < info->dlpi_phnum; ++i) {
                const ElfW(Phdr) &ph = info->dlpi_phdr[i];
                if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
                const uint64_t lo = info->dlpi_addr + ph.p_vaddr;
                if (!(*w->fn)(name, static_cast<uint64_t>(info->dlpi_addr), lo, lo + ph.p_filesz)) return 1;
            }
            return 0;
        },
        &walk);
}

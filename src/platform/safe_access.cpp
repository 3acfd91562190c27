#include "platform/safe_access.hpp"

#include <initializer_list>

extern "C" {
extern const char ukp_safe_copy_insn[], ukp_safe_copy_fixup[];
extern const char ukp_safe_copy_loop_load[], ukp_safe_copy_loop_store[], ukp_safe_copy_last_load[],
    ukp_safe_copy_last_store[];
extern const char ukp_safe_load_fs_insn[], ukp_safe_load_gs_insn[], ukp_safe_load_seg_fixup[];
}

namespace ukp::platform {

uint64_t fixup_for(uint64_t rip) {
    for (const char *insn : {ukp_safe_copy_insn, ukp_safe_copy_loop_load, ukp_safe_copy_loop_store,
                             ukp_safe_copy_last_load, ukp_safe_copy_last_store})
        if (rip == reinterpret_cast<uint64_t>(insn)) return reinterpret_cast<uint64_t>(ukp_safe_copy_fixup);
    if (rip == reinterpret_cast<uint64_t>(ukp_safe_load_fs_insn) ||
        rip == reinterpret_cast<uint64_t>(ukp_safe_load_gs_insn))
        return reinterpret_cast<uint64_t>(ukp_safe_load_seg_fixup);
    return 0;
}

} // namespace ukp::platform

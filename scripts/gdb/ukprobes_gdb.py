# A gdb frame filter for programs running the ukprobes agent: leaves the kretprobe return
# stubs' frames ("ukp_kretprobe_stub.<function>", named through gdb's JIT interface) out
# of `bt`, so a backtrace lists the real callers only. gdb keeps the frame numbers:
# `frame N` still selects a stub's frame.
#
# Load it with `source /path/to/ukprobes_gdb.py` (in gdb or in ~/.config/gdb/gdbinit).
# `cmake --install` puts it where gdb auto-loads it for the installed libukprobes.so
# ($prefix/share/gdb/auto-load/$libdir/libukprobes.so.VERSION-gdb.py): with the /usr
# prefix, that is within gdb's default auto-load safe-path.
import gdb


class UkprobesReturnStubs:
    def __init__(self):
        self.name = "ukprobes-return-stubs"
        self.priority = 100
        self.enabled = True

    def filter(self, frames):
        for f in frames:
            name = f.inferior_frame().name()
            if name is None or not name.startswith("ukp_kretprobe_stub"):
                yield f


gdb.frame_filters["ukprobes-return-stubs"] = UkprobesReturnStubs()

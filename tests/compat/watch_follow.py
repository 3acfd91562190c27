# For tests/compat/watch.txt (gdb -x): follows bash's WORD_DESCs as the w: events with set_wprobe and
# clear_wprobe do: the flags word (offset 8, 4 bytes) of the first one alloc_word_desc()
# returns is watched until dispose_word() takes it; then the next one born. Each change
# prints "write VALUE WHERE", the code address after the write: SYM+0xOFF, or 0xADDR where no
# exported symbol holds it.
import gdb

watched = None  # (address, watchpoint)


class Watch(gdb.Breakpoint):
    def __init__(self, addr):
        super().__init__("*(int *)%d" % addr, gdb.BP_WATCHPOINT, gdb.WP_WRITE, internal=True)
        self.addr = addr

    def stop(self):
        v = int(gdb.parse_and_eval("*(int *)%d" % self.addr))
        pc = int(gdb.parse_and_eval("$pc"))
        s = gdb.execute("info symbol $pc", to_string=True).split()
        where = "%s+0x%x" % (s[0], int(s[2]) if s[1] == "+" else 0) if s[0] != "No" else "0x%x" % pc
        print("write %d %s" % (v, where))
        return False


class Born(gdb.FinishBreakpoint):
    def stop(self):
        global watched
        if watched is None:
            addr = int(gdb.parse_and_eval("$rax")) + 8
            watched = (addr, Watch(addr))
        return False


class Alloc(gdb.Breakpoint):
    def stop(self):
        if watched is None:
            Born(gdb.newest_frame(), internal=True)
        return False


class Dispose(gdb.Breakpoint):
    def stop(self):
        global watched
        if watched is not None and int(gdb.parse_and_eval("$rdi")) + 8 == watched[0]:
            watched[1].delete()
            watched = None
        return False


gdb.execute("set pagination off")
gdb.execute("break main")
gdb.execute("run")
Alloc("alloc_word_desc", internal=True)
Dispose("dispose_word", internal=True)
gdb.execute("continue")

#!/usr/bin/env python3
"""Writes the hand-made inputs of the fuzz targets into tests/fuzz/corpus/<target>/
(hand-*). Run from anywhere; the minimized inputs of fuzzing runs sit next to them."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def out(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "hand-" + name), "wb") as f:
        f.write(data)


# relocate_fuzz: [opts][15 insn bytes][16 selectors][16 x u64][u16 flags][16 x xmm][stack]
# opts: bits 0-1 exit (0 jump back, 1 none, 2 trap), 2-3 where the original sits in its
# page, 4-5 which near destination, 6 far destination below, 7 copy near a page end.
INSNS = {
    "mov_rbp_rsp": "48 89 e5",
    "ud2": "0f 0b",
    "endbr64": "f3 0f 1e fa",
    "mov_load_rip": "48 8b 05 00 01 00 00",
    "mov_store_rip": "48 89 05 00 01 00 00",
    "mov_load_rip_back": "48 8b 05 f0 ff ff ff",
    "cmp_imm_rip": "83 3d 00 01 00 00 05",
    "lea_rip": "48 8d 05 00 01 00 00",
    "lea_rip32": "8d 05 00 01 00 00",
    "lea_rip_r9": "4c 8d 0d 00 01 00 00",
    "movaps_rip": "0f 28 05 00 01 00 00",
    "vmovdqa_rip": "c5 fd 6f 05 00 01 00 00",
    "push_rip": "ff 35 00 01 00 00",
    "mov_ah_rip": "8a 25 00 01 00 00",
    "cmpxchg_rip": "48 0f b1 0d 00 01 00 00",
    "lock_add_rip": "f0 48 01 05 00 01 00 00",
    "jb_rel32": "0f 82 00 01 00 00",
    "jg_rel32": "0f 8f 00 01 00 00",
    "je_rel8": "74 10",
    "jne_back": "75 e0",
    "jecxz": "67 e3 10",
    "jrcxz": "e3 10",
    "loop": "e2 10",
    "call_rel32": "e8 00 01 00 00",
    "jmp_rel32": "e9 00 01 00 00",
    "jmp_rel8": "eb 10",
    "bnd_jmp": "f2 e9 00 01 00 00",
    "call_rip": "ff 15 00 01 00 00",
    "notrack_call_rip": "3e ff 15 00 01 00 00",
    "jmp_rip": "ff 25 00 01 00 00",
    "call_rax": "ff d0",
    "call_r11": "41 ff d3",
    "jmp_rax": "ff e0",
    "call_rsp_ptr": "ff 14 24",
    "call_rsp_disp8": "ff 54 24 08",
    "call_rsp_redzone": "ff 54 24 f8",
    "ret": "c3",
    "ret_imm16": "c2 10 00",
    "bnd_ret": "f2 c3",
    "push_rbp": "55",
    "pop_rbx": "5b",
    "rep_movsb": "f3 a4",
    "div_rcx": "48 f7 f1",
    "mov_rax_ptr": "48 8b 00",
    "add_rsp": "48 83 c4 08",
    "pushfq": "9c",
    "xchg_rsp_ptr": "48 87 04 24",
}


def reloc_input(opts, insn, stack=b"", rax_sel=0, flags=0):
    b = bytes([opts]) + bytes.fromhex(insn).ljust(15, b"\x90")
    sel = bytes([rax_sel]) + bytes([0, 0, 0, 0, 0, 0, 0] + [1] * 8)
    regs = b"".join(struct.pack("<Q", 0x100 + 0x40 * i) for i in range(16))
    xmm = bytes(range(256))
    return b + sel + regs + struct.pack("<H", flags) + xmm + stack


# A return address / call target at rsp that lands in the int3s around the original.
TO_INT3S = struct.pack("<Q", 0x2000_0000_0000 + 0x1800)
for i, (name, insn) in enumerate(sorted(INSNS.items())):
    out("relocate_fuzz", name, reloc_input(0, insn, TO_INT3S))
    # Other placements and exits: far copy below, page-crossing original, Exit::kNone/kTrap.
    out("relocate_fuzz", name + "-b", reloc_input(0x40 | 0x08 | (1 + i % 2) | ((i % 4) << 4) | (0x80 if i % 3 == 0 else 0),
                                                  insn, TO_INT3S, rax_sel=3, flags=0x8d5 if i % 2 else 0x400))


# region_fuzz: [opts][extra entry offset][rodata length][stride][code ... rodata]
FUNCS = {
    # push rbp; mov rbp,rsp; mov eax,edi; add eax,1; pop rbp; ret
    "prologue": "55 48 89 e5 89 f8 83 c0 01 5d c3",
    # cmp edi,3; ja default; lea rdx,[rip+T]; movsxd rax,[rdx+rdi*4]; add rax,rdx; jmp rax;
    # 4 cases; default: ret; rodata T (4 x rel32) right behind the code.
    "jump_table": "83 ff 03 77 1c 48 8d 15 1a 00 00 00 48 63 04 ba 48 01 d0 ff e0 "
                  "b8 01 00 00 00 c3 b8 02 00 00 00 c3 31 c0 c3 90 "
                  "e7 ff ff ff ed ff ff ff f3 ff ff ff f3 ff ff ff",
    # a loop with a backward jcc into the middle of the first 5 bytes
    "loop": "31 c0 01 f8 ff cf 75 fa c3",
    # call in the first bytes, tail jmp through rip
    "call_tail": "e8 00 00 00 00 48 83 c4 08 ff 25 00 00 00 00",
    "truncated": "48 8b 05 00 01",
}
for name, code in FUNCS.items():
    b = bytes.fromhex(code)
    rodata = 16 if name == "jump_table" else 0
    out("region_fuzz", name, bytes([2, 3, rodata, 1]) + b)
    out("region_fuzz", name + "-jmp8", bytes([7, 1, rodata, 3]) + b)


# eh_frame_fuzz: [i32 lo - base][u16 hi - lo][u16 .eh_frame_hdr offset][image from base]
# The image: a real C++ program's .eh_frame_hdr, .eh_frame and .gcc_except_table (a
# function with landing pads), cut from the file as laid out in memory.
def elf_sections(path):
    data = open(path, "rb").read()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = hdrs[shstrndx]
    names = data[strtab[4]:strtab[4] + strtab[5]]
    secs = {}
    for h in hdrs:
        name = names[h[0]:names.index(b"\0", h[0])].decode()
        secs[name] = (h[3], h[4], h[5])  # addr, offset, size
    return data, secs


def eh_frame_inputs():
    import subprocess
    import tempfile
    src = r"""
#include <stdexcept>
#include <string>
__attribute__((noinline)) void thrower(int x) { if (x > 3) throw std::runtime_error("x"); }
__attribute__((noinline)) int pads(int x) {
    std::string a(x, 'a');
    try { thrower(x); } catch (const std::exception &) { return 1; }
    std::string b(x, 'b');
    thrower(x + 1);
    return static_cast<int>(a.size() + b.size());
}
int main(int argc, char **) { return pads(argc); }
"""
    with tempfile.TemporaryDirectory() as d:
        open(d + "/p.cpp", "w").write(src)
        subprocess.run(["g++", "-O2", "-fPIE", "-pie", "-o", d + "/p", d + "/p.cpp"], check=True)
        syms = subprocess.run(["nm", "-S", d + "/p"], check=True, capture_output=True, text=True).stdout
        data, secs = elf_sections(d + "/p")
    pads_at, pads_size = next((int(l.split()[0], 16), int(l.split()[1], 16))
                              for l in syms.splitlines() if l.endswith(" _Z4padsi"))
    base = secs[".eh_frame_hdr"][0]
    end_sec = secs.get(".gcc_except_table", secs[".eh_frame"])
    end = end_sec[0] + end_sec[2]
    # Same segment: file offsets follow addresses.
    off = secs[".eh_frame_hdr"][1]
    image = data[off:off + (end - base)]
    head = struct.pack("<iHH", pads_at - base, pads_size, 0)
    out("eh_frame_fuzz", "gxx-pads", head + image)
    out("eh_frame_fuzz", "gxx-no-hdr", struct.pack("<iHH", pads_at - base, pads_size, 0xFFFF) + image)
    out("eh_frame_fuzz", "gxx-whole", struct.pack("<iHH", -0x10000, 0xFFFF, 0) + image)


eh_frame_inputs()


# trace_parse_fuzz: [option byte: bit 0 = comma-separated words][definition line]
DEFS = [
    "p:grp/ev do_work+4 a=%ax b=+8(%sp):u32 c=$arg1 s=+0(%di):string",
    "p do_work",
    "r:ev do_work $retval ret=$retval:s32",
    "r16 do_work%return",
    "p:ev libc.so.6:malloc size=%di:u64",
    "p /usr/bin/prog:0x1139 x=@counter:u32 y=@counter+8",
    "p 0x401000 a0 a1 rv ra s0 sa",
    "p:g.ev do_work arr=+0(%si):u8[4] st=$stack1 cm=$comm imm=\\\"hi\\\"",
    "-:grp/ev",
    "p:bad/ do_work",
    "p:ev later:func a=%di",
    "p /usr/lib/x.so:0x10 w=@/usr/lib/x.so:0x2000",
    "e:ev kprobes.src $n v=+0($p):u64 (req)p->size (req)$p->in.depth:x32 x=(req)p->next->str",
    "e:ev kprobes.src (nosuch)p->size (req)s->a (req)p",
    "e:ev kprobes.src $a x=+8($a):u64 y=+0(+16($a)):string (req)a->b",
]
for i, d in enumerate(DEFS):
    out("trace_parse_fuzz", "def%d" % i, b"\0" + d.encode())

# trace_filter_fuzz: [filter text] NUL [record bytes] (tests/fuzz/trace_fields.hpp)
FILTERS = [
    "arg1 == 5",
    "arg2 < 0 && (c == 'a' || arr[1] > 3)",
    'name ~ "fo*[a-c]?"',
    'common_comm == "fuzz" || common_pid != 0',
    "__probe_ip & 0xff",
    "!(arg1 >= 10) && arg2 <= -3",
    "arg1 == 5 &&",
    "nosuchfield == 1",
]
rec = struct.pack("<HBBi", 7, 0, 0, 1234) + struct.pack("<QQi", 0x401000, 5, -4)
rec += struct.pack("<I", (8 << 16) | 45) + b"a" + struct.pack("<4H", 1, 4, 9, 16) + struct.pack("<I", (8 << 16) | 45)
rec += b"foobar!\0"
for i, f in enumerate(FILTERS):
    out("trace_filter_fuzz", "filter%d" % i, f.encode() + b"\0" + rec)

# trace_trigger_fuzz: trigger lines; "@" + bytes fires on a record of those bytes
TRIGGERS = [
    "traceon\ntraceoff:3 if arg1 > 5\n@" + "x" * 48 + "\n!traceon",
    "stacktrace:2\nsnapshot if name ~ \"foo*\"\n@" + "y" * 48,
    "enable_event:kprobes:other\ndisable_event:kprobes:nosuch\n!enable_event:kprobes:other",
    "hist:keys=arg1:vals=hitcount:sort=hitcount\n@" + "z" * 48 + "\n@" + "w" * 48 + "\n!hist:keys=arg1",
    "hist:keys=name,arg2.hex:values=arg1:sort=arg1.descending:size=256 if arg1 != 0\n@" + "v" * 60,
    "hist:keys=__probe_ip.sym-offset\n@" + "u" * 48,
    "traceon\ntraceon",
    # histogram.rst's attributes and modifiers: names, percent and graph, nohitcount, the
    # clock, syscall keys, enable_hist, variables as values and keys, unary minus; ">": a
    # truncating write.
    "hist:name=n1:keys=arg1:vals=hitcount.percent,arg1.graph:nohitcount\nhist:name=n1:keys=arg2\n@" + "t" * 48
    + "\n>hist:keys=arg1.syscall:clock=mono:t=common_timestamp\n@" + "s" * 48,
    "hist:keys=arg1:pause\nenable_hist:kprobes:other:2 if arg2 > 0\ndisable_hist:kprobes:other\n@" + "r" * 48
    + "\n!enable_hist:kprobes:other",
    "hist:keys=$k:k=arg1,v=arg2*2:vals=$v\nhist:keys=arg2:n=-(arg1-arg2):x=arg1/0\n@" + "q" * 48,
    # histogram.rst's block_lat: a stack in a variable, passed on as another variable to a
    # synthetic event's stack field; a stack field as a key.
    "hist:keys=common_pid:st=common_stacktrace,s=$st:onmatch(kprobes.probe).syn(arg1,name,$s)\n"
    "hist:keys=arg1.buckets=10,stk.stacktrace\n@" + "p" * 64 + "\nhist:keys=arg2:x=$st+1",
    # Fields of the matching event as onmatch() parameters: field variables written on
    # kprobes.other (one refused for want of a histogram there first).
    "hist:keys=arg2:onmatch(kprobes.other).syn(arg1,kprobes.other.name,stk)\n%hist:keys=arg2:t=arg1\n"
    "hist:keys=arg2:onmatch(kprobes.other).syn(arg1,kprobes.other.name,stk)\n@" + "o" * 48 + "\n"
    "!hist:keys=arg2:onmatch(kprobes.other).syn(arg1,kprobes.other.name,stk)\n%!hist:keys=arg2:t=arg1",
]
for i, t in enumerate(TRIGGERS):
    out("trace_trigger_fuzz", "trig%d" % i, t.encode())

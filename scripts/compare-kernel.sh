#!/usr/bin/env bash
# Runs a program ONCE with the same definitions in ukprobes (`ukprobe run`) and in the
# kernel's uprobe tracer (tracefs uprobe_events), and compares the two traces event by
# event: per thread and event, the same number of hits and the same field values.
#
#   scripts/compare-kernel.sh [-u UKPROBE] [-k DIR] [-q] [-K SED] -e DEF [-e DEF]... -- PROG [ARGS...]
#   scripts/compare-kernel.sh [OPTIONS] -p PID -w WORKLOAD -e DEF...
# The second form attaches to a running process (`ukprobe attach`), arms the definitions
# in both tracers while it is idle, records while the sh command WORKLOAD runs (it should
# make the process work, then return once it is idle again), and compares.
#
# DEF is a ukprobes definition with a named event: `p:GRP/EVENT [MOD:]SYM[+0] ARGS`,
# `r:GRP/EVENT [MOD:]SYM ARGS` or `p:GRP/EVENT [MOD:]SYM%return ARGS` (MOD: `libc.so.6`
# or any object `ldd PROG` lists, or a path; no MOD: PROG's own symbol). GRP is replaced
# by a group unique to this run in both tracers. The place may also be the kernel's
# uprobe_events form PATH:OFFSET (a function's start). The kernel's definition is
# `p:GRP/EVENT PATH:0xOFFSET ARGS`. While it runs, the kernel's probes trap in every
# process that maps the file; only this run's processes are recorded (set_event_pid).
#
# Two breakpoints cannot share an address (each tracer would either miss its hit or
# resume in the middle of the other's patch), so the kernel's probe goes one instruction
# later (the first instruction is decoded with objdump) and ukprobes runs without jump
# optimization (UKP_KPROBES_OPTIMIZATION=0: a one-byte int3 at the entry; not for the
# functions glibc's spawn child runs, which keep their jumps: docs/reference.md). The first
# instruction must leave what the arguments read unchanged: endbr64 and nop change
# nothing, cmp and test only %flags; `push` and `sub $N,%rsp` move the stack (the
# kernel's $stackN and +N($stack) are shifted to compensate; %sp, $stack and return
# probes are refused); a `mov`/`lea`/`xor`/`add`/... into a register refuses arguments
# that read that register (and %flags, but for mov and lea).
# docs/tracer.md ("Compared with the kernel's uprobe tracer") lists what is normalised:
# timestamps, CPU, flags, TASK names, the probe address part of the line (each checked
# against the symbol on its own) and the kernel's return address (ukprobes' trampoline).
#
# Exit status: 0 the traces agree (and have at least one event), 1 they differ,
# 2 usage or setup error, 77 the kernel's uprobe tracer is not available.
# -k DIR keeps the raw and normalised traces there; -q prints only differences; -K SED
# edits the kernel's definitions only (a sed expression), to check that a difference fails.
set -u
TRACEFS=/sys/kernel/tracing
UKPROBE=${UKPROBE:-}
KEEP=""
QUIET=0
KSED=""
ATTACH=""
WORKLOAD=""
DEFS=()
while [ $# -gt 0 ]; do
    case "$1" in
    -u) UKPROBE=$2; shift 2 ;;
    -k) KEEP=$2; shift 2 ;;
    -q) QUIET=1; shift ;;
    -K) KSED=$2; shift 2 ;;
    -p) ATTACH=$2; shift 2 ;;
    -w) WORKLOAD=$2; shift 2 ;;
    -e) DEFS+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "usage: $0 [-u UKPROBE] [-k DIR] [-q] [-K SED] -e DEF... -- PROG [ARGS...]" >&2; exit 2 ;;
    esac
done
[ ${#DEFS[@]} -gt 0 ] && { [ $# -gt 0 ] || [ -n "$ATTACH" ]; } || { echo "compare-kernel: need -e DEF and -- PROG or -p PID" >&2; exit 2; }
if [ -z "$UKPROBE" ]; then
    UKPROBE=$(command -v ukprobe || true)
    [ -n "$UKPROBE" ] || UKPROBE=$(dirname "$0")/../build/tools/ukprobe/ukprobe
fi
[ -x "$UKPROBE" ] || { echo "compare-kernel: no ukprobe at $UKPROBE" >&2; exit 2; }

skip() { echo "compare-kernel: skipped: $*" >&2; exit 77; }
[ "$(id -u)" = 0 ] || skip "not root (the kernel's uprobe_events needs root)"
[ -w $TRACEFS/uprobe_events ] || mount -t tracefs nodev $TRACEFS 2>/dev/null
[ -w $TRACEFS/uprobe_events ] || skip "no $TRACEFS/uprobe_events (tracefs or CONFIG_UPROBE_EVENTS missing)"
for t in objdump nm readelf ldd awk; do command -v $t >/dev/null || skip "$t not installed"; done

# Left by a run that was killed (SIGKILL runs no trap): its instance and events go now.
for g in $(sed -n 's/^[pr]:\(ukpcmp[0-9]*\)\/.*/\1/p' $TRACEFS/uprobe_events | sort -u) \
         $(ls $TRACEFS/instances 2>/dev/null | grep '^ukpcmp[0-9]*$'); do
    kill -0 "${g#ukpcmp}" 2>/dev/null && continue
    [ -d "$TRACEFS/instances/$g" ] && { echo 0 >"$TRACEFS/instances/$g/events/enable" 2>/dev/null; rmdir "$TRACEFS/instances/$g"; }
    for e in $(sed -n "s/^[pr]:$g\/\([^ ]*\) .*/\1/p" $TRACEFS/uprobe_events); do echo "-:$g/$e" >>$TRACEFS/uprobe_events; done
done 2>/dev/null

if [ -n "$ATTACH" ]; then
    PROG=$(readlink -f /proc/"$ATTACH"/exe) || { echo "compare-kernel: no process $ATTACH" >&2; exit 2; }
else
    PROG=$(command -v "$1") || { echo "compare-kernel: no program $1" >&2; exit 2; }
    PROG=$(readlink -f "$PROG")
fi
[ "$(head -c4 "$PROG" | od -An -c | tr -d ' ')" = '177ELF' ] || { echo "compare-kernel: $PROG is not an ELF program (a script or a shim: give the real one)" >&2; exit 2; }
GROUP="ukpcmp$$"
INST=$TRACEFS/instances/$GROUP
WORK=$(mktemp -d /tmp/ukp-cmp-XXXXXX)
KEVENTS=()

ATTACHED=0
cleanup() {
    if [ "$ATTACHED" = 1 ]; then
        while read -r e _; do "$UKPROBE" -p "$ATTACH" disable "$GROUP/$e"; "$UKPROBE" -p "$ATTACH" append kprobe_events "-:$GROUP/$e"; done <"$WORK/events" >/dev/null 2>&1
        "$UKPROBE" -p "$ATTACH" write kprobes/optimization 1 >/dev/null 2>&1
        "$UKPROBE" -p "$ATTACH" detach >/dev/null 2>&1
    fi
    [ -d "$INST" ] && { echo 0 >"$INST/events/enable" 2>/dev/null; rmdir "$INST" 2>/dev/null; }
    for e in "${KEVENTS[@]}"; do echo "-:$GROUP/$e" >>$TRACEFS/uprobe_events 2>/dev/null; done
    if [ -n "$KEEP" ]; then mkdir -p "$KEEP" && cp "$WORK"/* "$KEEP"/ 2>/dev/null; fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 2' INT TERM

die() { echo "compare-kernel: $*" >&2; exit 2; }

# The file an object name stands for: a path, PROG itself, or what ldd PROG lists.
object_path() {
    case "$1" in
    "") echo "$PROG" ;;
    /*) readlink -f "$1" ;;
    *) local p
       p=$(ldd "$PROG" 2>/dev/null | awk -v m="$1" '$1 == m && $3 ~ /^\// { print $3; exit }')
       [ -n "$p" ] || [ "$1" != "$(basename "$PROG")" ] || p=$PROG
       [ -n "$p" ] && readlink -f "$p" ;;
    esac
}

# "VADDR SIZE" of a defined function symbol (dynamic table first: stripped programs).
symbol_of() {
    { nm -D -S --defined-only "$1" 2>/dev/null; nm -S --defined-only "$1" 2>/dev/null; } |
        awk -v s="$2" 'NF == 4 { n = $4; sub(/@.*/, "", n); if (n == s && $3 ~ /[TtWi]/) { print $1, $2; exit } }'
}

# Every name at an address (ukprobes may print any alias: write, __write, __libc_write).
aliases_of() {
    { nm -D --defined-only "$1" 2>/dev/null; nm --defined-only "$1" 2>/dev/null; } |
        awk -v a="$2" 'NF == 3 && $1 ~ /^[0-9a-f]+$/ { x = $1; y = a; sub(/^0+/, "", x); sub(/^0+/, "", y); if (x == y) { n = $3; sub(/@.*/, "", n); print n } }' |
        sort -u | tr '\n' ' '
}

# File offset of a virtual address, through the LOAD program headers.
file_offset() {
    local x=$((0x$2)) off va fs
    while read -r off va fs; do
        if [ $x -ge $((va)) ] && [ $x -lt $((va + fs)) ]; then printf '0x%x\n' $((x - va + off)); return; fi
    done < <(readelf -lW "$1" | awk '$1 == "LOAD" { print $2, $3, $5 }')
}

# The virtual address (hex, no 0x) of a file offset.
vaddr_of() {
    local x=$(($2)) off va fs
    while read -r off va fs; do
        if [ $x -ge $((off)) ] && [ $x -lt $((off + fs)) ]; then printf '%x\n' $((x - off + va)); return; fi
    done < <(readelf -lW "$1" | awk '$1 == "LOAD" { print $2, $3, $5 }')
}

# "NAME SIZE" of a function that starts at a virtual address.
symbol_at() {
    { nm -D -S --defined-only "$1" 2>/dev/null; nm -S --defined-only "$1" 2>/dev/null; } |
        awk -v a="$2" 'NF == 4 && $3 ~ /[TtWi]/ { x = $1; y = a; sub(/^0+/, "", x); sub(/^0+/, "", y); if (x == y) { n = $4; sub(/@.*/, "", n); print n, $2; exit } }'
}

# Rewrites the kernel's arguments for a probe one instruction later: stack delta D,
# clobbered registers C (kernel names, comma-separated, "" for none; "flags" for %flags).
# Prints the arguments or fails.
kernel_args() {
    local ret=$1 d=$2 c=$3; shift 3
    local out=() a name val rest n
    for a in "$@"; do
        name=""; val=$a
        case "$a" in *=*) name=${a%%=*}=; val=${a#*=} ;; esac
        # $argN: this kernel's uprobes reject it ("$arg* can be used only on function
        # entry or exit"): the System V register at entry.
        while [[ $val =~ \$arg([1-6])([^0-9]|$) ]]; do
            [ "$ret" = 1 ] && { echo "\$argN in a return probe: the kernel's uprobes have no value at entry ($a)" >&2; return 1; }
            n=${BASH_REMATCH[1]}
            local regs=(x di si dx cx r8 r9)
            val=${val/\$arg$n/%${regs[$n]}}
        done
        local r
        for r in ${c//,/ }; do
            if [[ $val =~ %$r([^0-9a-z]|$) ]]; then
                echo "argument $a reads %$r, which the first instruction changes" >&2; return 1
            fi
        done
        if [ "$d" != 0 ]; then
            [[ $val =~ %sp([^a-z]|$) ]] && { echo "argument $a reads %sp, moved by the first instruction" >&2; return 1; }
            # $stackN -> $stack(N + d/8); +OFF($stack) -> +(OFF+d)($stack); a bare $stack refused.
            while [[ $val =~ \$stack([0-9]+) ]]; do
                [ $((d % 8)) = 0 ] || { echo "argument $a: the stack moved by $d, not whole words" >&2; return 1; }
                n=${BASH_REMATCH[1]}
                val=${val/\$stack$n/\$STACK$((n + d / 8))}
            done
            while [[ $val =~ ([+-])([0-9]+|0x[0-9a-fA-F]+)\(\$stack\) ]]; do
                local sign=1 off=${BASH_REMATCH[2]}
                [ "${BASH_REMATCH[1]}" = - ] && sign=-1
                local v=$(( sign * off + d ))
                local rep; [ $v -ge 0 ] && rep="+$v" || rep="$v"
                val=${val/${BASH_REMATCH[0]}/$rep(\$STACKADDR)}
            done
            [[ $val =~ \$stack([^0-9]|$) ]] && { echo "argument $a reads \$stack, moved by the first instruction" >&2; return 1; }
            val=${val//\$STACKADDR/\$stack}
            val=${val//\$STACK/\$stack}
        fi
        out+=("$name$val")
    done
    echo "${out[*]}"
}

# The first instruction at VADDR of FILE: "LENGTH DELTA CLOBBERED" or fails.
first_insn() {
    local line mn ops len
    line=$(objdump -d --no-show-raw-insn "$1" --start-address=0x$2 --stop-address=$(printf 0x%x $((0x$2 + 16))) |
        awk -F'\t' '/^ *[0-9a-f]+:\t/ { print; exit }')
    local next
    next=$(objdump -d --no-show-raw-insn "$1" --start-address=0x$2 --stop-address=$(printf 0x%x $((0x$2 + 16))) |
        awk '/^ *[0-9a-f]+:\t/ { n++; if (n == 2) { sub(/:.*/, "", $1); print $1; exit } }')
    [ -n "$line" ] && [ -n "$next" ] || return 1
    len=$((0x$next - 0x$2))
    mn=$(echo "$line" | cut -f2 | awk '{ print $1 }')
    ops=$(echo "$line" | cut -f2 | awk '{ $1 = ""; print }' | sed 's/ *#.*//; s/^ *//')
    case "$mn" in
    endbr64|nop*) echo "$len 0 -" ;;
    cmp*|test*) echo "$len 0 flags" ;;
    push) echo "$len 8 -" ;;
    sub) [[ $ops =~ ^\$0x([0-9a-f]+),%rsp$ ]] && echo "$len $((0x${BASH_REMATCH[1]})) flags" || return 1 ;;
    mov*|lea*|xor*|and*|or*|add*)
        local dst=${ops##*,}
        [[ $dst =~ ^%([a-z0-9]+)$ ]] || return 1
        local r=${BASH_REMATCH[1]}
        [ "$r" = rsp ] || [ "$r" = esp ] && return 1
        # The kernel's name: rax/eax/ax -> ax, rdi/edi -> di, r8/r8d -> r8.
        r=${r#r}; r=${r#e}; r=${r%d}; r=${r%w}; r=${r%b}
        case "$r" in 8|9|1[0-5]) r=r$r ;; al) r=ax ;; bl) r=bx ;; cl) r=cx ;; dl) r=dx ;; sil) r=si ;; dil) r=di ;; esac
        case "$mn" in mov*|lea*) echo "$len 0 $r" ;; *) echo "$len 0 $r,flags" ;; esac ;;
    *) return 1 ;;
    esac
}

UDEFS=()
: >"$WORK/events"
for def in "${DEFS[@]}"; do
    read -r head place args <<<"$def" || true
    [[ $head =~ ^([pr])[0-9]*:([A-Za-z0-9_]+[/.])?([A-Za-z_][A-Za-z0-9_]*)$ ]] || die "needs p:GRP/EVENT or r:GRP/EVENT: $def"
    kind=${BASH_REMATCH[1]}; event=${BASH_REMATCH[3]}
    ret=0; [ "$kind" = r ] && ret=1
    case "$place" in *%return) ret=1; place=${place%%%return} ;; esac
    place=${place%+0}
    mod=""; sym=$place
    case "$place" in *:*) mod=${place%:*}; sym=${place##*:} ;; esac
    obj=$(object_path "$mod") || true
    [ -n "$obj" ] && [ -f "$obj" ] || die "no object for '$mod' in $def"
    if [[ $place == /*:* && $sym =~ ^(0x[0-9a-fA-F]+|[0-9]+)$ ]]; then
        # The uprobe_events form PATH:OFFSET (a function's start): its symbol by address.
        fva=$(vaddr_of "$obj" "$sym")
        [ -n "$fva" ] || die "offset $sym is in no LOAD segment of $obj"
        read -r sym size <<<"$(symbol_at "$obj" "$fva")"
        [ -n "${sym:-}" ] || die "no function starts at offset $sym of $obj"
        vaddr=$fva
    else
        read -r vaddr size <<<"$(symbol_of "$obj" "$sym")"
        [ -n "${vaddr:-}" ] || die "no function $sym in $obj"
    fi
    read -r len delta clobber <<<"$(first_insn "$obj" "$vaddr")" || true
    [ -n "${len:-}" ] || die "$sym: its first instruction ($(objdump -d "$obj" --start-address=0x$vaddr --stop-address=$(printf 0x%x $((0x$vaddr + 8))) | awk -F'\t' '/^ *[0-9a-f]+:\t/ { print $3; exit }')) may change what the arguments read; probe another function"
    [ "$ret" = 1 ] && [ "$delta" != 0 ] && die "$sym: its first instruction moves %rsp: a kernel return probe after it would take the wrong return address"
    [ "$clobber" = - ] && clobber=""
    kaddr=$(printf '%x' $((0x$vaddr + len)))
    # The kernel steps the probed instruction out of line; a system call there (getpid is
    # `mov $0x27,%eax; syscall`) kills the process with SIGSEGV on this kernel, and the
    # probe is armed in every process that maps the file (the script's own shell too).
    kmn=$(objdump -d --no-show-raw-insn "$obj" --start-address=0x$kaddr --stop-address=$(printf 0x%x $((0x$kaddr + 16))) |
        awk -F'\t' '/^ *[0-9a-f]+:\t/ { split($2, w, " "); print w[1]; exit }')
    case "$kmn" in syscall|sysenter|int|int1|int3|into)
        die "$sym: its second instruction, where the kernel's probe would go, is a $kmn, which the kernel's uprobes cannot step out of line (the process dies of SIGSEGV); probe another function" ;;
    esac
    koff=$(file_offset "$obj" "$kaddr")
    [ -n "$koff" ] || die "$sym: no file offset for 0x$kaddr"
    # shellcheck disable=SC2086
    kargs=$(kernel_args $ret "$delta" "$clobber" $args) || die "in $def"
    if [ $ret = 1 ]; then khead="r:$GROUP/$event"; else khead="p:$GROUP/$event"; fi
    kdef="$khead $obj:$koff${kargs:+ $kargs}"
    [ -z "$KSED" ] || kdef=$(sed -e "$KSED" <<<"$kdef")
    udef="${head%%:*}:$GROUP/$event ${def#* }"
    echo "$kdef" >>$TRACEFS/uprobe_events 2>"$WORK/kerr" ||
        die "the kernel refused: $kdef
$(tail -3 $TRACEFS/error_log)"
    KEVENTS+=("$event")
    UDEFS+=(-e "$udef")
    echo "$event $ret $(printf '%x' $((koff))) $size $(aliases_of "$obj" "$vaddr")" >>"$WORK/events"
    echo "ukprobes: $udef" >>"$WORK/definitions"
    echo "kernel:   $kdef" >>"$WORK/definitions"
done
[ $QUIET = 1 ] || cat "$WORK/definitions"

# The kernel's lines count from each program image's __libc_start_main: what a process
# does before it (ukprobe's forked child before its exec, the agent's start-up in every
# image) ukprobes does not trace. sched_process_exec stops a process's lines until its
# __libc_start_main, sched_process_fork gives a child its parent's state.
LIBC=$(object_path libc.so.6)
[ -n "$LIBC" ] || die "$PROG does not use libc.so.6 (the start of recording is its __libc_start_main)"
read -r svaddr _ <<<"$(symbol_of "$LIBC" __libc_start_main)"
read -r slen _ _ <<<"$(first_insn "$LIBC" "$svaddr")" || die "__libc_start_main: unknown first instruction"
echo "p:$GROUP/ukp_cmp_start $LIBC:$(file_offset "$LIBC" "$(printf '%x' $((0x$svaddr + slen)))")" >>$TRACEFS/uprobe_events ||
    die "the kernel refused the __libc_start_main probe"
KEVENTS+=(ukp_cmp_start)

# A tracing instance of our own: the kernel's global trace and other users' events are
# left alone; only this process and its descendants are recorded (set_event_pid).
mkdir "$INST" || die "cannot make $INST"
echo 1 >"$INST/options/event-fork"
echo 0 >"$INST/tracing_on"
echo 4096 >"$INST/buffer_size_kb"
echo 1 >"$INST/events/$GROUP/enable"
echo 1 >"$INST/events/sched/sched_process_exec/enable" && echo 1 >"$INST/events/sched/sched_process_fork/enable" ||
    die "cannot enable the sched_process_exec and sched_process_fork events"
# Not the ukprobe command's threads, nor its forked child before it execs the program:
# ukprobes does not trace them (and the command's writes of the trace text would land in
# the kernel's write events).
for e in "${KEVENTS[@]}"; do
    [ "$e" = ukp_cmp_start ] || echo 'comm != "ukprobe"' >"$INST/events/$GROUP/$e/filter" || die "cannot set a filter on $e"
done
if [ -n "$ATTACH" ]; then
    # Its threads now and those they start; its idle period while both are armed is not
    # recorded by the kernel (tracing_on) and cleared in ukprobes.
    ls /proc/"$ATTACH"/task | tr '\n' ' ' >"$INST/set_event_pid"
    echo none >"$WORK/ukprobe.pid"
    U() { "$UKPROBE" -p "$ATTACH" "$@" >>"$WORK/program.out" 2>&1 || die "ukprobe -p $ATTACH $*: $(tail -5 "$WORK/program.out")"; }
    "$UKPROBE" attach "$ATTACH" >>"$WORK/program.out" 2>&1 || die "ukprobe attach $ATTACH failed: $(tail -3 "$WORK/program.out")"
    ATTACHED=1
    U write kprobes/optimization 0 # a one-byte int3: its jmp must not cover the kernel's
    for ((i = 1; i < ${#UDEFS[@]}; i += 2)); do U add "${UDEFS[i]}"; done
    while read -r e _; do U enable "$GROUP/$e"; done <"$WORK/events"
    U clear
    echo 1 >"$INST/tracing_on"
    sh -c "$WORKLOAD" >>"$WORK/program.out" 2>&1
    status=$?
    echo 0 >"$INST/tracing_on"
    "$UKPROBE" -p "$ATTACH" trace >"$WORK/ukprobes.trace" 2>>"$WORK/program.out"
    echo "# kprobe_profile: process $ATTACH" >>"$WORK/ukprobes.trace"
else
(
    echo "$BASHPID" >"$INST/set_event_pid"
    echo "$BASHPID" >"$WORK/ukprobe.pid"
    echo 1 >"$INST/tracing_on"
    exec env UKP_KPROBES_OPTIMIZATION=0 "$UKPROBE" run "${UDEFS[@]}" -o "$WORK/ukprobes.trace" -- "$@"
) >"$WORK/program.out" 2>&1
status=$?
echo 0 >"$INST/tracing_on"
fi
cat "$INST/trace" >"$WORK/kernel.trace"
[ $QUIET = 1 ] || { echo "program exit status $status; its output:"; sed 's/^/  | /' "$WORK/program.out"; }

# The processes ukprobe ran (kprobe_profile headers): the kernel's lines of any other
# (the ukprobe command itself) are left out.
# (Not anchored: a program's last line without a newline runs into it.)
grep -aho '# kprobe_profile: process [0-9]*' "$WORK/ukprobes.trace" "$WORK/program.out" 2>/dev/null |
    awk '{ print $4 }' | sort -u >"$WORK/pids"
[ -s "$WORK/pids" ] || { echo "compare-kernel: ukprobe run printed no kprobe_profile:" >&2; head -20 "$WORK/program.out" >&2; exit 1; }

# One trace line -> "TID EVENT CHECK FIELDS", CHECK naming a header that does not match
# the definition (kernel: the address is the probe's file offset in some mapping;
# ukprobes: the symbol and size of the probed function, +0x0 for a probe).
normalise() { # TRACER FILE
    awk -v tracer="$1" -v evfile="$WORK/events" -v attached="${ATTACH:+1}" '
    function hex(s,   i, c, v) { v = 0; s = tolower(s); sub(/^0x/, "", s)
        for (i = 1; i <= length(s); ++i) { c = index("0123456789abcdef", substr(s, i, 1)); if (!c) return -1; v = v * 16 + c - 1 }
        return v }
    BEGIN {
        while ((getline l < evfile) > 0) {
            n = split(l, f, " "); ev = f[1]; isret[ev] = f[2] + 0; koff[ev] = hex(f[3])
            size[ev] = hex(f[4]); for (i = 5; i <= n; ++i) alias[ev, f[i]] = 1
        }
    }
    /^#/ { next }
    # Which threads are past their image s __libc_start_main (kernel only).
    / sched_process_exec: / { for (i = 1; i <= NF; ++i) if ($i ~ /^pid=/) { t = $i; sub(/^pid=/, "", t); live[t] = 0 } next }
    / sched_process_fork: / {
        p = ""; c = ""
        for (i = 1; i <= NF; ++i) { if ($i ~ /^pid=/) { p = $i; sub(/^pid=/, "", p) } if ($i ~ /^child_pid=/) { c = $i; sub(/^child_pid=/, "", c) } }
        live[c] = live[p] + 0; next
    }
    / ukp_cmp_start: \(/ { t = $0; sub(/ +\[[0-9]+\] .*/, "", t); sub(/.*-/, "", t); live[t] = 1; next }
    # "TASK-TID [CPU] FLAGS SECS.USECS: EVENT: (HEADER) FIELDS"
    / +\[[0-9]+\] [^ ]+ +[0-9]+\.[0-9]+: [A-Za-z_][A-Za-z0-9_]*: \(/ {
        line = $0
        i = match(line, / +\[[0-9]+\] /); task = substr(line, 1, i - 1); sub(/^ +/, "", task)
        tid = task; sub(/.*-/, "", tid); comm = task; sub(/-[0-9]+$/, "", comm)
        rest = substr(line, i + RLENGTH); sub(/^[^ ]+ +[0-9]+\.[0-9]+: /, "", rest)
        ev = rest; sub(/:.*/, "", ev); rest = substr(rest, length(ev) + 4)
        j = index(rest, ")"); hdr = substr(rest, 1, j - 1); rest = substr(rest, j + 1); sub(/^ /, "", rest)
        if (!(ev in isret)) next
        if (tracer == "kernel" && (comm ~ /^ukp-/ || !(live[tid] || attached))) next  # the agent s threads, start-up
        ok = 1; n = split(hdr, h, " ")
        if (tracer == "kernel") {
            a = isret[ev] ? h[3] : h[1]
            if ((isret[ev] && (n != 3 || h[2] != "<-")) || (!isret[ev] && n != 1) || a !~ /^0x[0-9a-f]+$/) ok = 0
            else { d = hex(a) - koff[ev]; if (d % 4096 != 0) ok = 0 }
        } else if (isret[ev]) {
            # The caller: SYM+0xOFF/0xSIZE, or its address where no symbol covers it.
            if (n != 3 || h[2] != "<-" || (h[1] !~ /\+0x[0-9a-f]+\/0x[0-9a-f]+$/ && h[1] !~ /^0x[0-9a-f]+$/) || !((ev, h[3]) in alias)) ok = 0
        } else {
            s = h[1]; k = index(s, "+0x0/0x")
            if (n != 1 || k == 0 || !((ev, substr(s, 1, k - 1)) in alias) || hex(substr(s, k + 7)) != size[ev]) ok = 0
        }
        print tid, ev, (ok ? "ok" : "BAD-HEADER(" hdr ")"), rest
    }' "$2"
}
normalise ukprobes "$WORK/ukprobes.trace" >"$WORK/ukprobes.raw"
# The kernel's lines of the ukprobe command itself (set_event_pid includes it) are left out.
normalise kernel "$WORK/kernel.trace" >"$WORK/kernel.all"
awk -v u="$(cat "$WORK/ukprobe.pid")" '$1 != u' "$WORK/kernel.all" >"$WORK/kernel.raw"
sort -s -k1,1n -k2,2 "$WORK/ukprobes.raw" >"$WORK/ukprobes.norm"
sort -s -k1,1n -k2,2 "$WORK/kernel.raw" >"$WORK/kernel.norm"

fail=0
if [ ! -s "$WORK/ukprobes.norm" ]; then echo "compare-kernel: no events at all" >&2; fail=1; fi
if grep -q BAD-HEADER "$WORK/ukprobes.norm" "$WORK/kernel.norm"; then
    echo "compare-kernel: probe address part not the probed function:"; grep -h BAD-HEADER "$WORK/ukprobes.norm" "$WORK/kernel.norm" | head -5; fail=1
fi
if ! diff -a -u --label kernel --label ukprobes "$WORK/kernel.norm" "$WORK/ukprobes.norm" >"$WORK/diff"; then
    echo "compare-kernel: DIFFERENT (kernel lines -, ukprobes lines +; TID EVENT HEADER FIELDS):"
    head -40 "$WORK/diff"
    fail=1
fi
# Per event: hits in each tracer, fields compared.
awk '{ t = FILENAME ~ /kernel/ ? 1 : 2; c[$2, t]++; if (t == 2) nf[$2] += NF - 3; ev[$2] = 1 }
    END { for (e in ev) printf "  %-20s kernel %5d  ukprobes %5d  fields %6d\n", e, c[e, 1], c[e, 2], nf[e] + 0 }' \
    "$WORK/kernel.norm" "$WORK/ukprobes.norm" | sort >"$WORK/summary"
if [ $QUIET = 0 ] || [ $fail = 1 ]; then echo "events (hits per tracer, field values compared):"; cat "$WORK/summary"; fi
if [ $fail = 0 ]; then
    echo "compare-kernel: SAME ($(wc -l <"$WORK/ukprobes.norm") events, $(awk '{ n += NF - 3 } END { print n + 0 }' "$WORK/ukprobes.norm") fields)"
fi
exit $fail

#!/usr/bin/env bash
# Jump-path coverage of libc weighted by the calls a real program makes: an event on
# every function entry of libc.so.6 (3,705 on Debian 12), added to a running program
# (ukprobe attach), enabled for SECONDS, then counted. Prints the entries hit, the calls
# counted, and the share of the calls that went through a jump (kprobes/list shows
# [OPTIMIZED]) rather than a breakpoint, with the breakpoint entries that were called,
# most called first. Everything is removed at the end (a session).
#
#   scripts/call-coverage.sh SECONDS PID            a program already running
#   scripts/call-coverage.sh SECONDS -- CMD ARGS    CMD started here (it must run longer
#                                                   than SECONDS + the jumps' placing, a few
#                                                   seconds; it is killed after)
set -euo pipefail
cd "$(dirname "$0")/.."
UKPROBE=$PWD/build/tools/ukprobe/ukprobe
COVERAGE=$PWD/build/tools/ukp-coverage
LIBC=$(readlink -f /lib/x86_64-linux-gnu/libc.so.6)
[ -x "$UKPROBE" ] && [ -x "$COVERAGE" ] || { echo "call-coverage: build first (scripts/build.sh)" >&2; exit 1; }
[ $# -ge 2 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
SECS=$1
shift
WORK=$(mktemp -d /tmp/ukp-call-coverage.XXXXXX)
STARTED=""
cleanup() {
    [ -n "$STARTED" ] && kill "$STARTED" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
[ -n "${KEEP:-}" ] && trap - EXIT
if [ "$1" = -- ]; then
    shift
    "$@" >"$WORK/program.out" 2>&1 &
    STARTED=$!
    PID=$STARTED
    sleep 1
else
    PID=$1
fi
# Each entry: its event, named by its address (names repeat: local symbols).
"$COVERAGE" --entries-only --list --list-all "$LIBC" | sed -n '/^  entries:$/,$p' | tail -n +2 |
    awk '{ print $1, $2 }' >"$WORK/entries"
awk -v lib="$LIBC" '{ printf "append kprobe_events p:cov/e_%s %s:%s\n", substr($1, 3), lib, $1 }' \
    "$WORK/entries" >"$WORK/commands"
"$UKPROBE" attach "$PID" >/dev/null
{
    cat "$WORK/commands"
    echo "write events/cov/enable 1"
    # The session registers them (a few ms each), then the optimizer places the jumps:
    # until every probe is listed and the count of jumps stays the same for 2 s.
    last=-1 same=0 now=0
    for _ in $(seq 300); do
        sleep 1
        "$UKPROBE" -p "$PID" read kprobes/list >"$WORK/list" 2>/dev/null || continue
        [ "$(wc -l <"$WORK/list")" -ge $(($(wc -l <"$WORK/entries") - 20)) ] || continue
        now=$(grep -c OPTIMIZED "$WORK/list" || true)
        if [ "$now" = "$last" ]; then same=$((same + 1)); else same=0; fi
        [ $same -ge 2 ] && break
        last=$now
    done
    echo "jumps placed: $now" >&2
    # The counts now and SECONDS later, every probe in place (disabling an event takes its
    # jumps away): the calls are the difference.
    echo "read kprobe_profile"
    sleep "$SECS"
    echo "read kprobe_profile"
    echo "read kprobes/list"
    echo "write events/cov/enable 0"
} | "$UKPROBE" -p "$PID" session >"$WORK/session.out" 2>"$WORK/session.err" || true
grep -v '^$' "$WORK/session.err" | sort | uniq -c | sort -rn | head -5 >&2 || true
# kprobe_profile twice (once the jumps are placed, after SECONDS): the difference is the
# calls counted while every jump was in place.
# Where libc is mapped in the process: its lowest mapping (offset 0) is its load bias.
BIAS=$(awk -v lib="$LIBC" '$6 == lib && $3 == "00000000" { split($1, r, "-"); print r[1]; exit }' "/proc/$PID/maps")
/usr/bin/python3 - "$WORK/entries" "$WORK/session.out" "$SECS" "$BIAS" <<'PY'
import re, sys
entries = {}
for line in open(sys.argv[1]):
    addr, name = line.split()
    entries["e_" + addr[2:]] = (int(addr, 16), name)
text = open(sys.argv[2]).read()
counts = []
cur = {}
for line in text.splitlines():
    m = re.match(r"^  (e_[0-9a-f]+)\s+(\d+)\s+(\d+)$", line)
    if not m:
        continue
    if m.group(1) in cur:
        counts.append(cur)
        cur = {}
    cur[m.group(1)] = int(m.group(2))
counts.append(cur)
if len(counts) < 2:
    sys.exit("call-coverage: no kprobe_profile read (see the session's errors above)")
before, after = counts[0], counts[-1]
# kprobes/list: "ADDR  k  SYM+OFF  MOD [FLAGS]", ADDR in the process: less the bias, the
# entry's address in the file.
bias = int(sys.argv[4], 16)
listed = [l for l in text.splitlines() if re.match(r"^[0-9a-f]{8,16}\s+k\s", l)]
optimized = {}
for l in listed:
    ev = "e_%x" % (int(l.split()[0], 16) - bias)
    if ev in entries:
        optimized[ev] = "[OPTIMIZED]" in l
calls = {ev: after.get(ev, 0) - before.get(ev, 0) for ev in entries}
total = sum(c for c in calls.values() if c > 0)
hit = [ev for ev, c in calls.items() if c > 0]
on_jumps = sum(calls[ev] for ev in hit if optimized.get(ev))
print(f"entries: {len(entries)}, probes listed {len(listed)}, optimized {sum(optimized.values())}")
print(f"entries called in {sys.argv[3]} s: {len(hit)}; calls counted: {total}")
if total:
    print(f"calls through a jump: {on_jumps} = {100.0 * on_jumps / total:.2f} %")
    print("breakpoint entries called, most called first:")
    for ev in sorted((e for e in hit if not optimized.get(e)), key=lambda e: -calls[e])[:15]:
        print(f"  {calls[ev]:>10}  {entries[ev][1]} ({entries[ev][0]:#x})")
PY

#!/usr/bin/env bash
# A server under its own benchmark client, traced five ways, alternated in one run:
# PostgreSQL 15 (Debian's postgresql package) serving pgbench's select-only load, with
# three events on functions it runs for every query (PortalRun, pq_getmessage,
# ExecutorStart), from its start to its clean shutdown (pg_ctl stop -m fast).
#
#   plain    the server alone
#   agent    libukprobes.so preloaded with the three events (UKP_EVENTS): recorded in
#            the rings, nobody reads them
#   run      ukprobe run -o FILE with the three events: every hit is a line or LOST
#   record   ukprobe record -o FILE with the three events: every hit is a record or LOST
#            (counted with ukprobe report, after the round)
#   kernel   the kernel's uprobe tracer on the same functions (perf probe -x), its
#            trace_pipe copied to a file by cat (root, tracefs)
#
# Prints, per mode, the best transactions/s of the rounds and its ratio to plain, and for
# the tracing modes the hits, the lines written and the events lost. Root (the server runs
# as nobody; the kernel's tracer needs root).
#
#   scripts/server-bench.sh [ROUNDS] [SECONDS]      (defaults: 3 rounds of 5 s a mode)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECONDS_PER_RUN=${2:-5}
PGBIN=/usr/lib/postgresql/15/bin
UKPROBE=$PWD/build/tools/ukprobe/ukprobe
AGENT=$PWD/build/src/libukprobes.so
[ "$(id -u)" = 0 ] || { echo "server-bench: run as root (the server runs as nobody)" >&2; exit 1; }
[ -x "$PGBIN/postgres" ] || { echo "server-bench: $PGBIN/postgres missing: scripts/install-deps.sh" >&2; exit 1; }
[ -x "$UKPROBE" ] || { echo "server-bench: build first (scripts/build.sh)" >&2; exit 1; }

FUNCS=(PortalRun pq_getmessage ExecutorStart)
DEFS=()
for f in "${FUNCS[@]}"; do DEFS+=("p:pg/$f $PGBIN/postgres:$f"); done
STARTUP=$(IFS=';'; echo "${DEFS[*]}" | sed 's/ /,/g')

WORK=$(mktemp -d /tmp/ukp-server-bench.XXXXXX)
chmod 755 "$WORK"
chown nobody "$WORK"
TRACEFS=/sys/kernel/tracing
cleanup() {
    setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups "$PGBIN/pg_ctl" stop -D "$WORK/pg" -m immediate \
        >/dev/null 2>&1 || true
    if [ -d "$TRACEFS/events/probe_postgres" ]; then
        echo 0 >"$TRACEFS/events/probe_postgres/enable" 2>/dev/null || true
        perf probe -q -d 'probe_postgres:*' >/dev/null 2>&1 || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

as_nobody() { setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups "$@"; }
as_nobody "$PGBIN/initdb" -D "$WORK/pg" -U postgres -A trust --no-sync >"$WORK/initdb.out" 2>&1 ||
    { cat "$WORK/initdb.out" >&2; exit 1; }
mountpoint -q "$TRACEFS" || mount -t tracefs nodev "$TRACEFS"

# One round of MODE: starts the server, loads pgbench's tables once, runs the clients,
# stops the server; prints "MODE TPS HITS LINES LOST".
round() {
    local mode=$1 pid tps hits=0 lines=0 lost=0 cat_pid=""
    rm -f "$WORK/trace" "$WORK/trace.dat" "$WORK/server.out"
    case $mode in
    plain) as_nobody "$PGBIN/postgres" -D "$WORK/pg" -k "$WORK/pg" >"$WORK/server.out" 2>&1 & ;;
    agent) as_nobody env LD_PRELOAD="$AGENT" UKP_EVENTS="$STARTUP" \
        "$PGBIN/postgres" -D "$WORK/pg" -k "$WORK/pg" >"$WORK/server.out" 2>&1 & ;;
    run | record)
        # run writes the lines, record the capture (printed by report after the round).
        local file="$WORK/trace" args=()
        [ "$mode" = record ] && file="$WORK/trace.dat"
        touch "$file" && chown nobody "$file"
        for d in "${DEFS[@]}"; do args+=(-e "$d"); done
        as_nobody "$UKPROBE" --agent "$AGENT" "$mode" -o "$file" "${args[@]}" -- \
            "$PGBIN/postgres" -D "$WORK/pg" -k "$WORK/pg" >"$WORK/server.out" 2>&1 &
        ;;
    kernel)
        echo >"$TRACEFS/trace"
        for f in "${FUNCS[@]}"; do perf probe -q -x "$PGBIN/postgres" -a "$f" >/dev/null 2>&1; done
        echo 1 >"$TRACEFS/events/probe_postgres/enable"
        cat "$TRACEFS/trace_pipe" >"$WORK/trace" &
        cat_pid=$!
        as_nobody "$PGBIN/postgres" -D "$WORK/pg" -k "$WORK/pg" >"$WORK/server.out" 2>&1 &
        ;;
    esac
    pid=$!
    until "$PGBIN/pg_isready" -q -h "$WORK/pg" -U postgres; do sleep 0.05; done
    [ -f "$WORK/loaded" ] || { "$PGBIN/pgbench" -h "$WORK/pg" -U postgres -i -q -s 2 postgres >/dev/null 2>&1 && touch "$WORK/loaded"; }
    tps=$("$PGBIN/pgbench" -h "$WORK/pg" -U postgres -S -c 2 -j 2 -T "$SECONDS_PER_RUN" postgres 2>/dev/null |
        sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -1)
    as_nobody "$PGBIN/pg_ctl" stop -D "$WORK/pg" -m fast -w >/dev/null 2>&1
    wait "$pid" || true
    case $mode in
    run | record)
        hits=$(awk '/^# kprobe_profile: process / { p = 1; next } /^#/ { p = 0 } p { n += $2 } END { print n + 0 }' "$WORK/server.out")
        [ "$mode" = record ] && "$UKPROBE" report -o "$WORK/trace" "$WORK/trace.dat"
        lines=$(grep -c -E ': (PortalRun|pq_getmessage|ExecutorStart): ' "$WORK/trace" || true)
        lost=$(sed -n 's/^# lost: \([0-9]*\) events.*/\1/p' "$WORK/server.out")
        ;;
    kernel)
        echo 0 >"$TRACEFS/events/probe_postgres/enable"
        sleep 0.5
        kill "$cat_pid" 2>/dev/null || true
        wait "$cat_pid" 2>/dev/null || true
        hits=$(awk '{ n += $3 } END { print n + 0 }' "$TRACEFS/uprobe_profile")
        lines=$(grep -c -E ': (PortalRun|pq_getmessage|ExecutorStart): ' "$WORK/trace" || true)
        lost=$((hits - lines))
        perf probe -q -d 'probe_postgres:*' >/dev/null 2>&1
        ;;
    esac
    echo "$mode ${tps:-0} $hits $lines ${lost:-0}"
}

MODES=(plain agent run record kernel)
results=()
for r in $(seq "$ROUNDS"); do
    # Alternated, each round in another order: the machine's noise falls on every mode.
    order=("${MODES[@]:$((r % ${#MODES[@]}))}" "${MODES[@]:0:$((r % ${#MODES[@]}))}")
    for m in "${order[@]}"; do
        line=$(round "$m")
        echo "round $r: $line" >&2
        results+=("$line")
    done
done

best() { printf '%s\n' "${results[@]}" | awk -v m="$1" '$1 == m && $2 > best { best = $2; l = $0 } END { print l }'; }
plain_tps=$(best plain | awk '{ print $2 }')
printf '%-8s %12s %8s %12s %12s %12s\n' mode "tps (best)" "x plain" hits lines lost
for m in "${MODES[@]}"; do
    read -r _ tps hits lines lost <<<"$(best "$m")"
    ratio=$(awk -v a="$tps" -v b="$plain_tps" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
    tps=$(awk -v a="$tps" 'BEGIN { printf "%.0f", a }')
    if [ "$m" = plain ] || [ "$m" = agent ]; then hits=-; lines=-; lost=-; fi
    printf '%-8s %12s %8s %12s %12s %12s\n' "$m" "$tps" "$ratio" "$hits" "$lines" "$lost"
done

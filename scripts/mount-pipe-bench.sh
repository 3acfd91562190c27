#!/usr/bin/env bash
# trace_pipe through `ukprobe mount` (FUSE), the whole path: bench/pipeline_target makes
# 1,000,000 calls of its probed function (the agent preloaded, the event given by
# UKP_EVENTS, a 256 MiB buffer), a `cat DIR/trace_pipe > FILE` reads them; timed from the
# program's go to cat's end of file (the program gone, its ring read to the end, the file
# system about to unmount). Prints lines/s for each of ROUNDS rounds (default 5).
# Needs the build (scripts/build.sh), /dev/fuse, and root or fusermount3.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
U=$B/tools/ukprobe/ukprobe T=$B/bench/ukp_pipeline_target A=$B/src/libukprobes.so
N=1000000
work=$(mktemp -d /tmp/ukp-mount-bench-XXXXXX)
M=$work/mnt
mkdir "$M"
trap 'umount -l "$M" 2>/dev/null; rm -rf "$work"' EXIT
for r in $(seq "${1:-5}"); do
    env LD_PRELOAD="$A" UKP_CONTROL=1 UKP_BUFFER_SIZE_KB=262144 "UKP_EVENTS=p:pb/w,$T:pipeline_work,i=%di:u64" \
        "$T" wait-calls $N >"$work/target.out" &
    pid=$!
    until grep -q ready "$work/target.out" 2>/dev/null; do sleep 0.01; done
    "$U" -p $pid mount "$M" >/dev/null
    cat "$M/trace_pipe" >"$work/lines" &
    reader=$!
    sleep 0.5 # the reader's first read waits on the ring
    start=$(date +%s%N)
    kill -USR1 $pid
    wait $reader
    end=$(date +%s%N)
    wait $pid
    n=$(wc -l <"$work/lines")
    echo "round $r: $n of $N lines in $(((end - start) / 1000000)) ms: $((n * 1000000000 / (end - start))) lines/s"
    while mountpoint -q "$M"; do sleep 0.05; done
done

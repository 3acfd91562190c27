#!/usr/bin/env bash
# Runs the whole compatibility suite (tests/compat: real programs plain, with the agent
# preloaded, under `ukprobe run` and attached), the long mode included (COMPAT_LONG=1), and
# prints one table: program x mode -> PASS / FAIL / SKIP with a short reason.
#   scripts/compat.sh                 # everything (about 15 minutes on 2 cores)
#   scripts/compat.sh 'e2e_pg*'       # a gtest filter
#   COMPAT_LONG= scripts/compat.sh    # the short mode only (what ctest runs)
# Needs the build (scripts/build.sh) and the packages of scripts/install-deps.sh; as root
# (PostgreSQL runs as nobody).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export COMPAT_LONG=${COMPAT_LONG-1}
[ -d "$BUILD" ] || { echo "compat: no $BUILD: run scripts/build.sh first" >&2; exit 2; }
cmake --build "$BUILD" --target compat_test >/dev/null || exit 2
log=$(mktemp /tmp/ukp-compat-XXXXXX.log)
"$BUILD/tests/compat/compat_test" --gtest_filter="${1:-*}" >"$log" 2>&1
status=$?
echo "full output: $log"
echo
# One row per record: its name is PROGRAM_MODE.
awk '
    function reason_of(s) { gsub(/^[ \t]+|[ \t]+$/, "", s); return length(s) > 90 ? substr(s, 1, 87) "..." : s }
    /^\[ RUN      \] / { name = $4; why = ""; events = ""; next }
    /^(no output line is|no output line matches|the script.s exit status|the script was to fail): / && why == "" { why = $0 }
    /^events: inconsistent/ && events == "" { events = $0 }
    /^\[timed out after/ { why = $0 }
    /^\[  SKIPPED \] / && $4 == name { res = "SKIP"; why = "REQUIRES not met" }
    /^\[       OK \] / && $4 == name { res = "PASS"; why = "" }
    /^\[  FAILED  \] / && $4 == name && $5 ~ /^\(/ { res = "FAIL"; if (events != "") why = events "; " why }
    (/^\[  SKIPPED \] / || /^\[       OK \] / || (/^\[  FAILED  \] / && $5 ~ /^\(/)) && $4 == name {
        split(name, s, "."); rec = s[2]; prog = rec; sub(/_.*/, "", prog); mode = rec; sub(/^[^_]*_/, "", mode)
        printf "%-10s %-18s %-5s %s\n", prog, mode, res, reason_of(why)
        name = ""
    }' "$log" | { printf "%-10s %-18s %-5s %s\n" PROGRAM MODE RESULT REASON; cat; }
echo
grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]+ test|^\[  SKIPPED \] [0-9]+ test' "$log"
exit $status

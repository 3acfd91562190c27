#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ with clang (in build-fuzz/, apart from the
# GCC build) and runs each for a bounded time, starting from its corpus in
# tests/fuzz/corpus/<target>/. UKP_FUZZ_SECONDS (default 30) is the time per target.
# Inputs that crash or show a mismatch are kept in build-fuzz/artifacts/. New corpus
# entries go to a scratch directory: the repository's corpus only changes by hand.
# Also checks that relocate_fuzz's hand-made inputs catch a relocator that copies bytes verbatim.
# Exits non-zero if any target failed; the last line is "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${UKP_FUZZ_SECONDS:-30}
build=build-fuzz

targets=()
for f in tests/fuzz/*_fuzz.cpp; do
  targets+=("$(basename "$f" .cpp)")
done

if ! CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DUKP_WERROR=ON -DUKP_FUZZ=ON -DUKP_TESTS=OFF -DUKP_BENCH=OFF >/dev/null; then
  echo "fuzz: cmake failed"
  echo "0 passed, ${#targets[@]} failed"
  exit 1
fi

artifacts=$build/artifacts
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$artifacts"
passed=0
failed=0

# run NAME LOG CMD...: counts the target as passed when CMD succeeds.
run() {
  local name=$1 log=$2
  shift 2
  if "$@" >"$log" 2>&1; then
    echo "fuzz: $name: ok ($(grep -Eo '^Done [0-9]+ runs' "$log" | tail -1 | cut -d' ' -f2) inputs run)"
    passed=$((passed + 1))
  else
    echo "fuzz: $name: FAILED (log: $log)"
    grep -E 'relocate_fuzz:|_fuzz: |ERROR|SUMMARY|Test unit written' "$log" | head -20
    failed=$((failed + 1))
  fi
}

for t in "${targets[@]}"; do
  # Each target builds on its own: one that does not compile fails alone.
  if ! nice -n 10 cmake --build "$build" --target "$t" >"$artifacts/$t.build.log" 2>&1; then
    echo "fuzz: $t: FAILED to build (log: $artifacts/$t.build.log)"
    grep -E 'error' "$artifacts/$t.build.log" | head -5
    failed=$((failed + 1))
    continue
  fi
  corpus=tests/fuzz/corpus/$t
  mkdir -p "$corpus" "$scratch/$t"
  run "$t" "$artifacts/$t.log" nice -n 10 "$build/tests/fuzz/$t" \
    -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/$t-" "$scratch/$t" "$corpus"
done

# The relocator fuzzer must be able to fail: with relocate() replaced by a verbatim copy,
# its hand-made inputs (RIP-relative operands, branches) must show a mismatch.
log=$artifacts/relocate_fuzz-naive.log
if UKP_RELOCATE_FUZZ_NAIVE=1 nice -n 10 "$build/tests/fuzz/relocate_fuzz" -runs=0 \
    -artifact_prefix="$scratch/naive-" tests/fuzz/corpus/relocate_fuzz >"$log" 2>&1; then
  echo "fuzz: relocate_fuzz (naive relocator): FAILED: no mismatch found (log: $log)"
  failed=$((failed + 1))
elif grep -q '^relocate_fuzz: .*; instruction:' "$log"; then
  echo "fuzz: relocate_fuzz (naive relocator): ok (caught: $(grep -m1 '^relocate_fuzz: .*; instruction:' "$log"))"
  passed=$((passed + 1))
else
  echo "fuzz: relocate_fuzz (naive relocator): FAILED: ended without a mismatch report (log: $log)"
  failed=$((failed + 1))
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite: once as built for
# users, then again under AddressSanitizer + UndefinedBehaviorSanitizer, then the
# libFuzzer targets (relocator, region analysis, unwind tables, the tracer's parsers).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"

echo
echo "== the unit tests under AddressSanitizer + UndefinedBehaviorSanitizer"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DUKP_WERROR=ON \
  -DUKP_SANITIZE=address,undefined -DUKP_BENCH=OFF >/dev/null
cmake --build build-asan
# The stress test's 8 x 1M calls would take minutes under the sanitizers.
UKP_STRESS_CALLS=100000 ctest --test-dir build-asan --output-on-failure -j "$(nproc)"

echo
echo "== the libFuzzer targets, each for a bounded time (UKP_FUZZ_SECONDS, default 30)"
scripts/fuzz.sh

#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs the seeds' kprobe_example
# (ported to user space) against the bundled sample program.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
echo
# The agent is preloaded first, so that it comes before libc and can interpose
# sigaction(); the example "module" follows it, as insmod would load it.
echo "== LD_PRELOAD='libukprobes.so kprobe_example.so' sample_target"
LD_PRELOAD="$PWD/build/src/libukprobes.so $PWD/build/examples/kprobe_example.so" build/examples/sample_target

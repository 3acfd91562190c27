#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs the kprobe, kretprobe and
# jprobe examples of the kernel's kprobes.txt and its data_breakpoint sample (ported to
# user space) against the bundled sample program, then
# traces it with `ukprobe run` and kprobe_events definitions, and prints the trace.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
echo
# The agent is preloaded first, so that it comes before libc and can interpose
# sigaction(); each example "module" follows it, as insmod would load it.
for example in kprobe_example kretprobe_example jprobe_example data_breakpoint; do
  echo
  echo "== LD_PRELOAD='libukprobes.so $example.so' sample_target"
  LD_PRELOAD="$PWD/build/src/libukprobes.so $PWD/build/examples/$example.so" build/examples/sample_target 2>&1
done

# The event tracer from outside the program: ukprobe run starts it with the agent and the
# definitions active before main, streams the trace until it exits, then prints
# kprobe_profile (on stderr).
echo
echo
set -x
build/tools/ukprobe/ukprobe run \
  -e 'p:req handle_request id=%di:s32 path=+0(%si):string' \
  -e 'r:req_ret handle_request ret=$retval:s32' \
  -- build/examples/sample_target 2>&1

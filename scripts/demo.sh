#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs the seeds' kprobe, kretprobe
# and jprobe examples (ported to user space) against the bundled sample program, then
# traces it with kprobe_events definitions given at start-up, and prints the trace.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
echo
# The agent is preloaded first, so that it comes before libc and can interpose
# sigaction(); each example "module" follows it, as insmod would load it.
for example in kprobe_example kretprobe_example jprobe_example; do
  echo
  echo "== LD_PRELOAD='libukprobes.so $example.so' sample_target"
  LD_PRELOAD="$PWD/build/src/libukprobes.so $PWD/build/examples/$example.so" build/examples/sample_target 2>&1
done

# The event tracer: definitions in the kernel's kprobe_event= boot-parameter form, applied
# and enabled before main; trace_dump prints kprobe_events, trace and kprobe_profile at exit.
events='p:req,handle_request,id=%di:s32,path=+0(%si):string;r:req_ret,handle_request,ret=$retval:s32'
echo
echo
echo "== UKP_EVENTS='$events' LD_PRELOAD='libukprobes.so trace_dump.so' sample_target"
UKP_EVENTS="$events" LD_PRELOAD="$PWD/build/src/libukprobes.so $PWD/build/examples/trace_dump.so" \
  build/examples/sample_target 2>&1

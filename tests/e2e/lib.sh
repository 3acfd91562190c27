# Sourced by the end-to-end runner before each record's RUN (POSIX sh).
# Given: $UKPROBE (the CLI), $TARGETS (the target programs), $E2E_TMP (this test's
# scratch directory). Every target started with `start` is checked afterwards by the
# runner: `ukprobe verify` must find its code identical to its files.

# start [ENV=VALUE...] [--as USER] NAME ARGS...: runs $TARGETS/NAME in the background,
# waits until it prints "ready", and sets $PID. Its output goes to $E2E_TMP/out.$PID.
start() {
    _as=""
    _env=""
    while :; do
        case "$1" in
        --as) _as="$2"; shift 2 ;;
        *=*) _env="$_env $1"; shift ;;
        *) break ;;
        esac
    done
    _name="$1"; shift
    _out="$E2E_TMP/out.$$.$(date +%s%N)"
    if [ -n "$_as" ]; then
        env $_env setpriv --reuid="$_as" --regid="$(id -g "$_as")" --clear-groups "$TARGETS/$_name" "$@" >"$_out" 2>&1 &
    else
        env $_env "$TARGETS/$_name" "$@" >"$_out" 2>&1 &
    fi
    PID=$!
    echo "$PID" >>"$E2E_TMP/pids"
    _i=0
    until grep -q '^ready' "$_out" 2>/dev/null; do
        _i=$((_i + 1))
        if [ $_i -gt 500 ]; then echo "target $_name did not start" >&2; cat "$_out" >&2; return 1; fi
        sleep 0.01
    done
    mv "$_out" "$E2E_TMP/out.$PID"
}

# output [PID]: what the target printed so far (the "ready" line left out).
output() { grep -v '^ready' "$E2E_TMP/out.${1:-$PID}"; }

# finish [PID]: waits for the target to exit and prints "exit STATUS".
finish() {
    wait "${1:-$PID}"
    echo "exit $?"
}

# every_file: goes through every file of the tracing directory with the functions the
# record defines, R PATH (read), W PATH TEXT (echo TEXT > PATH) and A PATH TEXT (echo TEXT
# >> PATH), on a target e2e_probed, and prints what a reader would check of each.
every_file() {
    A kprobe_events 'p:e2e/work e2e_work x=%di:s32' || return 1
    A dynamic_events 'r:e2e/done e2e_work v=$retval:s32' || return 1
    echo "kprobe_events: $(R kprobe_events | tr '\n' ';')"
    echo "dynamic_events: $(R dynamic_events | tr '\n' ';')"
    echo "available_events: $(R available_events | tr '\n' ' ')"
    echo "id: $(R events/e2e/work/id | sed 's/^[0-9][0-9]*$/NUMBER/')"
    echo "format: $(R events/e2e/work/format | grep -c -F 'field:s32 x;')"
    W events/e2e/work/filter 'x < 500' || return 1
    echo "filter: $(R events/e2e/work/filter)"
    W events/e2e/work/trigger 'hist:keys=x:vals=hitcount' || return 1
    echo "trigger: $(R events/e2e/work/trigger | sed 's/ *$//')"
    W buffer_size_kb 64 || return 1
    echo "buffer_size_kb: $(R buffer_size_kb)"
    W tracing_on 0 || return 1
    echo "tracing_on: $(R tracing_on)"
    W tracing_on 1 || return 1
    W events/e2e/work/enable 1 || return 1
    W events/e2e/done/enable 1 || return 1
    echo "enable: $(R events/e2e/work/enable) $(R events/e2e/enable) $(R events/enable)"
    sleep 0.3
    W events/enable 0 || return 1
    echo "enable after events/enable 0: $(R events/e2e/work/enable) $(R events/e2e/done/enable)"
    R trace > $E2E_TMP/every.trace
    echo "trace: work $(grep -c ' work: ' $E2E_TMP/every.trace | sed 's/^[1-9][0-9]*$/some/'), x >= 500 $(grep ' work: ' $E2E_TMP/every.trace | sed 's/.*x=//' | awk '$1 >= 500' | wc -l), done $(grep -c ' done: ' $E2E_TMP/every.trace | sed 's/^[1-9][0-9]*$/some/')"
    R events/e2e/work/hist > $E2E_TMP/every.hist
    echo "hist: $(grep -c '^{ x: ' $E2E_TMP/every.hist | sed 's/^[1-9][0-9]*$/keys/'), $(grep -o '^ *Hits: [0-9]*' $E2E_TMP/every.hist | sed 's/[0-9][0-9]*$/N/')"
    echo "kprobe_profile: $(R kprobe_profile | awk '{ print $1, ($2 > 0 ? "hits" : "none"), $3 }' | tr '\n' ';')"
    W snapshot 1 || return 1
    echo "snapshot: $(R snapshot | grep -c ' work: ' | sed 's/^[1-9][0-9]*$/some/')"
    W snapshot 0 || return 1
    W trace '' || return 1
    echo "trace after clearing: $(R trace | grep -c ' work: ')"
    A kprobe_events 'p:e2e/bad no_such_function_here' 2>/dev/null && return 1
    echo "error_log: $(R error_log | grep -c 'Invalid probed address or symbol')"
    W error_log '' || return 1
    echo "error_log after clearing: $(R error_log | wc -l)"
    echo "kprobes/list: $(R kprobes/list | grep -c 'e2e_work')"
    W kprobes/enabled 0 || return 1
    echo "kprobes/enabled: $(R kprobes/enabled)"
    W kprobes/enabled 1 || return 1
    W kprobes/optimization 0 || return 1
    echo "kprobes/optimization: $(R kprobes/optimization) $(R kprobes/list | grep -c OPTIMIZED)"
    W kprobes/optimization 1 || return 1
    echo "kprobes/optimization: $(R kprobes/optimization)"
    A kprobe_events '-:e2e/done' || return 1
    W events/e2e/work/trigger '!hist:keys=x:vals=hitcount' || return 1
    A kprobe_events '-:e2e/work' || return 1
    echo "kprobe_events at the end: [$(R kprobe_events)]"
}

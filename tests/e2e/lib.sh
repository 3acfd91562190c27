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

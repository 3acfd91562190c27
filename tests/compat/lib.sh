# Sourced by compat_test before each record of tests/compat/*.txt (POSIX sh), after the
# end-to-end helpers of tests/e2e/lib.sh (start, output, finish), which it sources.
# Given: $UKPROBE, $TARGETS, $E2E_TMP (this test's scratch directory, mode 755), $E2E_DIR
# (tests/compat).
. "$E2E_DIR/../e2e/lib.sh"

# The agent next to the ukprobe that is tested (build/src/libukprobes.so).
AGENT=${UKP_AGENT:-$(cd "$(dirname "$UKPROBE")/../../src" && pwd)/libukprobes.so}
# ukprobe run and attach keep their decoded tables here, not in the user's home.
UKP_CACHE_DIR=$E2E_TMP/cache
export AGENT UKP_CACHE_DIR
mkdir -p "$UKP_CACHE_DIR" && chmod 777 "$UKP_CACHE_DIR"

# no_asan: true unless ukprobe and its agent were built with AddressSanitizer (then the
# agent cannot be preloaded into an uninstrumented program: preload and run modes skip).
no_asan() { ! ldd "$UKPROBE" | grep -q libasan; }

# in_mode MODE NAME DEF... -- CMD ARGS...: runs CMD in MODE with its output (stdout and
# stderr) in $E2E_TMP/NAME.out and returns its exit status:
#   plain    as it is;
#   preload  LD_PRELOAD=$AGENT, nothing else;
#   run      under `ukprobe run` with the events DEF...: the trace in $E2E_TMP/NAME.trace,
#            the kprobe_profile blocks in $E2E_TMP/NAME.profile (ukprobe's stderr from the
#            first profile header on; the lines before it are the program's stderr);
#   record   under `ukprobe record` with the events DEF...: the capture in
#            $E2E_TMP/NAME.dat, printed by `ukprobe report` into NAME.trace; the profile
#            as in run.
# The DEFs are ignored in the modes other than run. CMD reads $COMPAT_IN (default
# /dev/null). COMPAT_AS=USER runs CMD (and ukprobe) as USER.
in_mode() {
    _mode=$1 _name=$2
    shift 2
    _indefs=1
    for _a; do
        shift
        if [ $_indefs = 1 ]; then
            if [ "$_a" = -- ]; then _indefs=0; set -- "$@" --
            elif [ "$_mode" = run ] || [ "$_mode" = record ]; then set -- "$@" -e "$_a"
            fi
        else
            set -- "$@" "$_a"
        fi
    done
    # "$@" is now: [-e DEF]... -- CMD ARGS...
    _as=""
    [ -n "$COMPAT_AS" ] && _as="setpriv --reuid=$COMPAT_AS --regid=$(id -g "$COMPAT_AS") --clear-groups"
    _o=$E2E_TMP/$_name
    case $_mode in
    plain)
        shift
        $_as "$@" <"${COMPAT_IN:-/dev/null}" >"$_o.out" 2>&1 ;;
    preload)
        shift
        $_as env LD_PRELOAD="$AGENT" "$@" <"${COMPAT_IN:-/dev/null}" >"$_o.out" 2>&1 ;;
    run)
        $_as "$UKPROBE" run -o "$_o.trace" "$@" <"${COMPAT_IN:-/dev/null}" >"$_o.out" 2>"$_o.stderr" ;;
    record)
        [ -n "$_as" ] && touch "$_o.dat" && chown "$COMPAT_AS" "$_o.dat"
        $_as "$UKPROBE" record -o "$_o.dat" "$@" <"${COMPAT_IN:-/dev/null}" >"$_o.out" 2>"$_o.stderr"
        _rst=$?
        "$UKPROBE" report -o "$_o.trace" "$_o.dat" || _rst=125
        (exit $_rst) ;;
    *)
        echo "in_mode: no mode $_mode" >&2; return 2 ;;
    esac
    _st=$?
    if [ "$_mode" = run ] || [ "$_mode" = record ]; then
        sed -n '/^# kprobe_profile: process /,$p' "$_o.stderr" >"$_o.profile"
        sed '/^# kprobe_profile: process /,$d' "$_o.stderr" >>"$_o.out"
    fi
    return $_st
}

# events_check TRACE PROFILE: compares the trace lines of each event in TRACE (ukprobe
# run's -o file, or `ukprobe -p PID trace`) with the hits kprobe_profile counted for it
# (the `all N processes` block if there is one, else the one block). Every event must have
# been hit, and the records written must account for every hit: per event lines == hits
# when nothing was LOST, else lines <= hits and the sum of lines plus the LOST records
# (`[LOST N EVENTS]` of run, or entries-written minus entries-in-buffer of a trace file)
# equals the sum of hits. Prints "events: consistent (N hits)", or the numbers.
events_check() {
    if grep -q '^# kprobe_profile: all ' "$2"; then
        sed -n '/^# kprobe_profile: all /,$p' "$2" >"$2.used"
    else
        cp "$2" "$2.used"
    fi
    awk -v PROFILE="$2.used" '
        BEGIN {
            while ((getline l < PROFILE) > 0) {
                if (l ~ /^#/) continue
                n = split(l, f, " ")
                if (n != 3) continue
                if (!(f[1] in hits)) order[++nev] = f[1]
                hits[f[1]] += f[2]; miss[f[1]] += f[3]
            }
        }
        /\[LOST [0-9]+ EVENTS\]/ { m = $0; sub(/.*\[LOST /, "", m); lost += m + 0; next }
        /^# entries-in-buffer\/entries-written: / {
            split($3, ew, "/"); lost += ew[2] - ew[1]; next
        }
        /^#/ { next }
        {
            for (i = 1; i < NF; ++i)
                if ($i ~ /^[0-9]+\.[0-9]+:$/) { name = $(i + 1); sub(/:$/, "", name); lines[name]++; break }
        }
        END {
            if (nev == 0) { print "events: no kprobe_profile"; exit }
            bad = ""; th = 0; tl = 0
            for (k = 1; k <= nev; ++k) {
                e = order[k]; th += hits[e]; tl += lines[e]
                if (hits[e] == 0) bad = bad " " e " never hit;"
                if (lines[e] > hits[e] || (lost == 0 && lines[e] != hits[e]))
                    bad = bad " " e " hits " hits[e] " lines " lines[e] + 0 " missed " miss[e] ";"
            }
            if (tl + lost != th) bad = bad " total hits " th " lines " tl " LOST " lost ";"
            if (bad == "") print "events: consistent (" th " hits)"
            else print "events: inconsistent:" bad
        }' "$1"
}

# same_lines NAME A B: prints "NAME: same" when files A and B hold the same lines, else
# the difference (at most 40 lines).
same_lines() {
    if cmp -s "$2" "$3"; then echo "$1: same"; else echo "$1: differ"; diff "$2" "$3" | head -40; fi
}

# attach_events PID DEF...: attaches to PID, adds and enables each event.
attach_events() {
    _p=$1; shift
    "$UKPROBE" attach "$_p" || return 1
    for _d; do
        "$UKPROBE" -p "$_p" add "$_d" || return 1
        _e=${_d#*:}; _e=${_e%% *}
        "$UKPROBE" -p "$_p" enable "$_e" || return 1
    done
}

# attach_finish PID NAME: disables every event, keeps the profile and the trace as
# $E2E_TMP/NAME.profile and NAME.trace, prints events_check's verdict, detaches, attaches
# again to verify the code (then detaches again). Fails if a step fails.
attach_finish() {
    _p=$1 _o=$E2E_TMP/$2
    "$UKPROBE" -p "$_p" write events/enable 0 || return 1
    "$UKPROBE" -p "$_p" profile >"$_o.profile" || return 1
    "$UKPROBE" -p "$_p" trace >"$_o.trace" || return 1
    events_check "$_o.trace" "$_o.profile"
    "$UKPROBE" -p "$_p" detach || return 1
    "$UKPROBE" attach "$_p" >/dev/null || return 1
    "$UKPROBE" -p "$_p" verify || return 1
    "$UKPROBE" -p "$_p" detach >/dev/null || return 1
}

# compare MODE DEF... -- CMD ARGS...: runs CMD plain (the reference), then in MODE (see
# in_mode), and prints "status PLAIN MODE", "output: same" or the difference, and in run
# and record modes events_check's verdict. $COMPAT_PREP, if set, is eval'd before each of the two runs
# (a fresh database, a clean build directory); $COMPAT_FILTER (default cat) turns each
# output into what is compared (sort, where parallel jobs print in any order).
compare() {
    _cm=$1; shift
    [ -n "$COMPAT_PREP" ] && eval "$COMPAT_PREP"
    in_mode plain plain "$@"; _ps=$?
    [ -n "$COMPAT_PREP" ] && eval "$COMPAT_PREP"
    in_mode "$_cm" "$_cm" "$@"; _ms=$?
    echo "status $_ps $_ms"
    ${COMPAT_FILTER:-cat} <"$E2E_TMP/plain.out" >"$E2E_TMP/plain.cmp"
    ${COMPAT_FILTER:-cat} <"$E2E_TMP/$_cm.out" >"$E2E_TMP/$_cm.cmp"
    same_lines output "$E2E_TMP/plain.cmp" "$E2E_TMP/$_cm.cmp"
    case $_cm in run | record) events_check "$E2E_TMP/$_cm.trace" "$E2E_TMP/$_cm.profile" ;; esac
    return 0
}

# attach_mode DELAY WORK DEF... -- CMD ARGS...: runs CMD plain (the reference), then again
# in the background; after DELAY s attaches to it and adds and enables the events, lets
# it work WORK s, then attach_finish (events_check, detach, verify). Prints "status PLAIN
# ATTACHED" and "output: same" or the difference; $COMPAT_PREP and $COMPAT_FILTER as for
# compare; the background CMD reads $COMPAT_STDIN (default $COMPAT_IN), the reference
# $COMPAT_IN. CMD must still run after DELAY + WORK s (and some time for the
# commands).
attach_mode() {
    _delay=$1 _work=$2; shift 2
    _defs=""
    [ -n "$COMPAT_PREP" ] && eval "$COMPAT_PREP"
    # In the background too, as the attached run: sh starts a background job with SIGINT
    # and SIGQUIT ignored, which programs see (python's interrupt_main tests fail so).
    in_mode plain plain "$@" &
    wait $!; _ps=$?
    [ -n "$COMPAT_PREP" ] && eval "$COMPAT_PREP"
    # the definitions to the front of a list of their own, CMD in "$@"
    while [ "$1" != -- ]; do
        _defs="$_defs$1
"
        shift
    done
    shift
    "$@" <"${COMPAT_STDIN:-${COMPAT_IN:-/dev/null}}" >"$E2E_TMP/attach.out" 2>&1 &
    _ap=$!
    echo "$_ap" >>"$E2E_TMP/pids"
    sleep "$_delay"
    _old=$IFS
    IFS='
'
    # shellcheck disable=SC2086
    attach_events "$_ap" $_defs >/dev/null || echo "attach_events failed"
    IFS=$_old
    sleep "$_work"
    kill -0 "$_ap" 2>/dev/null || echo "the program ended before the events were read: make it work longer"
    attach_finish "$_ap" attach || echo "attach_finish failed"
    wait "$_ap"; _xs=$?
    echo "status $_ps $_xs"
    ${COMPAT_FILTER:-cat} <"$E2E_TMP/plain.out" >"$E2E_TMP/plain.cmp"
    ${COMPAT_FILTER:-cat} <"$E2E_TMP/attach.out" >"$E2E_TMP/attach.cmp"
    same_lines output "$E2E_TMP/plain.cmp" "$E2E_TMP/attach.cmp"
}

# PostgreSQL 15 (tests/compat/postgres.txt), as user nobody: a cluster in $E2E_TMP/pg with
# its unix socket there, no TCP.
PGBIN=/usr/lib/postgresql/15/bin
PGD=$E2E_TMP/pg
pg_as() { setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups "$@"; }
# pg_init: initdb (trust, user postgres, fsync off: the test is the server, not the disk).
pg_init() {
    mkdir -p "$PGD" && chown nobody "$PGD" && chmod 700 "$PGD" || return 1
    pg_as "$PGBIN/initdb" -D "$PGD" -U postgres -A trust --no-sync >"$E2E_TMP/initdb.out" 2>&1 ||
        { cat "$E2E_TMP/initdb.out"; return 1; }
}
# pg_server MODE DEF...: starts postgres in MODE (in_mode, as nobody) in the background,
# waits until it accepts connections; $PGPID is the background job (the mode's process).
pg_server() {
    _pm=$1; shift
    : >"$E2E_TMP/pg.trace" && chown nobody "$E2E_TMP/pg.trace"
    COMPAT_AS=nobody in_mode "$_pm" pg "$@" -- "$PGBIN/postgres" -D "$PGD" -k "$PGD" \
        -c listen_addresses= -c fsync=off -c max_connections=20 &
    PGPID=$!
    _i=0
    until "$PGBIN/pg_isready" -q -h "$PGD" -U postgres; do
        _i=$((_i + 1))
        [ $_i -gt 300 ] && { echo "postgres did not start"; cat "$E2E_TMP/pg.out"; return 1; }
        sleep 0.1
    done
}
# pg_bench SECONDS: pgbench -i (scale 2), then 2 clients for SECONDS; prints pgbench's
# status and failed transactions, whether it did any, and the bank's own invariant (the
# balances sum up to the history's deltas).
pg_bench() {
    "$PGBIN/pgbench" -h "$PGD" -U postgres -i -q -s 2 postgres >"$E2E_TMP/pgbench-i.out" 2>&1
    echo "pgbench -i status $?"
    "$PGBIN/pgbench" -h "$PGD" -U postgres -c 2 -j 2 -T "$1" postgres >"$E2E_TMP/pgbench.out" 2>&1
    echo "pgbench status $?"
    grep '^number of failed transactions' "$E2E_TMP/pgbench.out"
    _n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\)$/\1/p' "$E2E_TMP/pgbench.out")
    [ "${_n:-0}" -gt 100 ] && echo "transactions: more than 100" || { echo "transactions: ${_n:-none}"; cat "$E2E_TMP/pgbench.out"; }
    "$PGBIN/psql" -h "$PGD" -U postgres -At -c "select (select sum(abalance) from pgbench_accounts) = (select sum(delta) from pgbench_history), (select count(*) from pgbench_history) > 0" postgres
}
# pg_stop: pg_ctl stop -m fast, then the server's exit status ("postgres exit S").
pg_stop() {
    pg_as "$PGBIN/pg_ctl" stop -D "$PGD" -m fast -w >"$E2E_TMP/pg_ctl.out" 2>&1
    echo "pg_ctl stop status $?"
    wait "$PGPID"
    echo "postgres exit $?"
    grep -c 'database system is shut down' "$E2E_TMP/pg.out" | sed 's/^/shut down: /'
}

# py_verdicts FILE: the verdicts of `python3 -m test -v` output in FILE, sorted: one line
# per test case ("name (test.module.Class.name) ... ok|skipped '...'|FAIL|ERROR", or
# without a verdict when the test printed something before it), the
# "Ran N tests", "OK"/"FAILED (...)" and "Tests result: ..." lines.
py_verdicts() {
    grep -E '^[A-Za-z_0-9]+ \(test\.[A-Za-z_0-9.]+\) \.\.\. |^Ran [0-9]+ tests? |^(OK|FAILED)( \(.*\))?$|^Tests result: ' "$1" |
        sed 's/^\(Ran [0-9]* tests\{0,1\}\) in .*/\1/' |
        # what a test case prints before its verdict varies (timings): the verdict alone
        sed -E '/ \.\.\. (ok|FAIL|ERROR|skipped .*|expected failure|unexpected success)$/!s/^([A-Za-z_0-9]+ \(test\.[A-Za-z_0-9.]+\) \.\.\.) .*/\1/' | sort
}

# py_compare MODE DEF... -- TESTS...: /usr/bin/python3 -m test -v TESTS plain, then in MODE;
# prints "status P M", "verdicts: same" or the difference, the plain run's result line,
# and in run mode events_check's verdict.
py_compare() {
    COMPAT_FILTER="py_verdicts /dev/stdin" compare "$@"
    grep '^Tests result: ' "$E2E_TMP/plain.out" | sed 's/^/plain /'
}

# gdb_lines FILE: the lines of a gdb session's output that gdb.txt compares (breakpoint and
# watchpoint reports, frames #0-#2, the program's sum, its exit), without what varies from
# run to run (addresses, pids, the "Thread N hit" prefix gdb adds once a program has
# threads: the agent's).
gdb_lines() {
    grep -E '^(Thread [0-9]+ "[^"]*" hit )?(Breakpoint 1,|Temporary breakpoint 2[.0-9]*,|Watchpoint 3: total|Old value|New value|#[0-2] |sum |\[Inferior)' "$1" |
        sed -E 's/^Thread [0-9]+ "[^"]*" hit //; s/0x[0-9a-f]+ in //; s/process [0-9]+/process N/'
}

# gdb_session PROG [SETTING...]: runs PROG under gdb -batch, the SETTINGs first (gdb
# commands), then gdb.txt's session; prints gdb_lines of its output and returns gdb's
# status. With $GDB_EVENT set, gdb runs under `ukprobe run -o $E2E_TMP/trace -e
# "$GDB_EVENT"` (its output then ends with ukprobe's profile).
gdb_session() {
    _prog=$1
    shift
    for _s; do shift; set -- "$@" -ex "$_s"; done
    set -- gdb -q -batch "$@" -ex 'set can-use-hw-watchpoints 0' -ex 'break work if i == 50' -ex run -ex bt \
        -ex 'tbreak malloc thread 1' -ex continue -ex 'bt 2' -ex 'watch total' -ex continue -ex delete -ex continue "$_prog"
    if [ -n "$GDB_EVENT" ]; then
        "$UKPROBE" run -o "$E2E_TMP/trace" -e "$GDB_EVENT" -- "$@" >"$E2E_TMP/gdb.out" 2>&1
    else
        "$@" >"$E2E_TMP/gdb.out" 2>&1
    fi
    _st=$?
    gdb_lines "$E2E_TMP/gdb.out"
    return $_st
}

# redis_server MODE DEF...: redis-server (Debian package redis-server: jemalloc, I/O and
# background threads, a forked child for BGSAVE) in MODE on a unix socket in the test's
# directory, no persistence but BGSAVE's; waits until it answers PING.
redis_server() {
    _rm=$1; shift
    RSOCK=$E2E_TMP/redis.sock
    in_mode "$_rm" redis "$@" -- redis-server --port 0 --unixsocket "$RSOCK" --dir "$E2E_TMP" --save '' \
        --appendonly no --io-threads 2 &
    RPID=$!
    _i=0
    until [ "$(redis-cli -s "$RSOCK" ping 2>/dev/null)" = PONG ]; do
        _i=$((_i + 1))
        [ $_i -gt 300 ] && { echo "redis did not start"; cat "$E2E_TMP/redis.out"; return 1; }
        sleep 0.1
    done
}
# redis_bench N: redis-benchmark's SET, GET, INCR, LPUSH and LRANGE_100 tests (six: LRANGE's
# LPUSH runs first), N requests each from 8 clients; prints its status, how many tests
# finished, whether INCR counted every request, then a BGSAVE (a forked child writes the
# dump) and its verdict.
redis_bench() {
    redis-benchmark -s "$RSOCK" -q -n "$1" -c 8 -t set,get,incr,lpush,lrange_100 >"$E2E_TMP/bench.out" 2>&1
    echo "redis-benchmark status $?"
    echo "tests finished: $(tr '\r' '\n' <"$E2E_TMP/bench.out" | grep -c 'requests per second')"
    [ "$(redis-cli -s "$RSOCK" get 'counter:__rand_int__')" = "$1" ] && echo "incr: every request" ||
        echo "incr: $(redis-cli -s "$RSOCK" get 'counter:__rand_int__') of $1"
    redis-cli -s "$RSOCK" bgsave
    _i=0
    while redis-cli -s "$RSOCK" info persistence | grep -q '^rdb_bgsave_in_progress:1'; do
        _i=$((_i + 1)); [ $_i -gt 300 ] && break; sleep 0.1
    done
    redis-cli -s "$RSOCK" info persistence | grep '^rdb_last_bgsave_status' | tr -d '\r'
}
# redis_stop: SHUTDOWN NOSAVE, then the server's exit status ("redis exit S").
redis_stop() {
    redis-cli -s "$RSOCK" shutdown nosave >/dev/null 2>&1
    wait "$RPID"
    echo "redis exit $?"
    grep -c 'Redis is now ready to exit' "$E2E_TMP/redis.out" | sed 's/^/ready to exit: /'
}

# nginx_server MODE DEF...: nginx (Debian package nginx) in MODE, in the foreground
# (daemon off; NGX_DAEMON=on: it forks its master and exits), its prefix in $E2E_TMP/ngx: a master running as root and two workers it
# forks, which drop to user nobody; a 27 KB page served on 127.0.0.1:$NPORT, gzip on.
# Waits until the master listens and has started its workers; $NPID is the background job (the mode's process).
nginx_server() {
    _nm=$1; shift
    NGX=$E2E_TMP/ngx
    NPORT=$((20000 + $$ % 20000))
    mkdir -p "$NGX/html" || return 1
    head -c 20000 /dev/urandom | base64 >"$NGX/html/index.html"
    cat >"$NGX/nginx.conf" <<NGXEOF
worker_processes 2;
daemon ${NGX_DAEMON:-off};
pid $NGX/nginx.pid;
error_log $NGX/error.log notice;
events { worker_connections 256; }
http {
  access_log $NGX/access.log;
  client_body_temp_path $NGX/body;
  proxy_temp_path $NGX/proxy;
  fastcgi_temp_path $NGX/fastcgi;
  uwsgi_temp_path $NGX/uwsgi;
  scgi_temp_path $NGX/scgi;
  server { listen 127.0.0.1:$NPORT; root $NGX/html; gzip on; gzip_http_version 1.0; }
}
NGXEOF
    in_mode "$_nm" nginx "$@" -- nginx -p "$NGX" -c "$NGX/nginx.conf" -e "$NGX/error.log" &
    NPID=$!
    _i=0
    until [ -s "$NGX/nginx.pid" ] && [ "$(grep -c 'start worker process [0-9]' "$NGX/error.log")" -ge 2 ]; do
        _i=$((_i + 1))
        [ $_i -gt 300 ] && { echo "nginx did not start"; cat "$E2E_TMP/nginx.out" "$NGX/error.log"; return 1; }
        sleep 0.1
    done
}
# nginx_ab LABEL N [HEADER]: ApacheBench (apache2-utils), N requests from 8 clients; prints
# "ab LABEL: status S, failed F" (responses of the wrong length or status, errors) and keeps
# the bytes of page received per request in NBYTES.
nginx_ab() {
    ab -q -n "$2" -c 8 ${3:+-H "$3"} "http://127.0.0.1:$NPORT/index.html" >"$E2E_TMP/ab.out" 2>&1
    _st=$?
    _f=$(sed -n 's/^Failed requests: *\([0-9]*\)$/\1/p' "$E2E_TMP/ab.out")
    _x=$(sed -n 's/^Non-2xx responses: *\([0-9]*\)$/\1/p' "$E2E_TMP/ab.out")
    echo "ab $1: status $_st, failed $((${_f:-$2} + ${_x:-0}))"
    _b=$(sed -n 's/^HTML transferred: *\([0-9]*\) bytes$/\1/p' "$E2E_TMP/ab.out")
    NBYTES=$((${_b:-0} / $2))
}
# nginx_drive N: N requests, a reload (SIGHUP: the master reads its configuration again,
# forks two new workers and lets the old ones finish), N requests asking for gzip; prints
# what nginx_ab prints, whether the page came whole and then compressed, and how many
# workers were started.
nginx_drive() {
    _size=$(stat -c %s "$NGX/html/index.html")
    nginx_ab plain "$1"
    [ "$NBYTES" = "$_size" ] && echo "page: whole" || echo "page: $NBYTES bytes of $_size"
    kill -HUP "$(cat "$NGX/nginx.pid")"
    _i=0
    until [ "$(grep -c 'start worker process [0-9]' "$NGX/error.log")" -ge 4 ]; do
        _i=$((_i + 1)); [ $_i -gt 300 ] && break; sleep 0.1
    done
    nginx_ab gzip "$1" 'Accept-Encoding: gzip'
    [ "$NBYTES" -gt 0 ] && [ "$NBYTES" -lt "$_size" ] && echo "gzip: compressed" || echo "gzip: $NBYTES bytes of $_size"
    echo "workers started: $(grep -c 'start worker process [0-9]' "$NGX/error.log")"
}
# nginx_stop N: a graceful stop (SIGQUIT); prints the master's exit status, whether the
# access log holds 2N requests, and the error log's alerts.
nginx_stop() {
    kill -QUIT "$(cat "$NGX/nginx.pid")"
    wait "$NPID"
    echo "nginx exit $?"
    [ "$(grep -c '"GET /index.html HTTP/1.0" 200 ' "$NGX/access.log")" = $((2 * $1)) ] && echo "access log: every request" ||
        echo "access log: $(grep -c ' 200 ' "$NGX/access.log") of $((2 * $1))"
    echo "alerts: $(grep -cE '\[(alert|crit|emerg)\]' "$NGX/error.log")"
}

# mariadb_server MODE DEF...: MariaDB 10.11 (Debian package mariadb-server: InnoDB with
# io_uring, a thread per connection, background threads) in MODE, a fresh data directory
# in $E2E_TMP/maria, a unix socket there and no TCP; waits until it answers a ping.
# $MPID is the background job (the mode's process), $MDIR/mariadbd.pid names the server.
mariadb_server() {
    _mm=$1; shift
    MDIR=$E2E_TMP/maria
    MSOCK=$MDIR/sock
    mariadb-install-db --no-defaults --datadir="$MDIR/data" --user=root --auth-root-authentication-method=normal \
        --skip-test-db >"$E2E_TMP/install-db.out" 2>&1 || { cat "$E2E_TMP/install-db.out"; return 1; }
    in_mode "$_mm" mariadb "$@" -- mariadbd --no-defaults --datadir="$MDIR/data" --socket="$MSOCK" --skip-networking \
        --user=root --innodb-buffer-pool-size=64M --log-error="$MDIR/error.log" --pid-file="$MDIR/mariadbd.pid" &
    MPID=$!
    _i=0
    until mariadb-admin --no-defaults -S "$MSOCK" -uroot ping >/dev/null 2>&1; do
        _i=$((_i + 1))
        [ $_i -gt 300 ] && { echo "mariadbd did not start"; cat "$E2E_TMP/mariadb.out" "$MDIR/error.log"; return 1; }
        sleep 0.1
    done
}
# mariadb_slap N: mysqlslap's mixed load of generated SQL (inserts and selects), N queries
# from 8 clients; prints its status and errors.
mariadb_slap() {
    mysqlslap --no-defaults -S "$MSOCK" -uroot --auto-generate-sql --auto-generate-sql-load-type=mixed \
        --concurrency=8 --number-of-queries="$1" --iterations=1 >"$E2E_TMP/slap.out" 2>&1
    echo "mysqlslap status $?"
    grep -i 'error' "$E2E_TMP/slap.out"
}
# mariadb_check: a table of 20,000 rows made by one INSERT ... SELECT, its count and sum
# (20000 200010000), then a shutdown; prints the server's exit status and its error log's
# errors.
mariadb_check() {
    mariadb --no-defaults -S "$MSOCK" -uroot -N -e "create database t; use t;
        create table a (k int primary key, v varchar(40)) engine=InnoDB;
        insert into a select seq, md5(seq) from seq_1_to_20000;
        select count(*), sum(k), count(distinct v) from a;" 2>&1 | tr '\t' ' ' | sed 's/^/rows: /'
    mariadb-admin --no-defaults -S "$MSOCK" -uroot shutdown
    echo "shutdown status $?"
    wait "$MPID"
    echo "mariadbd exit $?"
    echo "errors: $(grep -c '\[ERROR\]' "$MDIR/error.log")"
}

# For tests/compat/watch.txt: a script whose commands set bash's last_command_exit_value
# in turn (subshells that exit with 1 to 5, true, false, a function's return), then says done.
for i in 1 2 3 4 5; do (exit $i); done
true
false
f() { return 7; }
f
echo done

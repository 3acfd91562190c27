# For tests/compat/watch.txt: bash with the agent and a w: event from the environment, under
# gdb; at exit(), with the other threads running (non-stop), the agent's error_log and
# kprobe_events are saved as log and defs ($UKPROBE reads them).
set pagination off
set non-stop on
set environment UKP_CONTROL=1
set environment UKP_EVENTS=w:ev,w@last_command_exit_value:4
break exit
commands
python import os; p = gdb.selected_inferior().pid; u = os.environ["UKPROBE"]; gdb.execute("shell %s -p %d read error_log > log; %s -p %d read kprobe_events > defs" % (u, p, u, p))
continue
end
run

# For tests/compat/watch.txt: a hardware watchpoint on bash's last_command_exit_value that
# prints each new value and the code address after the write as "write VALUE SYM+0xOFF".
set pagination off
break main
run
watch *(int *)&last_command_exit_value
commands
silent
python v = int(gdb.parse_and_eval("*(int *)&last_command_exit_value")); s = gdb.execute("info symbol $pc", to_string=True).split(); print("write %d %s+0x%x" % (v, s[0], int(s[2]) if s[1] == "+" else 0))
continue
end
continue

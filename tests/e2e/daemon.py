# The shape of a daemon, for `ukprobe run`: the program forks and exits at once; its child
# starts a session of its own and, once the program is surely gone, forks WORKERS workers
# (no exec), each appending WRITES lines to FILE with write(2); the child waits for them
# and exits.
# Usage: daemon.py WORKERS WRITES FILE
import os
import sys
import time

workers, writes, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
if os.fork() > 0:
    os._exit(0)
os.setsid()
time.sleep(0.3)
pids = []
for w in range(workers):
    pid = os.fork()
    if pid == 0:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        for i in range(writes):
            os.write(fd, b"worker %d line %d\n" % (w, i))
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
os._exit(0)

"""A stand-in for the agent of this process, for tests/e2e/control.txt: listens where the
agent would, prints its pid once it does, takes one request and then, by argv[1], exits
without a reply ("exit") or closes the connection and lives on for 3 s ("live")."""
import os
import socket
import sys
import time

directory = "/tmp/ukprobes-%d" % os.geteuid()
os.makedirs(directory, mode=0o700, exist_ok=True)
path = "%s/%d.sock" % (directory, os.getpid())
server = socket.socket(socket.AF_UNIX)
server.bind(path)
server.listen()
print(os.getpid(), flush=True)
conn, _ = server.accept()
conn.recv(64)
os.unlink(path)
if sys.argv[1] == "exit":
    os._exit(0)
conn.close()
time.sleep(3)

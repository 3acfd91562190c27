# tests/e2e/attach.txt: a program that maps its own libc.so.6 (a private, writable copy,
# as a reader of ELF files may make), then waits for argv[1] seconds.
import mmap
import sys
import time

path = next(l.split()[-1] for l in open("/proc/self/maps") if l.rstrip().endswith("/libc.so.6"))
with open(path, "rb") as f:
    copy = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
print("ready", flush=True)
time.sleep(float(sys.argv[1]))
print("done")

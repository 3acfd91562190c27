# tests/compat/functions.txt: opens two files over and over for argv[1] seconds (open():
# glibc's open64), a millisecond apart, then says whether it did; the output does not depend
# on how many times.
import sys
import time

end = time.monotonic() + float(sys.argv[1])
n = 0
while time.monotonic() < end:
    for path in ("/etc/hostname", "/etc/os-release"):
        with open(path, "rb") as f:
            f.read(1)
    time.sleep(0.001)
    n += 1
print("opened", "many" if n > 20 else n)

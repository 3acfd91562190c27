# tests/compat/functions.txt: sleeps of 2 ms for argv[1] seconds (time.sleep: glibc's
# clock_nanosleep), then says whether it slept; the output does not depend on how many.
import sys
import time

end = time.monotonic() + float(sys.argv[1])
n = 0
while time.monotonic() < end:
    time.sleep(0.002)
    n += 1
print("slept", "many" if n > 100 else n)

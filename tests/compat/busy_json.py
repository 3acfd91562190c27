# tests/compat/functions.txt: Python's json and zlib at work for argv[1] seconds, checking
# every round trip. The output does not depend on how many rounds fit in the time (a
# plain run does about 1,500 a half second here, whose glibc trims its heap every round;
# a loaded CI machine under `ukprobe run` did 971).
import json
import sys
import time
import zlib

end = time.monotonic() + float(sys.argv[1])
rounds = bad = 0
while time.monotonic() < end:
    d = {"n": rounds, "l": list(range(rounds % 50)), "s": "x" * (rounds % 300)}
    text = json.dumps(d, sort_keys=True)
    packed = zlib.compress(text.encode())
    if json.loads(zlib.decompress(packed).decode()) != d:
        bad += 1
    rounds += 1
print("rounds", "many" if rounds > 50 else rounds, "bad", bad)

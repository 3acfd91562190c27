# For tests/compat/tracepoints.txt: imports CPython 3.11 finds and loads (its
# import__find__load__start and __done SDT probes: json and the modules it imports, and
# colorsys), then an explicit collection (gc__start, gc__done).
import colorsys
import gc
import json

print(json.dumps(colorsys.rgb_to_hsv(0.2, 0.4, 0.4)))
gc.collect()
print("done")

# tests/compat/malloc.txt: how glibc serves python3.11 a request of 1 MiB: with a
# mapping of its own ("mapped") while its dynamic mmap threshold is where a program's own
# frees left it (128 KiB at start), from the heap ("heap") once a free() of a larger mapped
# block raised it. Asked at start, then again once the file argv[1] exists (after an
# attach, at most 30 s later). The blocks asked for are kept: freeing one would raise the
# threshold itself.
import ctypes
import os
import sys
import time

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]


def served():
    block = libc.malloc(1 << 20)
    size = ctypes.c_uint64.from_address(block - 8).value  # the chunk's size word
    return "mapped" if size & 2 else "heap"  # IS_MMAPPED


print("at start:", served(), flush=True)
if len(sys.argv) > 1:
    end = time.monotonic() + 30
    while not os.path.exists(sys.argv[1]) and time.monotonic() < end:
        time.sleep(0.05)
print("after:", served(), flush=True)

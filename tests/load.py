"""A planted CPU load for tests: busy-looping processes for the duration of a `with` block."""

import os
import subprocess
import sys
import time
from contextlib import contextmanager

# A loop spins until it is killed on leaving the block; should the test process die uncleanly it
# stops by itself once its parent is gone (or after `seconds`, a bound no loaded test reaches).
SPIN = ("import os, time\nparent, end = os.getppid(), time.monotonic() + {seconds}\n"
        "while os.getppid() == parent and time.monotonic() < end:\n"
        "    for _ in range(100_000):\n        pass\n")


@contextmanager
def planted_load(processes: int | None = None, seconds: float = 3600.0):
    """`processes` busy loops (default: four per core, so that they still take most of the CPU
    from a test process on a machine others already use), killed on leaving the block, even
    when it raises."""
    count = processes or 4 * (os.cpu_count() or 1)
    procs = [subprocess.Popen([sys.executable, "-c", SPIN.format(seconds=seconds)])
             for _ in range(count)]
    try:
        time.sleep(0.3)  # the interpreters start
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()

"""stdin to stdout with the seconds since start before every line ('\\r' ends a line too, so
tqdm's bars are stamped per update): a start-up log whose phases can be timed."""

import sys
import time

t0 = time.monotonic()
line: list[str] = []
while ch := sys.stdin.read(1):
    if ch in "\r\n":
        sys.stdout.write(f"{time.monotonic() - t0:8.2f} {''.join(line)}\n")
        sys.stdout.flush()
        line = []
    else:
        line.append(ch)
if line:
    sys.stdout.write(f"{time.monotonic() - t0:8.2f} {''.join(line)}\n")

"""Finding the processes a command started, by a marker in their environment (tests only).

A test puts ``AGP_TEST_MARK=<unique>`` into the environment of the command it runs; every process
the command starts inherits it (vLLM's engine core and workers too), and nothing else on the
machine has it. A zombie is not running (an orphan's zombie stays until init reaps it, and this
container's init does not): it does not count.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

MARK = "AGP_TEST_MARK"


def new_mark() -> str:
    return uuid.uuid4().hex


def marked(mark: str) -> dict[int, str]:
    """pid -> command line of every running process whose environment carries ``mark``."""
    needle = f"{MARK}={mark}".encode()
    found: dict[int, str] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            if stat[stat.rindex(b")") + 2 :][:1] in (b"Z", b"X"):
                continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                found[int(name)] = f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
        except (OSError, ValueError):
            continue
    return found


def wait_gone(mark: str, deadline: float = 20.0) -> dict[int, str]:
    """Wait until no process carries ``mark`` (at most ``deadline`` seconds); what is left."""
    end = time.monotonic() + deadline
    while True:
        left = marked(mark)
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.2)


def wait_for(mark: str, count: int, deadline: float = 120.0) -> dict[int, str]:
    """Wait until at least ``count`` processes carry ``mark``; them."""
    end = time.monotonic() + deadline
    while True:
        found = marked(mark)
        if len(found) >= count or time.monotonic() > end:
            return found
        time.sleep(0.1)


def kill_marked(mark: str) -> None:
    """Clean-up after a negative control: SIGKILL whatever still carries ``mark``."""
    for pid in marked(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

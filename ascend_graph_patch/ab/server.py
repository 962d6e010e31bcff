"""A ``vllm serve`` process for one arm of a served A/B (or a test): start, wait, stop.

The server listens on 127.0.0.1 only, on a port free at start (another run on the same machine
picks its own). It is started and stopped through :mod:`ascend_graph_patch.supervisor` (its own
process group, ended with the command however that ends): politely first (SIGTERM), with a grace
longer than the ``--shutdown-timeout`` the served A/B gives vLLM, so that the API server waits
for its engine core and every process writes its last status file, then SIGKILL. Whoever starts
one stops it in a ``finally``: :func:`running` does both.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ascend_graph_patch import supervisor

HOST = "127.0.0.1"
T = TypeVar("T")
_UNSET: Any = object()
#: Seconds ``vllm serve`` gets after SIGTERM before SIGKILL: more than :data:`SHUTDOWN_TIMEOUT`.
STOP_GRACE = 20.0
#: ``--shutdown-timeout`` given to a served arm unless the user sets one: without it (vLLM's 0)
#: the API server kills its engine core at once on SIGTERM, before it writes its status file.
SHUTDOWN_TIMEOUT = 10


class ServerError(RuntimeError):
    """The server exited or did not become ready; the message ends with its log's last lines."""


def free_port(host: str = HOST) -> int:
    """A TCP port nothing listens on now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def vllm_cli() -> list[str]:
    """vLLM's command line (``vllm ...``) run by this interpreter."""
    return [sys.executable, "-m", "vllm.entrypoints.cli.main"]


def spawn(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start ``cmd`` supervised (``supervisor.start``: its own session, the parent-death signal,
    the guardian), its output appended to ``log``."""
    with open(log, "ab") as out:
        return supervisor.start(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen, grace: float = STOP_GRACE) -> int | None:
    """End ``vllm serve`` and its process group: SIGTERM to the API server alone, up to
    ``grace`` seconds for it to shut its engine core down, then ``supervisor.stop`` for whatever
    is left of the group (SIGTERM, a short grace, SIGKILL).

    Not SIGTERM to the whole group first: vLLM's API server terminates its engine core itself,
    and an engine core signalled twice gets the second SIGTERM after it has put the default
    handler back, so it dies before it writes its last status file."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    return supervisor.stop(proc, 2.0)


def tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) if text else "(empty log)"


@dataclass
class Server:
    """A started ``vllm serve``: its process, address and log."""

    proc: subprocess.Popen
    port: int
    log: Path
    host: str = HOST

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        """(HTTP status, body) of ``GET path``; status 0 when nothing answered."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
                return response.status, response.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return exc.code, ""
        except (OSError, ValueError):
            return 0, ""

    def wait_ready(self, timeout: float) -> float:
        """Block until ``/health`` answers 200; the seconds it took. Raises :class:`ServerError`
        when the server exits or ``timeout`` passes first."""
        started = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                raise ServerError(
                    f"vllm serve exited with status {self.proc.returncode} before it was "
                    f"ready: {tail(self.log)}"
                )
            if self.get("/health", timeout=2.0)[0] == 200:
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise ServerError(f"vllm serve not ready after {timeout:.0f} s: {tail(self.log)}")
            time.sleep(0.5)


def start(
    model: str, args: list[str], env: dict[str, str], log: Path, port: int | None = None
) -> Server:
    """Start ``vllm serve MODEL ARGS`` on 127.0.0.1 (a free port unless given); not yet ready."""
    port = port or free_port()
    cmd = [*vllm_cli(), "serve", model, *args, "--host", HOST, "--port", str(port)]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(("$ " + " ".join(cmd) + "\n").encode())
    return Server(spawn(cmd, env, log), port, log)


def start_ready(
    model: str,
    args: list[str],
    env: dict[str, str],
    log: Path,
    timeout: float,
    meanwhile: Callable[[], T],
) -> tuple[Server, T]:
    """Start a server, run ``meanwhile()`` while it starts, wait until it is ready. A port taken
    between choosing it and binding it (another run on the machine) is retried once with
    another; any other failure stops the server and raises. The caller stops the server."""
    result: Any = _UNSET
    for attempt in (1, 2):
        server = start(model, args, env, log)
        try:
            if result is _UNSET:
                result = meanwhile()
            server.wait_ready(timeout)
            return server, result
        except ServerError as exc:
            stop(server.proc)
            if attempt == 1 and "address already in use" in str(exc).lower():
                continue
            raise
        except BaseException:
            stop(server.proc)
            raise
    raise AssertionError("unreachable")


@contextlib.contextmanager
def running(
    model: str,
    args: list[str],
    env: dict[str, str],
    log: Path,
    ready_timeout: float = 600.0,
) -> Iterator[Server]:
    """A ready server for the ``with`` block, stopped by pid and process group on the way out
    (also when it failed to start, or the block raised)."""
    server = start(model, args, env, log)
    try:
        server.wait_ready(ready_timeout)
        yield server
    finally:
        stop(server.proc)

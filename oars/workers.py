"""`oars serve --workers N`: N gateway processes on one port, for more than one core's worth of
streams.

The parent holds the port (bound, not listening), forks the workers (before any thread or event
loop exists) and then only supervises: a worker that dies is started again, SIGTERM or SIGINT
stops them all. Each worker builds its own app and listens on a socket of its own on the port
(`SO_REUSEPORT`), so the kernel spreads the connections over them; one socket shared by all
would go to whichever worker woke first, which takes every connection then pending. Nothing is shared in memory: as between replicas on one database, the store is the
truth, so a chain, a background response or a cancel may land on any worker. Worker `i` is
the replica `NAME/i` (its leases, and the responses it fails on startup as its own: those its
previous process left).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable

log = logging.getLogger("oars.workers")


def supervise(host: str, port: int, count: int, serve: Callable[[int, socket.socket], None]) -> int:
    """Run `serve(worker, listener)` in `count` forked processes, each with a listening socket
    of its own on the port, until a signal; return the exit status."""
    held = _socket(host, port)  # the port is free, and stays ours
    children: dict[int, int] = {}  # pid -> worker
    stopping = False

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for pid in children:
            _kill(pid, signal.SIGTERM)

    for number in range(count):
        children[_fork(number, host, port, serve)] = number
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    started: dict[int, float] = {}
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid not in children:
            continue
        number = children.pop(pid)
        if stopping:
            continue
        print(f"oars: worker {number} ended ({_how(status)}); starting it again", flush=True)
        if time.monotonic() - started.get(number, 0.0) < 1.0:
            time.sleep(1.0)  # one that dies at once is not restarted in a tight loop
        started[number] = time.monotonic()
        children[_fork(number, host, port, serve)] = number
    held.close()
    return 0


def _socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _fork(number: int, host: str, port: int, serve: Callable[[int, socket.socket], None]) -> int:
    pid = os.fork()
    if pid:
        return pid
    # The worker: in a process group of its own, so that a terminal's ^C reaches the parent
    # alone, which stops every worker once.
    os.setpgid(0, 0)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    code = 1
    try:
        listener = _socket(host, port)
        listener.listen(2048)
        serve(number, listener)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        log.exception("worker %d failed", number)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _kill(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _how(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"

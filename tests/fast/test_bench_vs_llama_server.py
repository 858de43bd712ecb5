"""How `bench.vs_llama_server` alternates oars with one or more llama-servers: every server runs
every rep, each goes first as often as the others, and each reference gets its own rows."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from bench.vs_llama_server import Row, Server, Step, _alternate, _thread_cpu


def _server(name: str) -> Server:
    return Server(name, lambda port: [], "/", lambda chat, n: {}, lambda e, s, t: None, Path(name))


def test_every_rep_runs_on_every_server_and_the_first_rotates() -> None:
    servers = tuple(_server(n) for n in ("oars", "llama-server", "llama-server --no-repack"))
    order: list[tuple[int, str]] = []

    def run(server: Server, rep: int) -> str:
        order.append((rep, server.name))
        return f"{server.name} {rep}"

    results = _alternate(servers, 3, run)
    assert results == [[f"{s.name} {rep}" for rep in range(3)] for s in servers]
    firsts = [name for rep, name in order if (rep, name) == next(o for o in order if o[0] == rep)]
    assert firsts == ["oars", "llama-server", "llama-server --no-repack"]


def test_a_step_gives_rows_against_each_reference() -> None:
    servers = tuple(_server(n) for n in ("oars", "a", "b"))
    values = {"oars": 2.0, "a": 4.0, "b": 1.0}

    def rows(ours: list[Any], theirs: list[Any]) -> list[Row]:
        return [Row.of("x", ours, theirs, "s")]

    got = Step("x", lambda server, rep: values[server.name], rows, 2).measure(servers)
    assert [(r.against, r.ratio, r.ratios) for r in got] == [
        ("a", 0.5, [0.5, 0.5]),
        ("b", 2.0, [2.0, 2.0]),
    ]


def test_thread_cpu_counts_each_thread_apart() -> None:
    """`beside` tells llama.cpp's threads from the rest by each thread's CPU in `/proc`: a
    thread that burns CPU shows it under its own id, and one that sleeps does not."""
    tids: dict[str, int] = {}
    go, read = threading.Event(), threading.Event()  # both live until their times are read
    burned_enough = threading.Event()

    def burn() -> None:
        tids["burn"] = threading.get_native_id()
        go.wait()
        end = time.thread_time() + 0.1
        while time.thread_time() < end:
            pass
        burned_enough.set()
        read.wait()

    def sleep() -> None:
        tids["sleep"] = threading.get_native_id()
        go.wait()
        read.wait()

    workers = [threading.Thread(target=f, daemon=True) for f in (burn, sleep)]
    for worker in workers:
        worker.start()
    while len(tids) < 2:
        time.sleep(0.01)
    before = _thread_cpu(os.getpid())
    go.set()
    assert burned_enough.wait(timeout=30)
    after = _thread_cpu(os.getpid())
    read.set()
    for worker in workers:
        worker.join()
    burned = after[tids["burn"]] - before[tids["burn"]]
    slept = after[tids["sleep"]] - before[tids["sleep"]]
    assert burned >= 0.05
    assert slept <= 0.01

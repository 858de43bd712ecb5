"""The bench's own checks of what every ratio rests on: the rotation, the rows against each
reference, and the per-thread CPU. Not part of the server's test suite (`testpaths` is
`tests/`); run with `python -m pytest bench`."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from bench.clients import RESPONSES, Endpoint
from bench.servers import Row, Server, alternate, thread_cpu
from bench.steps import Step


def _endpoint(name: str) -> Endpoint:
    return Endpoint(Server(name, lambda port: []), RESPONSES)


def test_every_rep_runs_on_every_side_and_the_first_rotates() -> None:
    sides = ["oars", "llama-server", "llama-server --no-repack"]
    order: list[tuple[int, str]] = []

    def run(side: str, rep: int) -> str:
        order.append((rep, side))
        return f"{side} {rep}"

    assert alternate(sides, 3, run) == [[f"{s} {rep}" for rep in range(3)] for s in sides]
    firsts = [next(side for r, side in order if r == rep) for rep in range(3)]
    assert firsts == sides


def test_a_step_gives_rows_against_each_reference() -> None:
    endpoints = tuple(_endpoint(n) for n in ("oars", "a", "b"))
    values = {"oars": 2.0, "a": 4.0, "b": 1.0}

    def rows(ours: list[Any], theirs: list[Any]) -> list[Row]:
        return [Row.of("x", ours, theirs, "s")]

    got = Step("x", lambda endpoint, rep: values[endpoint.name], rows, 2).measure(endpoints)
    assert [(r.against, r.ratio, r.ratios) for r in got] == [
        ("a", 0.5, [0.5, 0.5]),
        ("b", 2.0, [2.0, 2.0]),
    ]


def test_thread_cpu_counts_each_thread_apart() -> None:
    """`beside` tells llama.cpp's threads from the rest by each thread's CPU in `/proc`: a
    thread that burns CPU shows it under its own id, and one that sleeps does not."""
    tids: dict[str, int] = {}
    go, read, burned_enough = threading.Event(), threading.Event(), threading.Event()

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
    before = thread_cpu(os.getpid())
    go.set()
    assert burned_enough.wait(timeout=30)
    after = thread_cpu(os.getpid())
    read.set()
    for worker in workers:
        worker.join()
    assert after[tids["burn"]] - before[tids["burn"]] >= 0.05
    assert after[tids["sleep"]] - before[tids["sleep"]] <= 0.01


def test_every_rep_of_the_speculation_bench_asks_anew() -> None:
    """llama-server `--spec-default` drafts from every earlier request's tokens: a rep that
    asked what an earlier one did would time its replay of its own reply."""
    from bench.speculation import MAX_REPS, chats

    asked = [
        chat[-1]["content"]
        for rep in range(MAX_REPS)
        for asks in chats(rep).values()
        for ask in asks
        for chat in ask
    ]
    assert len(set(asked)) == len(asked) == MAX_REPS * 10

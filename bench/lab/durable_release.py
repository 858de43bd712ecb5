"""What holding a stored response's events until the store has them costs a stream.

The question (issue: a resume after a replica dies must never contradict): a stored stream's
events now reach the client only once written, a transaction after another while readers wait,
where they used to go out at once and be written every 100 ms. How much later do the first
token and each token arrive, at 1 and at 64 streams?

Two source trees (before, after) each serve the scripted engine (no model: the store and the
event path are all there is to measure) at a fixed pace, with a SQLite file or a PostgreSQL
database; the two are run in rotation, and the table gives the median and p99 of the time to
the first delta and of the gap between deltas, after against before. The client reads raw bytes
(`_stream`): through an HTTP client, 64 streams' first deltas waited for its loop (78-83 ms at
the p50 on 2 cores, 35-40 ms read raw, the server's pace the same). Each server also times every
response's first delta itself, from its request's arrival (when the app is called) and from its
event log's start to the delta's append and to its release (`first delta, in the server`). And
since a wait that every delta pays alike does not show in the gaps between them, each server
times every delta from its append to the SSE stream that reads it (`a delta from its append to
its reader, in the server`), and each write of logs alone, with the serving loop's CPU in it on
SQLite (where the transaction runs on the loop): how much of a held delta's wait is the hold's
own work. The box's busy share during each load goes to stderr.

    python -m bench.lab.durable_release --before TREE|unheld --after TREE [--streams 1,64]
        [--reps 3] [--store sqlite|postgresql://USER@HOST:PORT/DB] [--engine scripted|model]
        [--singles 1] [--threads N] [--servers 1]

`--engine model` serves the default model instead (each stream its own short story, a few
tokens long, every stream decoded at once): what a user of the embedded engine waits for.
`--singles N` asks the one stream N times a rep, one after another (a sample a rep is few).
`--threads N`: the model's threads (default: one a core), so that a database on the same box can
be left a core of its own. `--servers N`: N server processes a side on the one store, the
streams spread over them, as `oars serve --workers N` does a gateway's.

A tree is a checkout of oars (e.g. `git worktree add /tmp/before <commit>`); the server runs
this file with that tree first on its path. `--before unheld` is the tree after with its event
logs never held (`EventLog.hold` a no-op): each event released as it is made, the logs written
every 100 ms, as before the hold; so the two differ by the hold alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    from bench.servers import Server
    from oars.store.base import Writes

TOKENS = 60
DELAY = 0.02  # 50 tokens a second a stream
MODEL_TOKENS = 16  # a model's stream: 64 of them at once take about 12 s on two cores


def serve(
    port: int, store: str, delay: float, held: bool, kind: str, parallel: int, threads: int
) -> None:
    import uvicorn

    from oars.http import create_app
    from oars.serve import settle_heap
    from oars.service import ResponsesService
    from oars.store import SqlStore
    from oars.testing import ScriptedEngine

    if not held:
        from oars.eventlog import EventLog

        EventLog.hold = lambda self, wanted: None  # type: ignore[method-assign]
    if kind == "model":
        from oars.engines.llama import LlamaEngine
        from oars.settings import EngineSettings
        from oars.weights import DEFAULT_MODEL, pull

        # every stream decoded at once, none queued; no prompt kept on disk between reps
        settings = EngineSettings(
            model_id=DEFAULT_MODEL.name,
            context=256,
            parallel=parallel,
            prefix_cache_mb=0,
            threads=threads or None,
        )
        engine: Any = LlamaEngine(pull(), settings, gpu_layers=0, prefix_folder=None)
    else:
        engine = ScriptedEngine([f"w{i} " for i in range(TOKENS)], delay=delay)
    app = create_app(ResponsesService(engine), SqlStore(store))
    app.add_route("/bench/timings", _timings())
    settle_heap()  # as `oars serve` does: a full collection paused every stream 160 ms

    async def arriving(scope: Any, receive: Any, send: Any) -> None:
        _ARRIVED.set(time.perf_counter())  # seen by the tasks the request starts
        await app(scope, receive, send)

    uvicorn.run(arriving, host="127.0.0.1", port=port, log_level="warning")


_ARRIVED: contextvars.ContextVar[float | None] = contextvars.ContextVar("arrived", default=None)


def _timings() -> Callable[[Request], Awaitable[JSONResponse]]:
    """Time in the server each response's first delta, from its event log's start to the
    delta's release (a held log's `release`, an unheld one's `append`), and each delta from
    its append to its reader (the SSE stream takes it from `EventLog.follow`): a route that
    returns the times since it was last asked (seconds), `{"first": […], "read": […]}`."""
    from starlette.responses import JSONResponse

    times: dict[str, list[float]] = {
        "first": [],
        "read": [],
        "write": [],
        "write cpu": [],
        "arrival to log": [],
        "arrival to first": [],
        "first append": [],
    }
    cpu = [time.process_time()]  # the server's CPU when last asked

    async def route(_: Request) -> JSONResponse:
        taken = {name: each.copy() for name, each in times.items()}
        for each in times.values():
            each.clear()
        taken["cpu"], cpu[0] = [time.process_time() - cpu[0]], time.process_time()
        return JSONResponse(taken)

    try:
        from oars.eventlog import EventLog
    except ImportError:  # a tree before the event log: no times
        return route

    started: dict[int, float] = {}  # a log's id: when it began, until its first delta is out
    arrived: dict[int, float] = {}  # a log's id: when its request reached the server
    appended: dict[int, dict[int, float]] = {}  # a log's id: when each delta was appended
    init, append, release, follow = (
        EventLog.__init__,
        EventLog.append,
        EventLog.release,
        EventLog.follow,
    )

    def out(log: EventLog) -> None:
        began = started.get(id(log))
        released = getattr(log, "released", len(log.events))  # (a tree before the hold)
        if began is None or not released:
            return
        if _delta(log.events[:released]):
            times["first"].append(time.perf_counter() - began)
            del started[id(log)]
            if (came := arrived.pop(id(log), None)) is not None:
                times["arrival to first"].append(time.perf_counter() - came)

    def timed_init(log: EventLog) -> None:
        init(log)
        started[id(log)] = time.perf_counter()
        appended[id(log)] = {}
        if (came := _ARRIVED.get()) is not None:
            arrived[id(log)] = came
            times["arrival to log"].append(started[id(log)] - came)

    def timed_append(log: EventLog, events: list[dict[str, Any]]) -> None:
        now, at, mine = time.perf_counter(), len(log.events), appended.get(id(log))
        began = started.get(id(log))
        if began is not None and _delta(events) and not _delta(log.events):
            times["first append"].append(now - began)
        if mine is not None:
            for i, event in enumerate(events):
                if event["type"] == "response.output_text.delta":
                    mine[at + i] = now
        append(log, events)
        out(log)

    def timed_release(log: EventLog, upto: int) -> None:
        release(log, upto)
        out(log)

    async def timed_follow(log: EventLog, after: int = -1, *args: Any) -> AsyncIterator[Any]:
        position = after + 1
        async for batch in follow(log, after, *args):
            now, mine = time.perf_counter(), appended.get(id(log), {})
            for i in range(position, position + len(batch)):
                if (at := mine.pop(i, None)) is not None:
                    times["read"].append(now - at)
            position += len(batch)
            yield batch

    EventLog.__init__ = timed_init  # type: ignore[method-assign, assignment]
    EventLog.append = timed_append  # type: ignore[method-assign, assignment]
    EventLog.release = timed_release  # type: ignore[method-assign, assignment]
    EventLog.follow = timed_follow  # type: ignore[method-assign, assignment]

    from oars.store import SqlStore  # (`serve` has it too)
    from oars.store.lanes import is_sqlite

    write = SqlStore.write

    async def timed_write(store: SqlStore, writes: Writes) -> None:
        # a write of logs alone: its wall time, and the serving loop's CPU during it (on
        # SQLite the transaction runs on the loop, start to end, when no other connection
        # holds the lock; on PostgreSQL the loop serves others meanwhile: not timed)
        logs = not (writes.begun or writes.finished)
        wall, cpu = time.perf_counter(), time.thread_time()
        await write(store, writes)
        if logs:
            times["write"].append(time.perf_counter() - wall)
            if is_sqlite(store.url):
                times["write cpu"].append(time.thread_time() - cpu)

    SqlStore.write = timed_write  # type: ignore[method-assign, assignment]
    return route


def _delta(events: Iterable[dict[str, Any]]) -> bool:
    return any(e["type"] == "response.output_text.delta" for e in events)


def _server(
    tree: Path, store: str, kind: str, parallel: int, threads: int, *, held: bool = True
) -> Server:
    """This file's `serve`, with `tree`'s oars first on the path."""
    from bench.servers import Server  # (not in `serve`: the tree before may have no such module)

    def command(port: int) -> list[str]:
        return [
            *(sys.executable, __file__, "serve", str(port), store, str(DELAY), str(int(held))),
            *(kind, str(parallel), str(threads)),
        ]

    return Server(tree.name, command, env={"PYTHONPATH": str(tree)}, cwd=tree)


async def _connect(base: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


DELTA = b'"response.output_text.delta"'


async def _stream(
    base: str,
    connection: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    kind: str,
    n: int,
) -> tuple[float, list[float]]:
    """Time to the first delta, and the gaps between deltas (seconds), on a connection already
    open. A client of raw bytes: the stream's start is one write, and reading it costs the
    client a count of a marker a read, where an HTTP client's work for 64 streams set when
    their first deltas arrived."""
    body: dict[str, Any] = {"input": "go", "stream": True, "store": True}
    if kind == "model":  # a prompt of each stream's own (no prefix shared past the template)
        body |= {
            "input": f"Write a story about a dragon called {NAMES[n % len(NAMES)]} {n}.",
            "max_output_tokens": MODEL_TOKENS,
            "temperature": 0,
        }
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/responses HTTP/1.1\r\nhost: {base.removeprefix('http://')}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n"
        "connection: close\r\n\r\n"
    ).encode()
    reader, writer = connection
    started = time.perf_counter()
    writer.write(head + payload)
    arrivals: list[float] = []
    tail = b""
    try:
        while chunk := await reader.read(1 << 16):
            now = time.perf_counter()
            data = tail + chunk
            arrivals.extend([now] * data.count(DELTA))  # (a marker split between reads too)
            tail = data[1 - len(DELTA) :]
    finally:
        writer.close()
    assert len(arrivals) == TOKENS or (kind == "model" and arrivals), len(arrivals)
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    return arrivals[0] - started, gaps


LAST = 5  # a stream's last gaps: 64 streams started together end together
NAMES = ("Ash", "Brin", "Cole", "Dara", "Eske", "Fenn", "Gale", "Hale")


async def _load(bases: list[str], streams: int, kind: str, singles: int) -> tuple[list[float], ...]:
    """The first deltas; the gaps between deltas; those but a stream's last `LAST`; those
    last; the first deltas as the server timed them; each delta from its append to its reader
    in the server; each write of logs alone in the server, and the loop's CPU in it; the
    server's CPU over the load (summed over servers); in the server, from each request's
    arrival to its event log, and to its first delta. One stream is asked `singles` times, one
    after another. Stream n goes to server n of `bases` (modulo their number)."""
    async with httpx.AsyncClient(timeout=300) as client:  # the timings' (the streams read raw)
        for base in bases:
            await client.get(f"{base}/bench/timings")  # (from here on)
        busy, every = _ticks()
        if streams == 1:
            results = [
                await _stream(bases[0], await _connect(bases[0]), kind, n) for n in range(singles)
            ]
        else:  # every connection open first: the streams then start in one turn of the loop
            targets = [bases[n % len(bases)] for n in range(streams)]
            connections = await asyncio.gather(*map(_connect, targets))
            results = await asyncio.gather(
                *(
                    _stream(base, connection, kind, n)
                    for n, (base, connection) in enumerate(zip(targets, connections, strict=True))
                )
            )
        now_busy, now_every = _ticks()
        in_server: dict[str, list[float]] = {}
        for base in bases:
            for name, times in (await client.get(f"{base}/bench/timings")).json().items():
                in_server.setdefault(name, []).extend(times)
        in_server["cpu"] = [sum(in_server.get("cpu", []))]
    share = (now_busy - busy) / max(1, now_every - every)
    print(f"{streams} streams: the box's cores {share:.0%} busy", file=sys.stderr)
    gaps = [each for _, each in results]
    return (
        [first for first, _ in results],
        [g for each in gaps for g in each],
        [g for each in gaps for g in each[:-LAST]],
        [g for each in gaps for g in each[-LAST:]],
        in_server["first"],
        in_server["read"],
        in_server.get("write", []),
        in_server.get("write cpu", []),
        in_server.get("cpu", []),
        in_server.get("arrival to log", []),
        in_server.get("arrival to first", []),
        in_server.get("first append", []),
    )


def _ticks() -> tuple[int, int]:
    """The box's CPU time so far, busy and in all (clock ticks, all cores)."""
    with open("/proc/stat") as stat:
        ticks = [int(n) for n in stat.readline().split()[1:]]
    every = sum(ticks[:8])  # user, nice, system, idle, iowait, irq, softirq, steal
    return every - ticks[3] - ticks[4], every


def _pct(values: list[float], q: float) -> float:
    from bench.servers import percentile  # (not at the top: see `_server`)

    return percentile(values, q) * 1000


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        port, store, delay, held, kind, at_once, threads = sys.argv[2:9]
        serve(int(port), store, float(delay), held == "1", kind, int(at_once), int(threads))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="a tree, or 'unheld'")
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--streams", default="1,64")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--store", default="sqlite")
    parser.add_argument("--engine", choices=("scripted", "model"), default="scripted")
    parser.add_argument("--singles", type=int, default=1, help="one stream's asks a rep")
    parser.add_argument(
        "--threads", type=int, default=0, help="the model's CPU threads (default: one a core)"
    )
    parser.add_argument(
        "--servers",
        type=int,
        default=1,
        help="server processes a side, on the one store, the streams spread over them",
    )
    args = parser.parse_args()
    parallel = max(map(int, args.streams.split(",")))
    from bench.servers import alternate

    folder = Path(tempfile.mkdtemp())
    # each rep's first deltas, gaps and last gaps, by side and number of streams
    results: dict[tuple[str, int], list[tuple[list[float], ...]]] = {}
    unheld = args.before == "unheld"
    trees = {"before": args.after if unheld else Path(args.before), "after": args.after}

    def run(name: str, rep: int) -> None:
        store = f"sqlite:///{folder}/{name}.db" if args.store == "sqlite" else args.store
        held = not (unheld and name == "before")
        with contextlib.ExitStack() as servers:
            bases = [
                servers.enter_context(
                    _server(trees[name], store, args.engine, parallel, args.threads, held=held)
                ).base
                for _ in range(args.servers)
            ]
            for streams in map(int, args.streams.split(",")):
                asyncio.run(_load(bases, streams, args.engine, args.singles))  # a warm-up
                results.setdefault((name, streams), []).append(
                    asyncio.run(_load(bases, streams, args.engine, args.singles))
                )
        print(f"{name}, rep {rep + 1} of {args.reps} done", file=sys.stderr)

    alternate(["before", "after"], args.reps, run)
    rows = []
    labels = (  # in the order `_load` returns them
        "first delta",
        "between deltas",
        f"between deltas, but a stream's last {LAST}",
        f"between a stream's last {LAST + 1} deltas",
        "first delta, in the server",
        "a delta from its append to its reader, in the server",
        "a write of logs alone, in the server",
        "the serving loop's CPU in it (SQLite)",
        "the server's CPU in a load (a value a rep)",
        "from the request's arrival to its event log, in the server",
        "from the request's arrival to the first delta, in the server",
        "from the event log's start to the first delta's append, in the server",
    )
    for streams in map(int, args.streams.split(",")):
        for i, label in enumerate(labels):
            b_reps = [rep[i] for rep in results[("before", streams)]]
            a_reps = [rep[i] for rep in results[("after", streams)]]
            b = [v for rep in b_reps for v in rep]
            a = [v for rep in a_reps for v in rep]
            if not (a and b):  # (a tree that times nothing in its server)
                continue
            row: dict[str, object] = {"streams": streams, "measure": label}
            for q, name in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
                row[f"{name} before ms"] = round(_pct(b, q), 1)
                row[f"{name} after ms"] = round(_pct(a, q), 1)
            row["p99 after - before ms"] = round(_pct(a, 0.99) - _pct(b, 0.99), 1)
            # rep by rep (rep i of each side ran side by side): the median and range
            each = [
                _pct(y, 0.99) - _pct(x, 0.99)
                for x, y in zip(b_reps, a_reps, strict=True)
                if x and y  # (a rep may time no write of logs alone on a side)
            ]
            if each:
                row["reps' p99 after - before ms"] = round(statistics.median(each), 1)
                row["reps' range"] = f"{min(each):.1f} to {max(each):.1f}"
            rows.append(row)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

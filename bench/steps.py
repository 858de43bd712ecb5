"""The measures of oars against a reference server, each a Step: what a rep runs on one
server, and the rows that oars's results (the first endpoint's) and a reference's make.
`bench.vs_llama_server` runs them against llama-server, `bench.run` the ones that are targets
(their rows carry a `target`)."""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from bench.clients import Endpoint, Stream, aggregate
from bench.prompts import COUNT, chat, conversation, counting
from bench.servers import Row, alternate, thread_cpu

Endpoints = tuple[Endpoint, ...]  # oars first, then the llama-servers it is measured against


@dataclass
class Step:
    """One measure: what a rep runs on a server, and the rows from oars's results (first) and
    one reference's."""

    name: str
    run: Callable[[Endpoint, int], Any]
    rows: Callable[[list[Any], list[Any]], list[Row]]
    reps: int

    def measure(self, endpoints: Endpoints) -> list[Row]:
        results = alternate(endpoints, self.reps, self.run)
        return [
            dataclasses.replace(row, against=reference.name)
            for reference, theirs in zip(endpoints[1:], results[1:], strict=True)
            for row in self.rows(results[0], theirs)
        ]


def decode(reps: int, tokens: int) -> Step:
    def run(server: Endpoint, rep: int) -> Stream:
        return server.one(chat(f"decode {rep}", 20, COUNT), tokens)

    return Step(
        "decode",
        run,
        lambda a, b: [
            Row.of(
                f"decode tok/s, 1 stream, {tokens} tokens",
                [s.decode_tps for s in a],
                [s.decode_tps for s in b],
                "tok/s",
                1,
                target="decode",
            )
        ],
        reps,
    )


def whole(reps: int, tokens: int) -> Step:
    """One stream's reply streamed and the same kind of reply in one body, wall time an output
    token: what the per-token stream costs each server (its events, its writes, the client's
    reads), apart from generating the tokens."""

    def run(server: Endpoint, rep: int) -> tuple[float, float]:
        streamed = server.one(chat(f"streamed {rep}", 20, COUNT), tokens)
        wall, produced = server.whole(chat(f"whole {rep}", 20, COUNT), tokens)
        if not produced:
            raise RuntimeError(f"{server.name}: a whole reply with no usage")
        return (streamed.end - streamed.start) / streamed.output_tokens, wall / produced

    return Step(
        "whole",
        run,
        lambda a, b: [
            Row.of(
                f"1 stream, {tokens} tokens, {kind}: wall ms an output token",
                [r[i] * 1000 for r in a],
                [r[i] * 1000 for r in b],
                "ms",
                2,
            )
            for i, kind in enumerate(("streamed", "whole reply (not streamed)"))
        ],
        reps,
    )


def ttft(reps: int) -> Step:
    def run(server: Endpoint, rep: int) -> tuple[Stream, Stream]:
        prompt = chat(f"ttft {rep}", 80, "Say hello.")
        return server.one(prompt, 4), server.one(prompt, 4)

    return Step(
        "ttft",
        run,
        lambda a, b: [
            Row(
                "prompt tokens, ~100-token prompt",
                a[0][0].prompt_tokens,
                b[0][0].prompt_tokens,
                "",
                0,
            ),
            Row.of(
                "TTFT, cold ~100-token prompt",
                [c.ttft for c, _ in a],
                [c.ttft for c, _ in b],
                "s",
            ),
            Row.of(
                "TTFT, the same prompt again (cached)",
                [w.ttft for _, w in a],
                [w.ttft for _, w in b],
                "s",
            ),
        ],
        reps,
    )


def prefill(reps: int) -> Step:
    def run(server: Endpoint, rep: int) -> Stream:
        return server.one(chat(f"prefill {rep}", 2000, "Summarize the notes in one sentence."), 4)

    return Step(
        "prefill",
        run,
        lambda a, b: [
            Row("prompt tokens, 2,000-token prompt", a[0].prompt_tokens, b[0].prompt_tokens, "", 0),
            Row.of(
                "TTFT, fresh 2,000-token prompt (prefill)",
                [s.ttft for s in a],
                [s.ttft for s in b],
                "s",
                target="prefill",
            ),
        ],
        reps,
    )


def scaling(reps: int, tokens: int) -> Step:
    def run(server: Endpoint, rep: int) -> tuple[float, list[Stream]]:
        single = aggregate(server.many(counting(f"one {rep}", 1), tokens))
        return single, server.many(counting(f"four {rep}", 4), tokens)

    return Step(
        "scaling",
        run,
        lambda a, b: [
            Row.of(
                f"aggregate tok/s, 1 stream, {tokens} tokens (wall)",
                [x for x, _ in a],
                [x for x, _ in b],
                "tok/s",
                1,
            ),
            Row.of(
                f"aggregate tok/s, 4 concurrent streams, {tokens} tokens each",
                [aggregate(y) for _, y in a],
                [aggregate(y) for _, y in b],
                "tok/s",
                1,
                target="streams4",
            ),
            Row.of(
                "**scaling, 4 streams / 1 stream**",
                [aggregate(y) / x for x, y in a],
                [aggregate(y) / x for x, y in b],
                "×",
                2,
            ),
            Row.of(
                "4 streams: slowest first token",
                [max(s.ttft for s in y) for _, y in a],
                [max(s.ttft for s in y) for _, y in b],
                "s",
            ),
            Row.of(
                "4 streams: time between two tokens of a stream (median)",
                [statistics.median(s.between_ms for s in y) for _, y in a],
                [statistics.median(s.between_ms for s in y) for _, y in b],
                "ms",
                1,
            ),
        ],
        reps,
    )


def _overlapped(streams: list[Stream]) -> int:
    """Streams whose first token came while some other stream had not finished yet."""
    ends = [s.end for s in streams]
    return sum(s.first < max(ends[:i] + ends[i + 1 :]) for i, s in enumerate(streams))


def sixteen(reps: int, tokens: int) -> Step:
    def run(server: Endpoint, rep: int) -> list[Stream]:
        return server.many(counting(f"sixteen {rep}", 16), tokens)

    return Step(
        "sixteen",
        run,
        lambda a, b: [
            Row(
                f"16 concurrent streams of {tokens} tokens: completed (all reps)",
                sum(len(r) for r in a),
                sum(len(r) for r in b),
                "",
                0,
            ),
            Row.of(
                "16 streams: max TTFT",
                [max(s.ttft for s in r) for r in a],
                [max(s.ttft for s in r) for r in b],
                "s",
                target="first16",
            ),
            Row(
                "16 streams: first token while another still ran (worst rep, of 16)",
                min(_overlapped(r) for r in a),
                min(_overlapped(r) for r in b),
                "",
                0,
            ),
            Row.of(
                "16 streams: aggregate tok/s",
                [aggregate(r) for r in a],
                [aggregate(r) for r in b],
                "tok/s",
                1,
                target="streams16",
            ),
        ],
        reps,
    )


def beside(reps: int, tokens: int) -> Step:
    """The CPU a server spends beside llama.cpp's threads (HTTP, events, sampling hand-off):
    on 2 cores every millisecond of it is taken from a step. llama.cpp's threads are the ones
    busy for at least half the load's wall time; the rest is counted, per output token."""

    def run(server: Endpoint, rep: int) -> list[float]:
        pid = server.server.pid
        out = []
        for streams in (1, 4):
            before = thread_cpu(pid)
            began = time.perf_counter()
            done = server.many(counting(f"beside {rep} {streams}", streams), tokens)
            wall = time.perf_counter() - began
            used = [cpu - before.get(tid, 0.0) for tid, cpu in thread_cpu(pid).items()]
            spent = sum(cpu for cpu in used if cpu < wall / 2)
            out.append(spent * 1000 / sum(s.output_tokens for s in done))
        return out

    return Step(
        "beside",
        run,
        lambda a, b: [
            Row.of(
                f"CPU beside llama.cpp's threads, {streams} stream(s): ms a token",
                [r[i] for r in a],
                [r[i] for r in b],
                "ms",
                3,
            )
            for i, streams in enumerate((1, 4))
        ],
        reps,
    )


def agent(reps: int) -> Step:
    def run(server: Endpoint, rep: int) -> tuple[Stream, Stream]:
        turns = conversation(f"agent {rep}")
        before = server.one(turns, 16)
        turns += [
            {"role": "assistant", "content": before.text},
            {"role": "user", "content": "Now rename the variable x to y."},
        ]
        return before, server.one(turns, 4)

    return Step(
        "agent",
        run,
        lambda a, b: [
            Row("agent turn N: prompt tokens", a[0][1].prompt_tokens, b[0][1].prompt_tokens, "", 0),
            Row(
                "agent turn N: previous turn's prompt + output tokens",
                a[0][0].prompt_tokens + a[0][0].output_tokens,
                b[0][0].prompt_tokens + b[0][0].output_tokens,
                "",
                0,
            ),
            Row(
                "agent turn N: cached tokens reported (min over reps)",
                min(n.cached_tokens for _, n in a),
                min(n.cached_tokens for _, n in b),
                "",
                0,
            ),
            Row.of(
                "agent turn N: TTFT",
                [n.ttft for _, n in a],
                [n.ttft for _, n in b],
                "s",
                target="agent",
            ),
        ],
        reps,
    )


def codex(reps: int) -> Step:
    def run(server: Endpoint, rep: int) -> tuple[Stream, Stream]:
        session = chat(f"codex {rep}", 8000, "Where is the main entry point?")
        cold = server.one(session, 4)
        server.server.stop()
        server.server.start()
        session[1] = {"role": "user", "content": "List the files you would read first."}
        return cold, server.one(session, 4)

    return Step(
        "codex",
        run,
        lambda a, b: [
            Row(
                "Codex session: prompt tokens", a[0][1].prompt_tokens, b[0][1].prompt_tokens, "", 0
            ),
            Row.of(
                "Codex session: TTFT, first send (cold)",
                [c.ttft for c, _ in a],
                [c.ttft for c, _ in b],
                "s",
            ),
            Row(
                "Codex session: cached tokens after the restart (min over reps)",
                min(n.cached_tokens for _, n in a),
                min(n.cached_tokens for _, n in b),
                "",
                0,
            ),
            Row.of(
                "**Codex session: TTFT after a server restart**",
                [n.ttft for _, n in a],
                [n.ttft for _, n in b],
                "s",
                target="restart",
            ),
        ],
        reps,
    )


STEPS = ("decode", "whole", "ttft", "prefill", "scaling", "sixteen", "beside", "agent", "codex")


def steps(
    reps: int, tokens: int, tokens16: int = 48, codex_reps: int = 1, only: Iterable[str] = ()
) -> list[Step]:
    """The measures of STEPS (or of `only`), in that order."""
    every = {
        "decode": lambda: decode(reps, tokens),
        "whole": lambda: whole(reps, tokens),
        "ttft": lambda: ttft(reps),
        "prefill": lambda: prefill(reps),
        "scaling": lambda: scaling(reps, tokens),
        "sixteen": lambda: sixteen(reps, tokens16),
        "beside": lambda: beside(reps, tokens),
        "agent": lambda: agent(reps),
        "codex": lambda: codex(codex_reps),
    }
    chosen = set(only) or set(STEPS)
    unknown = chosen - set(STEPS)
    if unknown:
        raise SystemExit(f"no such step: {', '.join(sorted(unknown))} (of {', '.join(STEPS)})")
    return [every[name]() for name in STEPS if name in chosen]


def measure(endpoints: Endpoints, chosen: list[Step]) -> list[Row]:
    """Each step on the started endpoints, after a warm-up request on each."""
    for endpoint in endpoints:
        endpoint.one(chat("warm-up", 20, "Say hello."), 4)
    rows: list[Row] = []
    for step in chosen:
        start = time.perf_counter()
        rows += step.measure(endpoints)
        print(f"{step.name}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return rows

"""What a token costs through each front door: Chat Completions and Anthropic Messages against
Responses, on the real embedded model.

The question (issue 49): `/v1/chat/completions` and `/v1/messages` are translated onto the
Responses run (`oars.chat`, `oars.messages`, the stream re-encoded event by event); does a
streamed token cost more through them than through `/v1/responses`?

One `oars serve` (the default model, no store) and the three doors asked the same kind of
request: a short chat asking for a long count (new from its first token, so no cache), greedy,
a fixed number of output tokens that the count never reaches. A rep asks each door in turn for
`--singles` streams one after the other, then each door in turn for `--streams` at once; the
doors' order rotates rep by rep, so the loads compared are seconds apart and each door goes
first as often. The client reads the raw SSE lines (httpx, no SDK) and stamps each text delta
as it arrives; the server's event loop thread (its main thread) is read for its CPU around
each load, the one figure a busy machine leaves nearly alone. `--encode` times only what
a door adds a token, in this process: one text delta encoded in each door's wire form.

    python -m bench.lab.front_doors [--reps 6] [--tokens 64] [--singles 3] [--streams 4]
        [--threads N] [--minutes 15]
    python -m bench.lab.front_doors --encode

On a shared machine, `--threads 1` spares the engine the stalls of two threads waiting for
each other at every step when one is descheduled; `--minutes` starts no rep past its budget.

Per door and rep: the median time to the first text delta, the p50 and p99 of the gaps between
deltas (all streams of the load pooled), a stream's tokens/s after its first delta (median),
the aggregate tokens/s of the concurrent load, and the loop's CPU ms a token. The table gives
the median over reps of each, the door over Responses, and the spread of the reps' ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.prompts import Chat, counting
from bench.servers import Server, median, oars_serve, paired, spread, thread_cpu
from oars.weights import pull

Json = dict[str, Any]


@dataclass
class Stream:
    """One streamed request, timed on the client (perf_counter seconds)."""

    start: float
    arrivals: list[float] = field(default_factory=list)  # of each non-empty text delta
    end: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.arrivals)]

    @property
    def tps(self) -> float:
        """Tokens a second after the first delta."""
        return (self.output_tokens - 1) / (self.arrivals[-1] - self.arrivals[0])


def _responses_body(chat: Chat, tokens: int) -> Json:
    return {"model": "bench", "instructions": chat[0]["content"], "input": chat[1:],
            "temperature": 0, "max_output_tokens": tokens, "stream": True, "store": False}  # fmt: skip


def _responses_event(event: Json, stream: Stream, now: float) -> None:
    if event["type"] == "response.output_text.delta" and event["delta"]:
        stream.arrivals.append(now)
    elif event["type"] in ("response.completed", "response.incomplete"):
        usage = event["response"]["usage"]
        stream.prompt_tokens, stream.output_tokens = usage["input_tokens"], usage["output_tokens"]


def _chat_body(chat: Chat, tokens: int) -> Json:
    return {"model": "bench", "messages": chat, "temperature": 0, "max_tokens": tokens,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip


def _chat_event(event: Json, stream: Stream, now: float) -> None:
    if any((c.get("delta") or {}).get("content") for c in event.get("choices") or ()):
        stream.arrivals.append(now)
    if event.get("usage"):
        usage = event["usage"]
        stream.prompt_tokens = usage["prompt_tokens"]
        stream.output_tokens = usage["completion_tokens"]


def _messages_body(chat: Chat, tokens: int) -> Json:
    return {"model": "bench", "system": chat[0]["content"], "messages": chat[1:],
            "temperature": 0, "max_tokens": tokens, "stream": True}  # fmt: skip


def _messages_event(event: Json, stream: Stream, now: float) -> None:
    if event["type"] == "content_block_delta" and event["delta"].get("text"):
        stream.arrivals.append(now)
    elif event["type"] == "message_delta":
        usage = event["usage"]
        stream.prompt_tokens, stream.output_tokens = usage["input_tokens"], usage["output_tokens"]


@dataclass(frozen=True)
class Door:
    """A front door: its path, the body it takes, and how its events land in a Stream."""

    name: str
    path: str
    body: Callable[[Chat, int], Json]
    event: Callable[[Json, Stream, float], None]


DOORS = (
    Door("responses", "/v1/responses", _responses_body, _responses_event),
    Door("chat", "/v1/chat/completions", _chat_body, _chat_event),
    Door("messages", "/v1/messages", _messages_body, _messages_event),
)


async def _stream(client: httpx.AsyncClient, base: str, door: Door, chat: Chat, n: int) -> Stream:
    stream = Stream(time.perf_counter())
    async with client.stream("POST", base + door.path, json=door.body(chat, n)) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{door.name}: HTTP {r.status_code}: {(await r.aread())[:500]!r}")
        async for line in r.aiter_lines():
            now = time.perf_counter()  # before parsing: the bytes' arrival, not the client's work
            if line.startswith("data: ") and line != "data: [DONE]":
                door.event(json.loads(line[6:]), stream, now)
    stream.end = time.perf_counter()
    if stream.output_tokens != n or len(stream.arrivals) < 2:
        raise RuntimeError(f"{door.name}: {stream.output_tokens} tokens, wanted {n}")
    return stream


async def _gather(base: str, door: Door, chats: list[Chat], tokens: int) -> list[Stream]:
    limits = httpx.Limits(max_connections=len(chats) + 1)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        return list(await asyncio.gather(*(_stream(client, base, door, c, tokens) for c in chats)))


@dataclass
class Load:
    """What one door's load gave: its streams and the server loop's CPU seconds over it."""

    streams: list[Stream]
    loop_cpu: float

    def measures(self, concurrent: bool) -> dict[str, float]:
        gaps = sorted(g for s in self.streams for g in s.gaps)
        tokens = sum(s.output_tokens for s in self.streams)
        out = {
            "first delta, ms (median)": median(s.arrivals[0] - s.start for s in self.streams) * 1e3,
            "between deltas p50, ms": gaps[len(gaps) // 2] * 1e3,
            "between deltas p99, ms": gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))] * 1e3,
            "tokens/s of a stream (median)": median(s.tps for s in self.streams),
            "server loop CPU, ms a token": self.loop_cpu / tokens * 1e3,
        }
        if concurrent:
            wall = max(s.end for s in self.streams) - min(s.start for s in self.streams)
            out["aggregate tokens/s"] = tokens / wall
        return out


def loop_cpu(pid: int) -> float:
    """CPU seconds of the process's main thread (the server's event loop): the scheduler's
    own count (microseconds) where the kernel shows it, else the clock ticks of `/proc` (10 ms,
    too coarse for a few hundred tokens)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/sched") as f:
            for line in f:
                if line.startswith("se.sum_exec_runtime"):
                    return float(line.split(":")[1]) / 1e3
    except FileNotFoundError:
        pass
    return thread_cpu(pid).get(pid, 0.0)


def _load(server: Server, door: Door, batches: list[list[Chat]], tokens: int) -> Load:
    """The batches one after the other, each batch's chats at once."""
    before = loop_cpu(server.pid)
    streams = [
        s for chats in batches for s in asyncio.run(_gather(server.base, door, chats, tokens))
    ]
    return Load(streams, loop_cpu(server.pid) - before)


@dataclass
class Found:
    """Each rep's measures by (door, level), and the prompt lengths each door reported (the
    same chats, templated through each door, should be the same number of tokens)."""

    measures: dict[tuple[str, str], list[dict[str, float]]] = field(default_factory=dict)
    prompts: dict[str, set[int]] = field(default_factory=dict)


def _round(server: Server, args: argparse.Namespace, found: Found, rep: int) -> None:
    """One rep of every door at each level, the doors one after another (their order rotated
    rep by rep), so that the three loads of a level are seconds apart."""
    for level, concurrent in (("1 stream", False), (f"{args.streams} streams", True)):
        for i in range(len(DOORS)):
            door = DOORS[(i + rep) % len(DOORS)]
            seed = f"{door.name} {rep} {level}"
            chats = counting(seed, args.streams if concurrent else args.singles)
            batches = [chats] if concurrent else [[chat] for chat in chats]
            load = _load(server, door, batches, args.tokens)
            found.measures.setdefault((door.name, level), []).append(load.measures(concurrent))
            found.prompts.setdefault(door.name, set()).update(s.prompt_tokens for s in load.streams)


def _table(found: Found, levels: list[str]) -> str:
    """Responses' medians, and each other door's with its ratio to them (the reps' range)."""
    lines = [
        "| streams | measure | responses | chat | chat / responses | messages | messages / "
        "responses |",
        "|---" * 7 + "|",
    ]
    for level in levels:
        reference = found.measures[("responses", level)]
        for measure in reference[0]:
            ref = [m[measure] for m in reference]
            cells = [f"{median(ref):,.2f}"]
            for door in ("chat", "messages"):
                values = [m[measure] for m in found.measures[(door, level)]]
                reps = spread(paired(values, ref))
                ratio = f"**{median(values) / median(ref):.3f}**" + (f" ({reps})" if reps else "")
                cells += [f"{median(values):,.2f}", ratio]
            lines.append(f"| {level} | {measure} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def encoding() -> dict[str, float]:
    """Microseconds to encode one text delta as each door sends it (the run's event, a chat
    chunk, a Messages event), in this process: the most a door's translation adds a token."""
    from oars.chat import ChunkStream
    from oars.http.sse import encode
    from oars.jsonfast import dumps_bytes
    from oars.messages import EventStream

    response = {"id": "resp_0123456789abcdef", "created_at": 1, "model": "bench", "output": []}
    created = {"type": "response.created", "sequence_number": 0, "response": response}
    message = {"type": "message", "id": "msg_0123456789abcdef", "role": "assistant"}
    added = {"type": "response.output_item.added", "output_index": 0, "item": message}
    delta = {"type": "response.output_text.delta", "sequence_number": 5, "output_index": 0,
             "item_id": message["id"], "content_index": 0, "delta": "17", "logprobs": []}  # fmt: skip
    chunks, events = ChunkStream(include_usage=True), EventStream()
    for event in (created, added):
        chunks.feed(event)
        events.feed(event)

    def chat() -> bytes:
        return b"".join(b"data: " + dumps_bytes(c) + b"\n\n" for c in chunks.feed(delta))

    def messages() -> bytes:
        return b"".join(
            b"event: " + name.encode() + b"\ndata: " + dumps_bytes(data) + b"\n\n"
            for name, data in events.feed(delta)
        )

    doors = {"responses": lambda: encode(delta), "chat": chat, "messages": messages}
    n = 100_000
    return {name: min(timeit.repeat(f, number=n, repeat=5)) / n * 1e6 for name, f in doors.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--minutes", type=float, default=15, help="no new rep past this")
    parser.add_argument("--threads", type=int, help="the engine's (default: oars's)")
    parser.add_argument("--tokens", type=int, default=64, help="output tokens a stream")
    parser.add_argument("--singles", type=int, default=3, help="1-stream requests a rep")
    parser.add_argument("--streams", type=int, default=4, help="concurrent streams")
    parser.add_argument("--encode", action="store_true", help="only time the encoding")
    args = parser.parse_args()
    if args.encode:
        cost = encoding()
        print(" · ".join(f"{name} {us:.2f} µs" for name, us in cost.items()), "a text delta")
        return
    home = Path(tempfile.mkdtemp(prefix="front-doors-"))
    model = ["--model", str(pull(quiet=True)), "--store", "none", "--log-level", "warning"]
    model += ["--threads", str(args.threads)] if args.threads else []
    found = Found()
    server = Server("oars", lambda port: oars_serve(port, *model), home / "oars.log",
                    env={"OARS_HOME": str(home)})  # fmt: skip
    with server:
        for door in DOORS:  # the engine's first requests cost more than the next ones
            asyncio.run(_gather(server.base, door, counting(f"warm {door.name}", 1), 8))
        began, reps = time.monotonic(), 0
        while reps < args.reps and time.monotonic() - began < args.minutes * 60:
            _round(server, args, found, reps)
            reps += 1
            print(f"rep {reps} of {args.reps} done", file=sys.stderr)
    prompts = {name: sorted(lengths) for name, lengths in found.prompts.items()}
    print(f"{args.tokens} output tokens a stream, {reps} reps, {args.singles} 1-stream "
          f"requests and {args.streams} concurrent a rep; prompt tokens {prompts}\n")  # fmt: skip
    print(_table(found, ["1 stream", f"{args.streams} streams"]))


if __name__ == "__main__":
    main()

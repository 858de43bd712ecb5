"""oars against llama.cpp's own `llama-server` on the same GGUF, as ratios oars / llama-server.

    make llama-server     # once: build/llama-server/bin/llama-server
    .venv/bin/python -m bench.vs_llama_server [--reps 3] [--oars-args "--parallel 4"] [--json]
    .venv/bin/python -m bench.vs_llama_server --account [--reps 2]   # what each pass was

The reference is built by `make llama-server` from the llama.cpp vendored in the sdist of the
installed llama-cpp-python, so both servers run the same ggml kernels. pip built that wheel here
from source with llama.cpp's defaults (Release, GGML_NATIVE i.e. -march=native, OpenMP, llamafile
kernels; its system info shows AVX512 on this machine), and the target asks for the same flags
(static libraries instead of shared ones; no curl, OpenSSL or web UI: nothing a benchmark uses).

Both servers live for the whole run, on the same GGUF with the same threads, but only one is
driven at a time: every measure alternates oars / llama-server rep by rep, so machine noise hits
both alike. llama-server gets `--parallel` slots (default 4) of `--ctx` tokens each, with its
prompt cache on (its default). Both get the same messages, each rendering them with the GGUF's
chat template (the table reports both prompt token counts), sampled greedily (temperature 0). oars
is asked `POST /v1/responses` (`instructions` + input messages), llama-server `POST
/v1/chat/completions`, both streamed; a first token is the first text delta.

1. decode tok/s of one stream (tokens from usage, after the first);
2. one stream's reply streamed, and one in a single body (not streamed): wall time an output
   token each, so that what the stream itself costs each server shows (`whole`);
3. time to first token of a fresh ~100-token prompt, then of the same prompt again (cached);
4. time to first token of a fresh 2,000-token prompt (prefill);
5. aggregate tok/s of 4 concurrent streams over that of 1, on each server (scaling);
6. 16 concurrent streams: all complete, the slowest first token, and whether each stream's first
   token came while another stream was still running (a one-at-a-time server fails this);
7. the CPU each server's process spends beside llama.cpp's threads, per output token, at 1 and 4
   streams (its HTTP, its events; by the threads' times in `/proc`);
8. an agent's next turn: a 2,000-token conversation is sent, then again with the reply and a
   short new user turn; time to first token, and the prompt tokens each server reports cached;
9. a Codex-sized new session: an ~8,000-token system prompt is sent, the server restarted, then
   the same system prompt with another user message: time to first token after the restart. oars
   keeps its OARS_HOME (a temporary folder kept for the run); llama-server keeps nothing on disk.
   An 8,000-token prefill takes over a minute on 2 cores, so this one runs `--codex-reps` (1).

Each row also gives the range of the reps' own ratios (rep i of oars against rep i of
llama-server, which ran next to each other). `--llama-args` given twice or more starts a
llama-server for each (e.g. with and without `--no-repack`), and every rep rotates through all
the servers; each measure then has a row against each of them.

`--account` measures none of that: it runs 1, 4 and 16 streams on each server with debug logs and
reads back from them what every forward pass was (`bench/passes.py`): how many passes, how many
graphs (ubatches) each, the KV cells each attended over, the pass times and the time between.
The logs slow both servers, so its wall times are not the table's.

On 2 cores the defaults take about 14 minutes. Another busy process ruins every number: llama.cpp's
threads wait for each other at every step, so one descheduled thread stalls them all.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import itertools
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from bench import passes
from oars.weights import pull
from tests.model.conftest import _free_port, _wait_ready

T = TypeVar("T")
LLAMA_SERVER = Path(__file__).resolve().parents[1] / "build/llama-server/bin/llama-server"
Chat = list[dict[str, str]]
COUNT = "Count from 1 to 300, separated by commas, and nothing else."
WORDS = (
    "alpha",
    "batch",
    "cache",
    "delta",
    "engine",
    "filter",
    "gamma",
    "handler",
    "index",
    "jitter",
    "kernel",
    "lambda",
    "matrix",
    "node",
    "offset",
    "parser",
    "queue",
    "router",
    "stream",
    "tensor",
    "update",
    "vector",
    "worker",
    "buffer",
    "commit",
    "socket",
    "thread",
    "module",
    "import",
    "return",
    "value",
    "config",
    "branch",
)


@dataclass
class Stream:
    """One streamed request, timed on the client (perf_counter seconds)."""

    start: float
    first: float = 0.0
    last: float = 0.0
    end: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    text: str = ""
    arrivals: list[float] = field(default_factory=list)  # of each text delta

    def add(self, text: str, now: float) -> None:
        self.first = self.first or now
        self.last = now
        self.text += text
        self.arrivals.append(now)

    @property
    def between_ms(self) -> float:
        """The median time between two text deltas (one a token on both servers)."""
        gaps = [b - a for a, b in itertools.pairwise(self.arrivals)]
        return statistics.median(gaps) * 1000 if gaps else float("nan")

    @property
    def ttft(self) -> float:
        return self.first - self.start

    @property
    def decode_tps(self) -> float:
        return (self.output_tokens - 1) / (self.last - self.first)


def _oars_body(chat: Chat, max_tokens: int) -> dict[str, Any]:
    return {
        "model": "bench",
        "instructions": chat[0]["content"],
        "input": chat[1:],
        "temperature": 0,
        "max_output_tokens": max_tokens,
        "stream": True,
        "store": False,
    }


def _oars_event(event: dict[str, Any], stream: Stream, now: float) -> None:
    if event["type"] == "response.output_text.delta":
        stream.add(event["delta"], now)
    elif event["type"] in ("response.completed", "response.incomplete"):
        usage = event["response"]["usage"]
        stream.prompt_tokens, stream.output_tokens = usage["input_tokens"], usage["output_tokens"]
        stream.cached_tokens = (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)


def _llama_body(chat: Chat, max_tokens: int) -> dict[str, Any]:
    return {
        "messages": chat,
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _llama_event(event: dict[str, Any], stream: Stream, now: float) -> None:
    text = "".join((c.get("delta") or {}).get("content") or "" for c in event.get("choices", []))
    if text:
        stream.add(text, now)
    if event.get("usage"):
        stream.prompt_tokens = event["usage"]["prompt_tokens"]
        stream.output_tokens = event["usage"]["completion_tokens"]
    if event.get("timings"):
        stream.cached_tokens = event["timings"].get("cache_n", 0)


@dataclass
class Server:
    """A server process the bench can restart, and how to talk to it."""

    name: str
    cmd: Callable[[int], list[str]]  # the command line for a port
    path: str
    body: Callable[[Chat, int], dict[str, Any]]
    event: Callable[[dict[str, Any], Stream, float], None]
    log: Path
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    proc: subprocess.Popen[bytes] | None = None
    base: str = ""

    def start(self) -> None:
        port = _free_port()
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.cmd(port), stdout=out, stderr=subprocess.STDOUT, env=self.env
            )
        self.base = f"http://127.0.0.1:{port}"
        _wait_ready(self.base, self.proc, self.log)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    async def stream(self, client: httpx.AsyncClient, chat: Chat, max_tokens: int) -> Stream:
        stream = Stream(time.perf_counter())
        body = self.body(chat, max_tokens)
        async with client.stream("POST", f"{self.base}{self.path}", json=body) as r:
            if r.status_code != 200:
                raise RuntimeError(
                    f"{self.name}: HTTP {r.status_code}: {(await r.aread())[:500]!r}"
                )
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    self.event(json.loads(line[6:]), stream, time.perf_counter())
        stream.end = time.perf_counter()
        if not stream.first or not stream.output_tokens:
            raise RuntimeError(f"{self.name}: a stream with no text or no usage")
        return stream

    async def _gather(self, chats: list[Chat], max_tokens: int) -> list[Stream]:
        limits = httpx.Limits(max_connections=len(chats) + 1)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            return list(await asyncio.gather(*(self.stream(client, c, max_tokens) for c in chats)))

    def many(self, chats: list[Chat], max_tokens: int) -> list[Stream]:
        """The chats streamed concurrently, each from its own connection."""
        return asyncio.run(self._gather(chats, max_tokens))

    def one(self, chat: Chat, max_tokens: int) -> Stream:
        return self.many([chat], max_tokens)[0]

    def whole(self, chat: Chat, max_tokens: int) -> tuple[float, int]:
        """The chat answered in one JSON body, not streamed: (wall seconds, output tokens)."""
        body = {**self.body(chat, max_tokens), "stream": False}
        body.pop("stream_options", None)
        began = time.perf_counter()
        r = httpx.post(f"{self.base}{self.path}", json=body, timeout=600)
        wall = time.perf_counter() - began
        if r.status_code != 200:
            raise RuntimeError(f"{self.name}: HTTP {r.status_code}: {r.text[:500]!r}")
        usage = r.json()["usage"]
        return wall, usage.get("output_tokens") or usage.get("completion_tokens") or 0


Servers = tuple[Server, ...]  # oars first, then the llama-servers it is measured against


def _filler(rng: random.Random, num_tokens: int) -> str:
    """Lines of random words, about `num_tokens` tokens: each word is one token of the default
    model's tokenizer, a line 14 (the servers report the exact counts)."""
    lines = (" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(num_tokens // 14 or 1))
    return "\n".join(f"- {line}." for line in lines)


def _chat(seed: str, num_tokens: int, user: str) -> Chat:
    """A system prompt of about `num_tokens`, unique to `seed` from its first token, and `user`.
    Both servers get the same `seed`s, so the same prompts."""
    notes = _filler(random.Random(seed), num_tokens)
    system = f"Session {seed}. You are a helpful assistant. Notes:\n{notes}"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


@dataclass
class Row:
    measure: str
    oars: float
    llama: float
    unit: str = ""
    digits: int = 3
    ratios: list[float] = field(default_factory=list)  # rep by rep, where measured a rep
    against: str = "llama-server"

    @property
    def ratio(self) -> float:
        return self.oars / self.llama if self.llama else float("nan")

    @classmethod
    def of(
        cls, measure: str, oars: list[float], llama: list[float], unit: str, digits: int = 3
    ) -> Row:
        """Medians of the reps, and each rep's ratio (the reps alternate the two servers, so
        rep i of each ran side by side)."""
        ratios = [a / b for a, b in zip(oars, llama, strict=True) if b]
        return cls(measure, _median(oars), _median(llama), unit, digits, ratios)


def _median(values: Iterator[float] | list[float]) -> float:
    return statistics.median(list(values))


def _alternate(servers: Sequence[T], reps: int, run: Callable[[T, int], Any]) -> list[list[Any]]:
    """`run(server, rep)` for each rep on every server (or anything else measured side by side),
    a list of results a server; the order rotates rep by rep, so each server goes first as often
    as the others."""
    out: list[list[Any]] = [[] for _ in servers]
    for rep in range(reps):
        for i in range(len(servers)):
            k = (i + rep) % len(servers)
            out[k].append(run(servers[k], rep))
    return out


@dataclass
class Step:
    """One measure: what a rep runs on a server, and the rows from oars's results (first) and
    one reference's."""

    name: str
    run: Callable[[Server, int], Any]
    rows: Callable[[list[Any], list[Any]], list[Row]]
    reps: int

    def measure(self, servers: Servers) -> list[Row]:
        results = _alternate(servers, self.reps, self.run)
        return [
            dataclasses.replace(row, against=reference.name)
            for reference, theirs in zip(servers[1:], results[1:], strict=True)
            for row in self.rows(results[0], theirs)
        ]


def _counting(seed: str, num_chats: int) -> list[Chat]:
    return [_chat(f"{seed} {i}", 20, COUNT) for i in range(num_chats)]


def _decode(reps: int, tokens: int) -> Step:
    def run(server: Server, rep: int) -> Stream:
        return server.one(_chat(f"decode {rep}", 20, COUNT), tokens)

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
            )
        ],
        reps,
    )


def _whole(reps: int, tokens: int) -> Step:
    """One stream's reply streamed and the same kind of reply in one body, wall time an output
    token: what the per-token stream costs each server (its events, its writes, the client's
    reads), apart from generating the tokens."""

    def run(server: Server, rep: int) -> tuple[float, float]:
        streamed = server.one(_chat(f"streamed {rep}", 20, COUNT), tokens)
        wall, produced = server.whole(_chat(f"whole {rep}", 20, COUNT), tokens)
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


def _ttft(reps: int) -> Step:
    def run(server: Server, rep: int) -> tuple[Stream, Stream]:
        chat = _chat(f"ttft {rep}", 80, "Say hello.")
        return server.one(chat, 4), server.one(chat, 4)

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


def _prefill(reps: int) -> Step:
    def run(server: Server, rep: int) -> Stream:
        return server.one(_chat(f"prefill {rep}", 2000, "Summarize the notes in one sentence."), 4)

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
            ),
        ],
        reps,
    )


def _aggregate(streams: list[Stream]) -> float:
    """Output tokens of all streams over the wall time from the first start to the last end."""
    wall = max(s.end for s in streams) - min(s.start for s in streams)
    return sum(s.output_tokens for s in streams) / wall


def _scaling(reps: int, tokens: int) -> Step:
    def run(server: Server, rep: int) -> tuple[float, list[Stream]]:
        single = _aggregate(server.many(_counting(f"one {rep}", 1), tokens))
        return single, server.many(_counting(f"four {rep}", 4), tokens)

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
                [_aggregate(y) for _, y in a],
                [_aggregate(y) for _, y in b],
                "tok/s",
                1,
            ),
            Row.of(
                "**scaling, 4 streams / 1 stream**",
                [_aggregate(y) / x for x, y in a],
                [_aggregate(y) / x for x, y in b],
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


def _sixteen(reps: int, tokens: int) -> Step:
    def run(server: Server, rep: int) -> list[Stream]:
        return server.many(_counting(f"sixteen {rep}", 16), tokens)

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
                [_aggregate(r) for r in a],
                [_aggregate(r) for r in b],
                "tok/s",
                1,
            ),
        ],
        reps,
    )


def _thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of a process, by thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # ended since the listing
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _beside(reps: int, tokens: int) -> Step:
    """The CPU a server spends beside llama.cpp's threads (HTTP, events, sampling hand-off):
    on 2 cores every millisecond of it is taken from a step. llama.cpp's threads are the ones
    busy for at least half the load's wall time; the rest is counted, per output token."""

    def run(server: Server, rep: int) -> list[float]:
        assert server.proc is not None
        out = []
        for streams in (1, 4):
            before = _thread_cpu(server.proc.pid)
            began = time.perf_counter()
            done = server.many(_counting(f"beside {rep} {streams}", streams), tokens)
            wall = time.perf_counter() - began
            used = [cpu - before.get(tid, 0.0) for tid, cpu in _thread_cpu(server.proc.pid).items()]
            beside = sum(cpu for cpu in used if cpu < wall / 2)
            out.append(beside * 1000 / sum(s.output_tokens for s in done))
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


def _conversation(seed: str) -> Chat:
    """~2,000 tokens of an agent's session: a system prompt and three earlier turns."""
    chat = _chat(seed, 1100, "Read the notes and list the ones about the parser.")
    rng = random.Random(f"{seed} turns")
    for n in range(3):
        chat += [
            {"role": "assistant", "content": _filler(rng, 180)},
            {"role": "user", "content": f"Turn {n + 2}: {_filler(rng, 60)}"},
        ]
    return chat


def _agent(reps: int) -> Step:
    def run(server: Server, rep: int) -> tuple[Stream, Stream]:
        chat = _conversation(f"agent {rep}")
        before = server.one(chat, 16)
        chat += [
            {"role": "assistant", "content": before.text},
            {"role": "user", "content": "Now rename the variable x to y."},
        ]
        return before, server.one(chat, 4)

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
            Row.of("agent turn N: TTFT", [n.ttft for _, n in a], [n.ttft for _, n in b], "s"),
        ],
        reps,
    )


def _codex(reps: int) -> Step:
    def run(server: Server, rep: int) -> tuple[Stream, Stream]:
        chat = _chat(f"codex {rep}", 8000, "Where is the main entry point?")
        cold = server.one(chat, 4)
        server.stop()
        server.start()
        chat[1] = {"role": "user", "content": "List the files you would read first."}
        return cold, server.one(chat, 4)

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
            ),
        ],
        reps,
    )


def _servers(args: argparse.Namespace, model: Path, home: Path) -> Servers:
    """oars, then a llama-server for each `--llama-args` (one with none if not given)."""
    threads = str(args.threads)
    # --account: oars logs each pass, llama-server when each decode starts and ends, and
    # llama.cpp the sequences of each ubatch (bench/passes.py)
    debug = {"LLAMA_KV_CACHE_DEBUG": "1"} if args.account else {}
    oars_log = ["--log-level", "debug"] if args.account else ["--log-level", "warning"]
    llama_log = ["-v", "--log-timestamps"] if args.account else []

    def oars(port: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "oars.cli",
            "serve",
            "--model",
            str(model),
            "--port",
            str(port),
            "--threads",
            threads,
            "--ctx",
            str(args.ctx),
            *oars_log,
            *shlex.split(args.oars_args),
        ]

    def llama(port: int, extra: str) -> list[str]:
        return [
            str(args.llama_server),
            "-m",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-t",
            threads,
            "--parallel",
            str(args.parallel),
            "-c",
            str(args.ctx * args.parallel),
            *llama_log,
            *shlex.split(extra),
        ]

    return (
        Server(
            "oars",
            oars,
            "/v1/responses",
            _oars_body,
            _oars_event,
            home / "oars.log",
            env={**os.environ, "OARS_HOME": str(home), **dict(args.oars_env)},
        ),
        *(
            Server(
                f"llama-server {extra}".strip(),
                functools.partial(llama, extra=extra),
                "/v1/chat/completions",
                _llama_body,
                _llama_event,
                home / f"llama-server-{i}.log",
                env={**os.environ, **debug},
            )
            for i, extra in enumerate(args.llama_args or [""])
        ),
    )


def _account(args: argparse.Namespace, servers: Servers) -> str:
    """Each load `--reps` times on each server (alternating which goes first), its passes read
    back from the server's log, all reps' passes together."""
    loads = [(1, args.tokens), (4, args.tokens), (16, args.tokens16)]
    out = []
    for streams, tokens in loads:

        def run(server: Server, rep: int, streams: int = streams, tokens: int = tokens) -> Any:
            start = server.log.stat().st_size
            began = time.perf_counter()
            done = server.many(_counting(f"account {rep} {streams}", streams), tokens)
            wall = time.perf_counter() - began
            with open(server.log, encoding="utf-8", errors="replace") as log:
                log.seek(start)
                text = log.read()
            read = passes.oars_passes if server.name == "oars" else passes.llama_passes
            return wall, sum(s.output_tokens for s in done), read(text)

        found = {}
        for server, reps in zip(servers, _alternate(servers, args.reps, run), strict=True):
            found[server.name] = {
                "wall s (debug logs on), all reps": sum(wall for wall, _, _ in reps),
                "output tokens, all reps": sum(n for _, n, _ in reps),
                **passes.summary([p for _, _, run_passes in reps for p in run_passes]),
            }
        heading = f"{streams} stream(s) of {tokens} tokens, {args.reps} reps"
        out += account_table(heading, [s.name for s in servers], found)
    return "\n".join(out)


def account_table(heading: str, names: list[str], found: dict[str, dict[str, float]]) -> list[str]:
    """Lines of a markdown table: a row for each measure, a column for each of `names`."""
    out = [
        f"\n{heading}\n",
        "| | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for name in dict.fromkeys(k for s in found.values() for k in s):
        cells = (found[server].get(name, float("nan")) for server in names)
        out.append(f"| {name} | " + " | ".join(f"{c:,.2f}" for c in cells) + " |")
    return out


def _measure(args: argparse.Namespace, servers: Servers) -> list[Row]:
    for server in servers:
        server.one(_chat("warm-up", 20, "Say hello."), 4)
    steps = [
        _decode(args.reps, args.tokens),
        _whole(args.reps, args.tokens),
        _ttft(args.reps),
        _prefill(args.reps),
        _scaling(args.reps, args.tokens),
        _sixteen(args.reps, args.tokens16),
        _beside(args.reps, args.tokens),
        _agent(args.reps),
        _codex(args.codex_reps),
    ]
    only = {name.strip() for name in args.only.split(",") if name.strip()}
    rows: list[Row] = []
    for step in steps:
        if only and step.name not in only:
            continue
        start = time.perf_counter()
        rows += step.measure(servers)
        print(f"{step.name}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return rows


def _table(rows: list[Row], args: argparse.Namespace) -> str:
    references = list(dict.fromkeys(row.against for row in rows))
    lines = [
        f"oars {args.oars_args or '(defaults)'} vs llama-server --parallel {args.parallel}, "
        f"{args.threads} threads, median of {args.reps} alternating reps "
        f"(Codex session: {args.codex_reps})",
        "",
        "| measure | oars | llama-server | oars / llama-server | rep by rep |",
        "|---|---|---|---|---|",
    ]
    for row in sorted(rows, key=lambda row: references.index(row.against)):
        unit = f" {row.unit}" if row.unit else ""
        spread = f"{min(row.ratios):.2f}-{max(row.ratios):.2f}" if len(row.ratios) > 1 else ""
        measure = row.measure if len(references) == 1 else f"{row.measure} (vs {row.against})"
        lines.append(
            f"| {measure} | {row.oars:,.{row.digits}f}{unit} | "
            f"{row.llama:,.{row.digits}f}{unit} | {row.ratio:.2f} | {spread} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--codex-reps", type=int, default=1, help="reps of the restart test")
    parser.add_argument("--tokens", type=int, default=128, help="output tokens of decode streams")
    parser.add_argument("--tokens16", type=int, default=48, help="output tokens of the 16 streams")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--ctx", type=int, default=16384, help="context of each sequence")
    parser.add_argument("--parallel", type=int, default=4, help="llama-server's slots")
    parser.add_argument(
        "--oars-args", default="", help='extra `oars serve` flags, e.g. "--parallel 4"'
    )
    parser.add_argument(
        "--llama-args",
        action="append",
        default=[],
        help="extra llama-server flags, as --llama-args=FLAGS; given more than once, a "
        "llama-server for each, all alternating with oars (e.g. --llama-args= "
        "--llama-args=--no-repack)",
    )
    parser.add_argument(
        "--oars-env",
        action="append",
        default=[],
        type=lambda kv: tuple(kv.split("=", 1)),
        metavar="NAME=VALUE",
        help="an environment variable for oars only (repeatable), e.g. OMP_WAIT_POLICY=passive",
    )
    parser.add_argument(
        "--only",
        default="",
        help="some steps, e.g. decode,ttft (of decode, whole, "
        "ttft, prefill, scaling, sixteen, beside, agent, codex)",
    )
    parser.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    parser.add_argument("--model", type=Path, default=None, help="a GGUF (default: oars's own)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--account",
        action="store_true",
        help="instead: 1, 4 and 16 streams once on each server, with debug logs, and what "
        "their passes were (bench/passes.py)",
    )
    args = parser.parse_args()
    if not args.llama_server.exists():
        sys.exit(f"{args.llama_server} is missing: run `make llama-server` first")
    args.model = args.model or pull()
    with tempfile.TemporaryDirectory(prefix="oars-vs-llama-") as tmp:
        servers = _servers(args, args.model, Path(tmp))
        try:
            for server in servers:
                server.start()
            if args.account:
                print(_account(args, servers))
                return
            rows = _measure(args, servers)
        finally:
            for server in servers:
                server.stop()
    if args.json:
        print(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "rows": [
                        {
                            "measure": r.measure,
                            "oars": r.oars,
                            "llama_server": r.llama,
                            "against": r.against,
                            "ratio": r.ratio,
                            "unit": r.unit,
                        }
                        for r in rows
                    ],
                },
                indent=2,
            )
        )
    else:
        print(_table(rows, args))


if __name__ == "__main__":
    main()

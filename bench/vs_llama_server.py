"""oars against llama.cpp's own `llama-server` on the same GGUF, as ratios oars / llama-server.

    make llama-server     # once: build/llama-server/bin/llama-server
    .venv/bin/python -m bench.vs_llama_server [--reps 3] [--oars-args "--parallel 4"] [--json]

The reference is built by `make llama-server` from the llama.cpp vendored in the sdist of the
installed llama-cpp-python, so both servers run the same ggml kernels. pip built that wheel here
from source with llama.cpp's defaults (Release, GGML_NATIVE i.e. -march=native, OpenMP, llamafile
kernels), and the target asks for the same flags (static libraries instead of shared ones; no
curl, OpenSSL or web UI: nothing a benchmark uses).

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
llama-server for each (e.g. as it comes and with oars's kernels, `-fa off --no-repack`), and
every rep rotates through all the servers; each measure then has a row against each of them.

On 2 cores the defaults take about 14 minutes. Another busy process ruins every number: llama.cpp's
threads wait for each other at every step, so one descheduled thread stalls them all.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.clients import CHAT_COMPLETIONS, RESPONSES, Endpoint, Stream, aggregate
from bench.prompts import COUNT, chat, conversation, counting
from bench.servers import Row, Server, alternate, oars_serve, table, thread_cpu
from oars.weights import pull

LLAMA_SERVER = Path(__file__).resolve().parents[1] / "build/llama-server/bin/llama-server"
SAME_KERNELS = "-fa off --no-repack"  # llama-server with the attention and weights oars runs
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


@dataclass(frozen=True)
class Setup:
    """How both kinds of server are started: the same GGUF, threads and context per sequence."""

    model: Path
    home: Path  # oars's OARS_HOME and every server's log
    threads: int = os.cpu_count() or 1
    ctx: int = 16384
    parallel: int = 4  # llama-server's slots
    oars_args: str = ""
    oars_env: Sequence[tuple[str, str]] = ()
    llama_args: Sequence[str] = ("",)  # a llama-server for each
    llama_server: Path = LLAMA_SERVER
    debug: bool = False  # oars's pass log, llama-server's verbose log with timestamps

    def endpoints(self) -> Endpoints:
        """oars, then a llama-server for each of `llama_args`, none started yet."""
        oars = Server(
            "oars",
            self._oars,
            self.home / "oars.log",
            env={"OARS_HOME": str(self.home), **dict(self.oars_env)},
            ready="/health",
        )
        llama = [
            Server(
                f"llama-server {extra}".strip(),
                functools.partial(self._llama, extra=extra),
                self.home / f"llama-server-{i}.log",
                env={"LLAMA_KV_CACHE_DEBUG": "1"} if self.debug else None,
            )
            for i, extra in enumerate(self.llama_args)
        ]
        return (
            Endpoint(oars, RESPONSES),
            *(Endpoint(server, CHAT_COMPLETIONS) for server in llama),
        )

    def _oars(self, port: int) -> list[str]:
        log = ["--log-level", "debug" if self.debug else "warning"]
        model = ["--model", str(self.model), "--threads", str(self.threads)]
        extra = shlex.split(self.oars_args)
        return oars_serve(port, *model, "--ctx", str(self.ctx), *log, *extra)

    def _llama(self, port: int, extra: str) -> list[str]:
        where = ["-m", str(self.model), "--host", "127.0.0.1", "--port", str(port)]
        slots = ["-t", str(self.threads), "--parallel", str(self.parallel)]
        log = ["-v", "--log-timestamps"] if self.debug else []
        size = ["-c", str(self.ctx * self.parallel)]
        return [str(self.llama_server), *where, *slots, *size, *log, *shlex.split(extra)]


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


def running(setup: Setup, work: Callable[[Endpoints], Any]) -> Any:
    """`work(endpoints)` with every server of `setup` started, all stopped after."""
    endpoints = setup.endpoints()
    try:
        for endpoint in endpoints:
            endpoint.server.start()
        return work(endpoints)
    finally:
        for endpoint in endpoints:
            endpoint.server.stop()


def parser(description: str) -> argparse.ArgumentParser:
    """The options of the servers, shared by the benches that start oars and llama-server."""
    out = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    out.add_argument("--reps", type=int, default=3)
    out.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    out.add_argument("--ctx", type=int, default=16384, help="context of each sequence")
    out.add_argument("--parallel", type=int, default=4, help="llama-server's slots")
    out.add_argument(
        "--oars-args", default="", help='extra `oars serve` flags, e.g. "--parallel 4"'
    )
    out.add_argument(
        "--llama-args",
        action="append",
        default=[],
        help="extra llama-server flags, as --llama-args=FLAGS; given more than once, a "
        "llama-server for each, all alternating with oars (e.g. --llama-args= "
        f"'--llama-args={SAME_KERNELS}')",
    )
    out.add_argument(
        "--oars-env",
        action="append",
        default=[],
        type=lambda kv: tuple(kv.split("=", 1)),
        metavar="NAME=VALUE",
        help="an environment variable for oars only (repeatable), e.g. OMP_WAIT_POLICY=passive",
    )
    out.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    out.add_argument("--model", type=Path, default=None, help="a GGUF (default: oars's own)")
    return out


def setup_of(args: argparse.Namespace, home: Path, *, debug: bool = False) -> Setup:
    """The Setup the options of `parser` ask for (the model pulled if none is given)."""
    if not args.llama_server.exists():
        sys.exit(f"{args.llama_server} is missing: run `make llama-server` first")
    return Setup(
        model=args.model or pull(),
        home=home,
        threads=args.threads,
        ctx=args.ctx,
        parallel=args.parallel,
        oars_args=args.oars_args,
        oars_env=args.oars_env,
        llama_args=args.llama_args or [""],
        llama_server=args.llama_server,
        debug=debug,
    )


def _wire(rows: list[Row]) -> list[dict[str, Any]]:
    return [
        {
            "measure": r.measure,
            "oars": r.oars,
            "llama_server": r.reference,
            "against": r.against,
            "ratio": r.ratio,
            "unit": r.unit,
        }
        for r in rows
    ]


def main() -> None:
    options = parser(__doc__)
    options.add_argument("--codex-reps", type=int, default=1, help="reps of the restart test")
    options.add_argument("--tokens", type=int, default=128, help="output tokens of decode streams")
    options.add_argument("--tokens16", type=int, default=48, help="output tokens of the 16 streams")
    options.add_argument("--json", action="store_true", help="print the results as JSON")
    options.add_argument("--only", default="", help=f"some steps, e.g. decode,ttft (of {STEPS})")
    args = options.parse_args()
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    chosen = steps(args.reps, args.tokens, args.tokens16, args.codex_reps, only)
    with tempfile.TemporaryDirectory(prefix="oars-vs-llama-") as tmp:
        rows: list[Row] = running(
            setup_of(args, Path(tmp)), lambda endpoints: measure(endpoints, chosen)
        )
    if args.json:
        print(
            json.dumps(
                {"args": {k: str(v) for k, v in vars(args).items()}, "rows": _wire(rows)}, indent=2
            )
        )
        return
    print(
        f"oars {args.oars_args or '(defaults)'} vs llama-server --parallel {args.parallel}, "
        f"{args.threads} threads, median of {args.reps} alternating reps "
        f"(Codex session: {args.codex_reps})\n"
    )
    print(table(rows, "llama-server"))


if __name__ == "__main__":
    main()

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
import functools
import json
import os
import shlex
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.clients import CHAT_COMPLETIONS, RESPONSES, Endpoint
from bench.servers import Row, Server, oars_serve, table
from bench.steps import STEPS, Endpoints, measure, steps
from oars.weights import pull

LLAMA_SERVER = Path(__file__).resolve().parents[1] / "build/llama-server/bin/llama-server"
SAME_KERNELS = "-fa off --no-repack"  # llama-server with the attention and weights oars runs


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

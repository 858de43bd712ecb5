"""What every forward pass was, in oars and in llama-server, under 1, 4 and 16 streams.

    make llama-server     # once
    .venv/bin/python -m bench.lab.account [--reps 2] ["--llama-args=-fa off --no-repack"]

The servers of `bench.vs_llama_server`, started with debug logs (oars's pass log,
llama-server's verbose log with timestamps and llama.cpp's KV debug lines); each load runs
`--reps` times on each server, alternating which goes first, and its passes are read back from
the server's log (`bench.lab.passes`): how many passes, how many graphs (ubatches) each, the KV
cells each attended over, the pass times and the time between. The logs slow both servers, so
the wall times here are not `bench.vs_llama_server`'s.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from bench.clients import Endpoint
from bench.lab import passes
from bench.prompts import counting
from bench.servers import alternate, columns
from bench.steps import Endpoints
from bench.vs_llama_server import parser, running, setup_of


def account(endpoints: Endpoints, reps: int, loads: list[tuple[int, int]]) -> str:
    """Each (streams, tokens) load `reps` times on each server, its passes read back from the
    server's log, all reps' passes together: a table a load."""
    out = []
    for streams, tokens in loads:

        def run(endpoint: Endpoint, rep: int, streams: int = streams, tokens: int = tokens) -> Any:
            log = endpoint.server.log
            assert log is not None
            start = log.stat().st_size
            began = time.perf_counter()
            done = endpoint.many(counting(f"account {rep} {streams}", streams), tokens)
            wall = time.perf_counter() - began
            with open(log, encoding="utf-8", errors="replace") as f:
                f.seek(start)
                text = f.read()
            read = passes.oars_passes if endpoint.name == "oars" else passes.llama_passes
            return wall, sum(s.output_tokens for s in done), read(text)

        found = {}
        for endpoint, done in zip(endpoints, alternate(endpoints, reps, run), strict=True):
            found[endpoint.name] = {
                "wall s (debug logs on), all reps": sum(wall for wall, _, _ in done),
                "output tokens, all reps": sum(n for _, n, _ in done),
                **passes.summary([p for _, _, run_passes in done for p in run_passes]),
            }
        heading = f"{streams} stream(s) of {tokens} tokens, {reps} reps"
        out.append(columns(heading, [e.name for e in endpoints], found))
    return "\n".join(out)


def main() -> None:
    options = parser(__doc__)
    options.set_defaults(reps=2)
    options.add_argument("--tokens", type=int, default=128, help="output tokens of 1 and 4 streams")
    options.add_argument("--tokens16", type=int, default=48, help="output tokens of the 16 streams")
    args = options.parse_args()
    loads = [(1, args.tokens), (4, args.tokens), (16, args.tokens16)]
    with tempfile.TemporaryDirectory(prefix="oars-account-") as tmp:
        setup = setup_of(args, Path(tmp), debug=True)
        print(running(setup, lambda endpoints: account(endpoints, args.reps, loads)))


if __name__ == "__main__":
    main()

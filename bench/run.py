"""The targets table: each figure oars keeps, as a ratio against a reference run beside it.

    make bench                                    # = .venv/bin/python -m bench.run
    .venv/bin/python -m bench.run --list          # the targets and their goals; nothing runs
    .venv/bin/python -m bench.run --only foundation,gateway [--reps 3] [--tokens 128]

Three groups, each measured in one session, the sides alternating rep by rep:

- `foundation`: one `oars serve` on the default model (SQLite store) against the raw engine
  loop in this process (no server, builder or parser), on the same prompts, each new from its
  first token so nothing comes from the KV cache; `store: true` against `store: false` on the
  same server; a `json_schema` constraint against none; the builder's events against the
  scripted engine's chunks.
- `llama-server`: the targets of `bench.vs_llama_server` (decode, prefill, 4 and 16 streams, an
  agent's next turn, a restarted session) against llama.cpp's own server on the same GGUF, by
  default with the kernels oars runs (`-fa off --no-repack`). Skipped if `make llama-server`
  has not built it.
- `gateway`: `bench.gateway_load`'s paced upstream (160 chunks a second a stream), read directly
  and through `oars serve --upstream`, at 1 and at 64 streams.

A ratio is figure / reference (its medians) with the range of the reps' own ratios; a goal is
on the ratio, on what the figure adds to the reference, or on the figure itself. On 2 cores the
whole table takes about 20 minutes, most of it llama-server's group.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import foundation, gateway_load, steps, vs_llama_server
from bench.servers import median
from bench.targets import Figure, Figures, render
from oars.weights import pull


def llama_server(args: argparse.Namespace) -> Figures:
    """The rows of `bench.steps` that are targets, against one llama-server."""
    if not vs_llama_server.LLAMA_SERVER.exists():
        print("llama-server: skipped, `make llama-server` builds it", file=sys.stderr)
        return {}
    only = ("decode", "prefill", "scaling", "sixteen", "agent", "codex")
    chosen = steps.steps(args.reps, args.tokens, only=only)
    with tempfile.TemporaryDirectory(prefix="oars-bench-") as home:
        setup = vs_llama_server.Setup(pull(), Path(home), llama_args=(args.llama_args,))
        rows = vs_llama_server.running(setup, lambda endpoints: steps.measure(endpoints, chosen))
    return {r.target: Figure(r.oars, r.reference, tuple(r.ratios)) for r in rows if r.target}


def gateway(args: argparse.Namespace) -> Figures:
    """`bench.gateway_load` at 1 and 64 streams of 160 chunks a second."""
    load = gateway_load.Load(streams=(1, 64), rates=(160.0,), tokens=400, reps=args.gateway_reps)
    rounds = {(f.streams, f.path): f for f in gateway_load.run(load)}

    def rate(n: int, path: str) -> Figure:
        ours, direct = rounds[n, path], rounds[n, "direct"]
        return Figure(median(ours.tokens_per_s), median(direct.tokens_per_s))

    def ttft(n: int, path: str, p99: bool) -> Figure:
        ours, direct = rounds[n, path], rounds[n, "direct"]
        if p99:
            return Figure(ours.ttft_p99 * 1000, direct.ttft_p99 * 1000)
        return Figure(ours.ttft_p50 * 1000, direct.ttft_p50 * 1000)

    return {
        "gw_rate": rate(1, "store off"),
        "gw_ttft": ttft(1, "store off", p99=False),
        "gw_rate64": rate(64, "store on"),
        "gw_p99": ttft(64, "store on", p99=True),
        "gw_p99_off": ttft(64, "store off", p99=True),
    }


GROUPS: dict[str, Callable[[argparse.Namespace], Figures]] = {
    "foundation": lambda args: foundation.measure(args.reps, args.tokens),
    "llama-server": llama_server,
    "gateway": gateway,
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128, help="output tokens of a decode")
    parser.add_argument("--gateway-reps", type=int, default=2, help="rounds of each gateway path")
    parser.add_argument(
        "--llama-args",
        default=vs_llama_server.SAME_KERNELS,
        help="llama-server's flags (default: the kernels oars runs; '' for as it comes)",
    )
    parser.add_argument("--only", default="", help=f"some groups, of {', '.join(GROUPS)}")
    parser.add_argument("--list", action="store_true", help="the targets only; nothing runs")
    args = parser.parse_args()
    groups = [g.strip() for g in args.only.split(",") if g.strip()] or list(GROUPS)
    unknown = set(groups) - set(GROUPS)
    if unknown:
        parser.error(f"no such group: {', '.join(sorted(unknown))}")
    figures: Figures = {}
    if not args.list:
        for group in groups:
            start = time.perf_counter()
            figures |= GROUPS[group](args)
            print(f"{group}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    print(
        f"median of {args.reps} alternating reps ({args.tokens}-token decodes), gateway "
        f"{args.gateway_reps} rounds a path; llama-server {args.llama_args or 'as it comes'}\n"
    )
    print(render(figures, groups))


if __name__ == "__main__":
    main()

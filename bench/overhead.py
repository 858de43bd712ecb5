"""What a generated token costs outside llama.cpp in `oars serve`, against another checkout.

    .venv/bin/python -m bench.overhead [--streams 1] [--tokens 200] [--reps 3] [--store]
                                       [--against DIR]

Each rep is one run of `bench.token_cost` (a real `oars serve` on the default model, in a
process of its own, `--streams` streams of `--tokens` tokens). Per generated token:

- the event loop thread's CPU time (turning tokens into events, SSE, the store's writes);
- the engine thread's time between two forward passes (wall, median): sampling, handing the
  token over, planning the next batch. On 2 cores both come out of llama.cpp's share, whose
  threads wait for each other at every step;
- the forward pass itself (llama_decode, wall, median), for scale.

`--against DIR` runs the same on the `oars` of the checkout at DIR (a worktree of the commit
before a change, say), the two in turn rep by rep, and gives the ratio of each median, this
checkout over that one: the reference in the same run, on the same machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.servers import alternate, median, paired, spread

HERE = Path(__file__).resolve()
# run bench/token_cost.py by its path, with the checkout's folder first on sys.path (so its
# `oars` is the one imported) and nothing of bench/ on it
RUN = "import runpy, sys; runpy.run_path(sys.argv.pop(1), run_name='__main__')"
MEASURES = (
    ("loop_ms", "event loop thread CPU, ms a token", 3),
    ("gap_ms", "between two passes (engine thread, wall, median), ms", 3),
    ("pass_ms", "one forward pass (llama_decode, wall, median), ms", 2),
)


def _run(checkout: Path, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, "-c", RUN, str(HERE.with_name("token_cost.py"))]
    command += ["--streams", str(args.streams), "--tokens", str(args.tokens)]
    command += ["--store"] if args.store else []
    done = subprocess.run(command, cwd=checkout, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{checkout}: the run failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--store", action="store_true", help="store the responses (SQLite)")
    parser.add_argument("--against", type=Path, help="a checkout of oars to compare with")
    args = parser.parse_args()
    sides = [HERE.parents[1]] + ([args.against.resolve()] if args.against else [])
    runs = alternate(sides, args.reps, lambda checkout, rep: _run(checkout, args))
    store = "on" if args.store else "off"
    print(
        f"{args.streams} stream(s) × {args.tokens} tokens, store {store}, {args.reps} reps "
        f"(a server process each), medians"
    )
    names = ["this checkout"] + ([str(args.against)] if args.against else [])
    print("\n| | " + " | ".join(names) + (" | ratio | rep by rep |" if args.against else " |"))
    print("|---" * (len(names) + 1 + 2 * bool(args.against)) + "|")
    for key, label, digits in MEASURES:
        values = [[run[key] for run in side] for side in runs]
        cells = [f"{median(v):.{digits}f}" for v in values]
        if args.against:
            ratios = paired(values[0], values[1])
            cells += [f"{median(values[0]) / median(values[1]):.3f}", spread(ratios)]
        print(f"| {label} | " + " | ".join(cells) + " |")
    tokens = [sum(run["tokens"] for run in side) for side in runs]
    print(f"\noutput tokens, all reps: {' / '.join(str(t) for t in tokens)}")


if __name__ == "__main__":
    main()

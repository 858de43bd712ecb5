"""What the store's writer spends on one transaction of each kind, on SQLite (a real file),
through `SqlStore.write` as the server calls it (on its loop when no other connection holds
the lock): a new response (its row and one input item), the log of 64 running responses (a row
each, five delta events in it), and an ending (the final snapshot with a 400-word message, its
output item, ten last events).

    .venv/bin/python -m bench.lab.store_writes [--reps 5] [--count 300] [--against DIR]

Each rep runs every kind `--count` times, a transaction each, in a process of its own, and
reports the median wall time and CPU time (the process's, all threads) a transaction.
`--against DIR` runs the same in a checkout of oars at DIR (say, a worktree of the commit before
a change), the two in turn, rep by rep, and gives the ratio this checkout / that one, kind by
kind: the reference is measured in the same run, on the same machine, beside the figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

KINDS = ("begin", "log64", "end")

ONE_REP = r"""
import asyncio, json, sys, tempfile, time
from oars.store import Finished, Logged, NewResponse, SqlStore, StoredResponse, Writes

count = int(sys.argv[1])


def snapshot(i, done=False):
    text = " ".join(f"w{k}" for k in range(400))
    message = {"id": f"msg_{i}", "type": "message", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}
    return {"id": f"resp_{i}", "object": "response", "created_at": 1, "model": "m",
            "status": "completed" if done else "in_progress", "output": [message] if done else [],
            "usage": {"input_tokens": 9, "output_tokens": 400, "total_tokens": 409} if done else None}


def delta(i, k):
    return {"type": "response.output_text.delta", "sequence_number": k, "item_id": f"msg_{i}",
            "output_index": 0, "content_index": 0, "delta": f" w{k}", "logprobs": []}


def new(i):
    item = {"id": f"msg_in{i}", "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "Say something."}]}
    kept = StoredResponse(snapshot(i), background=False, streamed=True, owner="r", tenant="")
    return NewResponse(kept, [item], None, 60)


async def main():
    folder = tempfile.mkdtemp(prefix="oars-bench-")
    store = SqlStore(f"{folder}/oars.db")
    await store.open()
    kinds = {
        "begin": [Writes([new(i)], [], []) for i in range(count)],
        "log64": [Writes([], [Logged(f"resp_{i}", [delta(i, 5 * j + k) for k in range(5)])
                              for i in range(64)], []) for j in range(count)],
        "end": [Writes([], [], [Finished(f"resp_{i}", snapshot(i, True),
                                         [delta(i, 5 * count + k) for k in range(10)], (), "r0")])
                for i in range(count)],
    }
    await store.write(Writes())  # the writer's connection, opened before the clock starts
    out = {}
    for kind, writes in kinds.items():  # in this order: the logs and endings need the rows
        wall, cpu = [], []
        for w in writes:
            t, c = time.perf_counter(), time.process_time()
            await store.write(w)
            wall.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        wall.sort(), cpu.sort()
        out[kind] = wall[len(wall) // 2], cpu[len(cpu) // 2]
    await store.close()
    print(json.dumps(out))


asyncio.run(main())
"""


def _rep(checkout: Path, count: int) -> dict[str, list[float]]:
    done = subprocess.run(
        [sys.executable, "-c", ONE_REP, str(count)],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    )
    figures: dict[str, list[float]] = json.loads(done.stdout)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--count", type=int, default=300, help="transactions of each kind a rep")
    parser.add_argument("--against", type=Path, help="a checkout of oars to compare with")
    args = parser.parse_args()
    here = Path(__file__).resolve().parent.parent
    sides = {"this": here} | ({"against": args.against.resolve()} if args.against else {})
    figures: dict[str, dict[str, list[tuple[float, float]]]] = {s: {} for s in sides}
    for _ in range(args.reps):
        for side, checkout in sides.items():
            for kind, (wall, cpu) in _rep(checkout, args.count).items():
                figures[side].setdefault(kind, []).append((wall, cpu))

    def median(side: str, kind: str, i: int) -> float:
        return statistics.median(x[i] for x in figures[side][kind]) * 1e3

    def spread(side: str, kind: str, i: int) -> str:
        values = [x[i] * 1e3 for x in figures[side][kind]]
        return f"{min(values):.3f}-{max(values):.3f}"

    print(
        f"{args.reps} reps of {args.count} transactions a kind; ms a transaction, median (spread)"
    )
    print("| kind | " + " | ".join(f"{s} wall | {s} CPU" for s in sides) + " | ratio CPU |")
    print("|---" * (2 * len(sides) + 2) + "|")
    for kind in KINDS:
        cells = [f"{median(s, kind, i):.3f} ({spread(s, kind, i)})" for s in sides for i in (0, 1)]
        ratio = (
            f"{median('this', kind, 1) / median('against', kind, 1):.2f}" if args.against else "-"
        )
        print(f"| {kind} | " + " | ".join(cells) + f" | {ratio} |")


if __name__ == "__main__":
    main()

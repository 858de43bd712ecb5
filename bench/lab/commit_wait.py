"""What a held event waits for at least on PostgreSQL: one commit, and the rest of the one before.

The question (issue: a resume after a replica dies must never contradict): a stored stream's
event reaches its readers only once a commit carries it. With commits back to back on one
connection, an event made at a random moment waits for the commit in flight to end, then for
the next one, its own. This instrument times single-row commits back to back (a row of three
small events, as a write of one stream's logs) and, from those same commits, the wait of events
made at random moments: the floor of what the hold can cost on that database, with no server
and no loop in the way.

    python -m bench.lab.commit_wait --store postgresql://USER@HOST:PORT/DB [--commits 2000]
        [--busy 0]

`--busy N` keeps N processes spinning on the box meanwhile (`while True: pass`), as a model's
threads or a gateway's clients keep its cores busy. The table goes to stdout: milliseconds at the
p50, p90 and p99, for the commit and for an event's wait. The rows go to a table `commit_wait`
of that database, made for the run and dropped after it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time

import asyncpg

from bench.servers import percentile

_SPIN = "while True: pass"


async def commits(dsn: str, count: int) -> list[tuple[float, float]]:
    """`count` commits of one row each, back to back: each one's start and end."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE TABLE IF NOT EXISTS commit_wait (n bigserial, events text)")
        events = json.dumps(
            [
                {"type": "response.output_text.delta", "delta": " a", "sequence_number": i}
                for i in range(3)
            ]
        )
        spans = []
        for _ in range(count):
            start = time.perf_counter()
            await conn.execute("INSERT INTO commit_wait (events) VALUES ($1)", events)
            spans.append((start, time.perf_counter()))
        await conn.execute("DROP TABLE commit_wait")
        return spans
    finally:
        await conn.close()


def waits(spans: list[tuple[float, float]], samples: int = 20_000) -> list[float]:
    """The wait of events made at random moments of the run, each released by the end of the
    first commit that starts after it (the next one, commits being back to back)."""
    chance = random.Random(1)
    made = []
    for _ in range(samples):
        i = chance.randrange(len(spans) - 1)
        start, end = spans[i]
        made.append(spans[i + 1][1] - chance.uniform(start, end))
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True, help="postgresql://USER@HOST:PORT/DB")
    parser.add_argument("--commits", type=int, default=2000)
    parser.add_argument("--busy", type=int, default=0, help="processes spinning meanwhile")
    args = parser.parse_args()
    spinners = [subprocess.Popen([sys.executable, "-c", _SPIN]) for _ in range(args.busy)]
    try:
        time.sleep(0.5 if spinners else 0)
        spans = asyncio.run(commits(args.store, args.commits))
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    print(f"{args.commits} commits, {args.busy} processes spinning; ms")
    print("| | p50 | p90 | p99 |\n|---|---|---|---|")
    for name, values in (
        ("a commit", [b - a for a, b in spans]),
        ("an event's wait", waits(spans)),
    ):
        ms = [v * 1000 for v in values]
        print(
            f"| {name} | " + " | ".join(f"{percentile(ms, q):.2f}" for q in (0.5, 0.9, 0.99)) + " |"
        )


if __name__ == "__main__":
    main()

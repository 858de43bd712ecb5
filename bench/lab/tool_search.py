"""What a tool-search step adds to a response, on the real embedded model.

The question (issue 46): a request that defers its tools behind this server's tool search makes
the model search first, then call what was found; how much longer is that response than the
same request offering the tool directly, and what does the ranking itself cost?

One `oars serve` (the default model, no store). Each rep asks, in rotating order: `direct` (the
weather tool offered, a call required) and `searched` (the same tool and `--distractors` others
deferred behind `{"type": "tool_search"}`, a call required: the model searches, then calls).
Greedy, not streamed; the client times each request whole. Per side: the median wall time, and
how many generations and output tokens it took; the ratio searched / direct per rep.
`--rank` times only the BM25 ranking of one query, in this process, over catalogs of 10, 100
and 1,000 tools.

    python -m bench.lab.tool_search [--reps 6] [--distractors 20] [--minutes 10]
    python -m bench.lab.tool_search --rank
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

import httpx

from bench.servers import Server, alternate, median, oars_serve, paired, spread
from oars.check import WEATHER
from oars.tool_search import Entry, search
from oars.weights import pull

Json = dict[str, Any]
QUESTION = "What's the weather in Paris?"
TOPICS = ["invoice", "calendar", "ticket", "deploy", "backup", "payroll", "inventory", "badge"]
VERBS = ["list", "create", "delete", "update", "archive", "export", "count", "rename"]


def distractors(n: int) -> list[Json]:
    """`n` plausible tools that are not the weather's."""
    return [
        {
            "type": "function",
            "name": f"{VERBS[i % len(VERBS)]}_{TOPICS[i // len(VERBS) % len(TOPICS)]}_{i}",
            "description": f"{VERBS[i % len(VERBS)].title()} a {TOPICS[i // len(VERBS) % len(TOPICS)]}.",
            "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
        }
        for i in range(n)
    ]


def body(side: str, others: int) -> Json:
    tools: list[Json] = [WEATHER]
    if side == "searched":
        deferred = [{**t, "defer_loading": True} for t in [*distractors(others), WEATHER]]
        tools = [*deferred, {"type": "tool_search"}]
    return {"model": "bench", "input": QUESTION, "tools": tools, "tool_choice": "required",
            "temperature": 0, "max_output_tokens": 96, "store": False}  # fmt: skip


def ask(base: str, side: str, others: int) -> Json:
    started = time.perf_counter()
    r = httpx.post(f"{base}/v1/responses", json=body(side, others), timeout=600)
    r.raise_for_status()
    response: Json = r.json()
    output = response["output"]
    called = [i for i in output if i["type"] == "function_call"]
    searched = [i["arguments"] for i in output if i["type"] == "tool_search_call"]
    found = [t.get("name") for i in output if i["type"] == "tool_search_output" for t in i["tools"]]
    return {
        "searched": searched,
        "found": found,
        "seconds": time.perf_counter() - started,
        "items": [i["type"] for i in output],
        "called": called[0]["name"] if called else None,
        "tokens": response["usage"]["output_tokens"],
        "input": response["usage"]["input_tokens"],
    }


def ranking() -> dict[int, float]:
    """Milliseconds to rank a catalog of n deferred tools for one query (median of 5)."""
    out: dict[int, float] = {}
    for n in (10, 100, 1000):
        entries = [Entry(t, None) for t in [*distractors(n - 1), WEATHER]]
        runs = timeit.repeat(lambda e=entries: search(e, "weather in Paris", 5), number=1, repeat=5)
        out[n] = median(runs) * 1000
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--distractors", type=int, default=20)
    parser.add_argument("--minutes", type=float, default=10, help="no new rep past this")
    parser.add_argument("--rank", action="store_true", help="only time the ranking")
    args = parser.parse_args()
    if args.rank:
        search([Entry(WEATHER, None)], "warm", 1)  # the library's first import
        print(" · ".join(f"{n} tools {ms:.2f} ms" for n, ms in ranking().items()))
        return
    home = Path(tempfile.mkdtemp(prefix="tool-search-"))
    model = ["--model", str(pull(quiet=True)), "--store", "none", "--log-level", "warning"]
    server = Server("oars", lambda port: oars_serve(port, *model), home / "oars.log",
                    env={"OARS_HOME": str(home)})  # fmt: skip
    sides = ["direct", "searched"]
    began = time.monotonic()
    with server:
        ask(server.base, "direct", args.distractors)  # the engine's first request costs more

        def run(side: str, rep: int) -> Json | None:
            if time.monotonic() - began > args.minutes * 60:
                return None
            print(f"rep {rep + 1} {side}", file=sys.stderr)
            return ask(server.base, side, args.distractors)

        found = alternate(sides, args.reps, run)
    direct, searched = ([r for r in runs if r is not None] for runs in found)
    n = min(len(direct), len(searched))
    direct, searched = direct[:n], searched[:n]
    ratios = paired([r["seconds"] for r in searched], [r["seconds"] for r in direct])
    print(f"{n} reps, {args.distractors} deferred tools beside the weather's")
    for side, runs in (("direct", direct), ("searched", searched)):
        print(f"{side}: {median(r['seconds'] for r in runs):.2f} s, items {runs[0]['items']}, "
              f"called {[r['called'] for r in runs]}, output tokens "
              f"{median(r['tokens'] for r in runs):.0f}, input tokens "
              f"{median(r['input'] for r in runs):.0f}")  # fmt: skip
        print(f"  searched for {[r['searched'] for r in runs]}, found {[r['found'] for r in runs]}")
    print(f"searched / direct: {median(ratios):.2f} ({spread(ratios)})")


if __name__ == "__main__":
    main()

"""What a web search round trip adds to a response, on the real embedded model.

The question (issue 46): a request that forces `web_search` makes the model write a query,
waits for the backend, and generates again over the results; how much longer is it than the
same question answered from the same results already in its input?

One `oars serve` (the default model, no store) with `--web-search` pointed at a SearXNG-
compatible backend on loopback (`oars.testing.search_backend`, answering at once, so what is measured is
oars and the model, not a search engine). Each rep asks, in rotating order: `given` (the
backend's results pasted into the input, no tools) and `searched` (`web_search` forced, the
model searches, then answers). Greedy, not streamed; the client times each request whole. Per
side: the median wall time, output and input tokens; the ratio searched / given per rep.

    python -m bench.lab.web_search [--reps 6] [--minutes 10]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.servers import Server, alternate, median, oars_serve, paired, spread
from oars.testing import base_url, search_backend
from oars.weights import pull

Json = dict[str, Any]
QUESTION = "What is the code word of the lighthouse autumn release?"


def body(side: str, results: str) -> Json:
    common = {"model": "bench", "temperature": 0, "max_output_tokens": 64, "store": False}
    if side == "given":
        return {**common, "input": f"{results}\n\n{QUESTION}"}
    web = {"type": "web_search", "search_context_size": "low"}
    return {**common, "input": QUESTION, "tools": [web], "tool_choice": {"type": "web_search"}}


def ask(base: str, side: str, results: str) -> Json:
    started = time.perf_counter()
    r = httpx.post(f"{base}/v1/responses", json=body(side, results), timeout=600)
    r.raise_for_status()
    response: Json = r.json()
    text = [c["text"] for i in response["output"] if i["type"] == "message" for c in i["content"]]
    return {
        "seconds": time.perf_counter() - started,
        "items": [i["type"] for i in response["output"]],
        "answered": "heron-42" in " ".join(text).lower(),
        "tokens": response["usage"]["output_tokens"],
        "input": response["usage"]["input_tokens"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--minutes", type=float, default=10, help="no new rep past this")
    args = parser.parse_args()
    with search_backend() as backend:
        measure(backend, args)


def measure(backend: Any, args: argparse.Namespace) -> None:
    home = Path(tempfile.mkdtemp(prefix="web-search-"))
    search = f"searxng={base_url(backend)}"
    model = ["--model", str(pull(quiet=True)), "--store", "none", "--log-level", "warning"]
    server = Server("oars", lambda port: oars_serve(port, *model, "--web-search", search),
                    home / "oars.log", env={"OARS_HOME": str(home)})  # fmt: skip
    # what the model reads after a search, given to the other side as input
    results = httpx.get(f"{base_url(backend)}/search", params={"q": QUESTION, "format": "json"})
    given = "\n".join(
        f"{r['title']} ({r['url']}): {r['content']}" for r in results.json()["results"]
    )
    began = time.monotonic()
    with server:
        ask(server.base, "given", given)  # the engine's first request costs more

        def run(side: str, rep: int) -> Json | None:
            if time.monotonic() - began > args.minutes * 60:
                return None
            print(f"rep {rep + 1} {side}", file=sys.stderr)
            return ask(server.base, side, given)

        found = alternate(["given", "searched"], args.reps, run)
    plain, searched = ([r for r in runs if r is not None] for runs in found)
    n = min(len(plain), len(searched))
    plain, searched = plain[:n], searched[:n]
    ratios = paired([r["seconds"] for r in searched], [r["seconds"] for r in plain])
    print(f"{n} reps")
    for side, runs in (("given", plain), ("searched", searched)):
        print(f"{side}: {median(r['seconds'] for r in runs):.2f} s, items {runs[0]['items']}, "
              f"answered {sum(r['answered'] for r in runs)}/{n}, output tokens "
              f"{median(r['tokens'] for r in runs):.0f}, input tokens "
              f"{median(r['input'] for r in runs):.0f}")  # fmt: skip
    print(f"searched / given: {median(ratios):.2f} ({spread(ratios)})")


if __name__ == "__main__":
    main()

"""What one MCP round trip adds to a response.

    .venv/bin/python -m bench.mcp [--reps 30] [--model]

An `oars serve` on this machine and a one-tool MCP server (`bench.vault`, streamable HTTP on
loopback). Alternating rep by rep, non-streamed, the client times:

- `plain`: a response that answers at once;
- `call, listed`: the model calls `open_vault` (forced), the call runs, the model answers: the
  listing, the call and a second generation;
- `call, listing reused`: the same after `previous_response_id` of a response that listed, so
  the server is not listed again (and the prompt's start is cached).

Token counts are summed over the response's generations (two for a call).

With the scripted engine (the default, `bench.scripted`) the model's time is nil, so the
figures are what oars and the MCP round trips cost; `--model` runs the default model (greedy, answers of at most 24
tokens), where the second generation's prefill and decode dominate.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.servers import Server, oars_serve

QUESTION = "Open the vault with the code 1234 and tell me the word inside."
CALL = '<tool_call>{"name": "vault__open_vault", "arguments": {"code": "1234"}}</tool_call>'


def _server(model: bool, folder: Path) -> Server:
    """`oars serve` on the default model, or the scripted engine that calls the vault."""
    store = f"sqlite:///{folder}/oars.db"
    options = ["--store", store, "--temperature", "0", "--mcp-allow", "http://127.0.0.1"]
    scripted = [sys.executable, "-m", "bench.scripted", "--store", store]
    scripted += ["--mcp-call", CALL, "--mcp-answer", "The word is aubergine."]
    return Server(
        "oars",
        lambda port: oars_serve(port, *options) if model else [*scripted, "--port", str(port)],
        folder / "server.log",
    )


def _timed(base: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    r = httpx.post(f"{base}/responses", json=body, timeout=600)
    took = time.perf_counter() - started
    assert r.status_code == 200, r.text
    response: dict[str, Any] = r.json()
    return took, response


Figures = dict[str, list[float]]


def _measure(base: str, vault: str, reps: int) -> tuple[Figures, Figures, Figures]:
    """Per kind of response: the times, the input tokens not cached, the output tokens."""
    tool = {
        "type": "mcp",
        "server_label": "vault",
        "server_url": vault,
        "allowed_tools": ["open_vault"],
        "require_approval": "never",
    }
    common = {"model": "bench", "input": QUESTION, "max_output_tokens": 24}
    forced = {**common, "tools": [tool], "tool_choice": {"type": "mcp", "server_label": "vault"}}
    times: Figures = {"plain": [], "call, listed": [], "call, listing reused": []}
    fresh: Figures = {name: [] for name in times}
    written: Figures = {name: [] for name in times}
    _, listed = _timed(base, forced)  # warm: the first connection, the first prompt
    for _ in range(reps):
        runs = {
            "plain": common,
            "call, listed": forced,
            "call, listing reused": {**forced, "previous_response_id": listed["id"]},
        }
        for name, body in runs.items():
            took, response = _timed(base, body)
            kinds = [i["type"] for i in response["output"]]
            assert name == "plain" or "mcp_call" in kinds, kinds
            times[name].append(took)
            usage = response["usage"]
            cached = usage["input_tokens_details"]["cached_tokens"]
            fresh[name].append(usage["input_tokens"] - cached)
            written[name].append(usage["output_tokens"])
    return times, fresh, written


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--model", action="store_true", help="the default model, not scripted")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="oars-bench-mcp-"))
    vault = Server(
        "vault", lambda port: [sys.executable, "-m", "bench.vault", str(port)], ready=None
    )
    with vault, _server(args.model, folder) as oars:
        times, fresh, written = _measure(f"{oars.base}/v1", f"{vault.base}/mcp", args.reps)
    plain = statistics.median(times["plain"])
    engine = "the default model" if args.model else "the scripted engine"
    print(f"{args.reps} reps, {engine}; medians (p10-p90), and the time added to `plain`\n")
    print("| response | median | p10-p90 | added | input tokens not cached | output tokens |")
    print("|---|---|---|---|---|---|")
    for name, values in times.items():
        cuts = statistics.quantiles(values, n=10)
        median = statistics.median(values)
        added = "" if name == "plain" else f"+{(median - plain) * 1000:.1f} ms"
        print(
            f"| {name} | {median * 1000:.1f} ms | {cuts[0] * 1000:.1f}-{cuts[-1] * 1000:.1f} ms "
            f"| {added} | {statistics.median(fresh[name]):.0f} "
            f"| {statistics.median(written[name]):.0f} |"
        )


if __name__ == "__main__":
    main()

"""What one MCP round trip adds to a response.

    .venv/bin/python -m bench.mcp [--reps 30] [--model]

An `oars serve` on this machine and the tests' MCP server (tests/mcp_server.py, streamable
HTTP on loopback). Alternating rep by rep, non-streamed, the client times:

- `plain`: a response that answers at once;
- `call, listed`: the model calls `open_vault` (forced), the call runs, the model answers: the
  listing, the call and a second generation;
- `call, listing reused`: the same after `previous_response_id` of a response that listed, so
  the server is not listed again (and the prompt's start is cached).

Token counts are summed over the response's generations (two for a call).

With the scripted engine (the default) the model's time is nil, so the figures are what oars
and the MCP round trips cost; `--model` runs the default model (greedy, answers of at most 24
tokens), where the second generation's prefill and decode dominate.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import McpProcess, free_port
from tests.model.conftest import _wait_ready

QUESTION = "Open the vault with the code 1234 and tell me the word inside."
SCRIPTED = """
import sys
import uvicorn
from oars.http import create_app
from oars.mcp.config import McpConfig
from oars.service import ResponsesService
from oars.store import SqlStore
from oars.testing import ScriptedEngine
from oars.toolbox import ToolboxFactory

call = '<tool_call>{"name": "vault__open_vault", "arguments": {"code": "1234"}}</tool_call>'
engine = ScriptedEngine(lambda r: ["The word is aubergine."] if r.after_tool_output else [call])
toolboxes = ToolboxFactory(McpConfig.of(allow=["http://127.0.0.1"]))
app = create_app(ResponsesService(engine, toolboxes=toolboxes), SqlStore(sys.argv[2]))
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def _server(model: bool, folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    store = f"sqlite:///{folder}/oars.db"
    serve = [sys.executable, "-m", "oars.cli", "serve", "--port", str(port), "--store", store]
    options = ["--temperature", "0", "--mcp-allow", "http://127.0.0.1"]
    cmd = [*serve, *options] if model else [sys.executable, "-c", SCRIPTED, str(port), store]
    log = folder / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    _wait_ready(base, proc, log)
    return proc, f"{base}/v1"


def _timed(base: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    r = httpx.post(f"{base}/responses", json=body, timeout=600)
    took = time.perf_counter() - started
    assert r.status_code == 200, r.text
    response: dict[str, Any] = r.json()
    return took, response


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--model", action="store_true", help="the default model, not scripted")
    args = parser.parse_args()
    vault = McpProcess("streamable-http")
    tool = {
        "type": "mcp",
        "server_label": "vault",
        "server_url": vault.url,
        "allowed_tools": ["open_vault"],
        "require_approval": "never",
    }
    common = {"model": "bench", "input": QUESTION, "max_output_tokens": 24}
    forced = {**common, "tools": [tool], "tool_choice": {"type": "mcp", "server_label": "vault"}}
    folder = Path(tempfile.mkdtemp(prefix="oars-bench-mcp-"))
    proc, base = _server(args.model, folder)
    times: dict[str, list[float]] = {"plain": [], "call, listed": [], "call, listing reused": []}
    fresh: dict[str, list[int]] = {name: [] for name in times}  # input tokens not cached
    written: dict[str, list[int]] = {name: [] for name in times}  # output tokens
    try:
        _, listed = _timed(base, forced)  # warm: the first connection, the first prompt
        for _ in range(args.reps):
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
    finally:
        proc.terminate()
        proc.wait(30)
        vault.stop()
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

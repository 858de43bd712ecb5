"""An oars server process on the scripted engine: what oars costs with no model's time in it.

    python -m bench.scripted --port P --store URL [--chunks N] [--delay S]
                             [--mcp-call TEXT] [--mcp-answer TEXT]

The engine writes `--chunks` one-token chunks (`w0 w1 …`), `--delay` seconds apart. With
`--mcp-call`, MCP servers on loopback may be named, and the model writes TEXT (a call) in its
first generation and `--mcp-answer` once it has seen a tool's result.
"""

from __future__ import annotations

import argparse

import uvicorn

from oars.http import create_app
from oars.mcp.config import McpConfig
from oars.serve import settle_heap
from oars.service import ResponsesService
from oars.store import SqlStore
from oars.testing import ScriptedEngine
from oars.toolbox import ToolboxFactory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--chunks", type=int, default=3)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--mcp-call", default=None)
    parser.add_argument("--mcp-answer", default="Done.")
    args = parser.parse_args()
    engine = ScriptedEngine([f"w{i} " for i in range(args.chunks)], delay=args.delay)
    toolboxes = None
    if args.mcp_call is not None:
        call, answer = args.mcp_call, args.mcp_answer
        engine.script = lambda request: [answer] if request.after_tool_output else [call]
        toolboxes = ToolboxFactory(McpConfig.of(allow=["http://127.0.0.1"]))
    app = create_app(ResponsesService(engine, toolboxes=toolboxes), SqlStore(args.store))
    settle_heap()  # as `oars serve` does
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()

"""An oars server process on the scripted engine, for the multi-replica and crash tests.

python -m tests.replica --store URL --port P --replica NAME [--chunks N] [--delay S]
                        [--mcp-call TEXT] [--script JSON]

With `--mcp-call`, MCP servers on loopback may be named, and the model writes TEXT (a call) in
its first generation and "Done." once it has seen a tool's result. `--script`: the model's
chunks, a JSON list of strings (in place of `--chunks`), with its reasoning in <think> tags.
"""

from __future__ import annotations

import argparse
import json

import uvicorn

from oars.families import THINK_TAGS, Hermes
from oars.http import create_app
from oars.service import ResponsesService
from oars.settings import ServerSettings
from oars.testing import ScriptedEngine


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--replica", required=True)
    parser.add_argument("--chunks", type=int, default=3)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--mcp-call", default=None)
    parser.add_argument("--script", type=json.loads, default=None)
    args = parser.parse_args()
    from oars.mcp.config import McpConfig
    from oars.store import SqlStore
    from oars.toolbox import ToolboxFactory

    engine = ScriptedEngine([f"w{i} " for i in range(args.chunks)], delay=args.delay)
    if args.script is not None:
        engine.script, engine.family = args.script, Hermes(think_tags=THINK_TAGS)
    toolboxes = None
    if args.mcp_call is not None:
        call = args.mcp_call
        engine.script = lambda r: ["Done."] if r.after_tool_output else [call]
        toolboxes = ToolboxFactory(McpConfig.of(allow=["http://127.0.0.1"]))
    app = create_app(
        ResponsesService(engine, toolboxes=toolboxes),
        SqlStore(args.store),
        settings=ServerSettings(replica=args.replica, lease_seconds=args.lease),
    )
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()

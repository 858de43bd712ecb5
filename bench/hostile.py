"""The hostile requests that used to cost seconds, minutes or the process, timed against a real
`oars serve` on the default model: each must be a 4xx naming its parameter, in milliseconds.

    .venv/bin/python -m bench.hostile
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import httpx

from bench.servers import Server, oars_serve
from oars.weights import DEFAULT_MODEL

MODEL = DEFAULT_MODEL.name

LONE = "\\ud800"


def _cases() -> list[tuple[str, bytes]]:
    def body(**fields: object) -> bytes:
        return json.dumps({"model": MODEL, "input": "x", **fields}).encode()

    rules = "\n".join(
        ["start: r0", *(f'r{i}: "a" r{i + 1} | "b"' for i in range(4000)), 'r4000: "z"']
    )
    grammar = {
        "type": "custom",
        "name": "g",
        "format": {"type": "grammar", "syntax": "lark", "definition": rules},
    }
    return [
        ("(a valid request, 1 output token: the reference)", body(max_output_tokens=1)),
        ("lone surrogate in input", body(input="SUR").replace(b"SUR", LONE.encode())),
        (
            "lone surrogate in a metadata key",
            body(metadata={"SUR": "v"}).replace(b"SUR", LONE.encode()),
        ),
        ("invalid UTF-8 bytes", b'{"model": "m", "input": "\xff\xfe"}'),
        ("seed 99999999999999999", body(seed=99999999999999999)),
        (
            "4,000-rule chain grammar (was a segfault)",
            body(tools=[grammar], tool_choice="required"),
        ),
        (
            "3,000-character tool name (was a hang)",
            body(
                tools=[{"type": "function", "name": "f" * 3000, "parameters": {"type": "object"}}]
            ),
        ),
        ("5 MB model name", body(model="m" * 5_000_000, stream=True)),
        ("100 MB body", b'{"model": "m", "input": "' + b"a" * 100_000_000 + b'"}'),
        ("100,000 messages", body(input=[{"role": "user", "content": "hi"}] * 100_000)),
        ("15,000 messages", body(input=[{"role": "user", "content": "hi"}] * 15_000)),
        ("50 MB string", body(input="a" * 50_000_000)),
    ]


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = ["--store", f"sqlite:///{tmp}/oars.db"]
        with Server("oars", lambda port: oars_serve(port, *store), Path(tmp) / "log") as server:
            print("| request | status | param | ms |")
            print("|---|---|---|---|")
            client = httpx.Client(timeout=600, headers={"content-type": "application/json"})
            for name, raw in _cases():
                start = time.perf_counter()
                r = client.post(f"{server.base}/v1/responses", content=raw)
                ms = (time.perf_counter() - start) * 1000
                param = r.json()["error"]["param"] if r.status_code >= 400 else "-"
                param = "(none: the body)" if param is None else param
                print(f"| {name} | {r.status_code} | {param} | {ms:.0f} |")


if __name__ == "__main__":
    main()

"""One run of `bench.overhead`: what a generated token costs outside llama.cpp, in one real
`oars serve` on the default model, served in this process.

    python -m bench.token_cost [--streams 1] [--tokens 200] [--store] [--model GGUF]

It imports nothing of `bench`, only `oars` and libraries, so that `bench.overhead --against DIR`
can run it on the `oars` of another checkout (from there, through `runpy`). The server runs on
the main thread (its event loop, as `oars serve` runs it); after one short warm-up stream,
`--streams` client processes stream `--tokens` tokens each (greedy, `store` as asked), then the
server is stopped. It prints one line of JSON: the output tokens, the wall seconds, and per
token the event loop thread's CPU ms, the engine thread's time between two forward passes
(wall, median) and one forward pass (`llama_decode`, wall, median).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from oars import cli
from oars.weights import pull

CLIENT = """
import httpx, sys
port, tokens, store, start = sys.argv[1:5]
body = {"model": "bench", "input": f"Count from {start} to 500, separated by commas.",
        "stream": True, "temperature": 0, "max_output_tokens": int(tokens), "store": store == "1"}
with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/responses", json=body, timeout=600) as r:
    for _ in r.iter_lines():
        pass
"""


def _context_class() -> Any:
    """`LlamaContext`, where the checkout run keeps it (`oars.engines.llama_context` since
    `engines/llama.py` was split, `oars.engines.llama` before)."""
    for module in ("oars.engines.llama_context", "oars.engines.llama"):
        with contextlib.suppress(ImportError):
            return importlib.import_module(module).LlamaContext
    raise SystemExit("no LlamaContext in this checkout's oars")


class Passes:
    """Wall times around every llama_decode of the server's context."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, float]] = []  # (entered, returned)
        context = _context_class()
        real = context.decode
        marks = self.marks

        def decode(context: Any, feeds: Any) -> None:
            entered = time.perf_counter()
            try:
                real(context, feeds)
            finally:
                marks.append((entered, time.perf_counter()))

        context.decode = decode

    def gaps(self) -> list[float]:
        """Returned → next entered, within a busy stretch (not idle waits)."""
        m = self.marks
        return [b[0] - a[1] for a, b in itertools.pairwise(m) if b[0] - a[1] < 0.05]


def _streams(port: int, n: int, tokens: int, store: bool) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT, str(port), str(tokens), "1" if store else "0", str(i)]
        )
        for i in range(1, n + 1)
    ]
    for p in procs:
        p.wait()


def _output_tokens(base: str) -> int:
    metrics = httpx.get(f"{base}/metrics", timeout=5).text
    return int(
        sum(
            sample.value
            for family in text_string_to_metric_families(metrics)
            for sample in family.samples
            if sample.name == "oars_tokens_total" and sample.labels["kind"] == "output"
        )
    )


def _drive(args: argparse.Namespace, port: int, passes: Passes, out: dict[str, Any]) -> None:
    """On a thread of its own: the load, timed, then the server told to stop."""
    base = f"http://127.0.0.1:{port}"
    while True:
        try:
            httpx.get(f"{base}/v1/models", timeout=5)
            break
        except httpx.HTTPError:
            time.sleep(0.2)
    main_thread = threading.main_thread().ident
    assert main_thread is not None
    loop_clock = time.pthread_getcpuclockid(main_thread)  # the event loop's CPU time
    _streams(port, 1, 16, args.store)  # warm
    tokens_before = _output_tokens(base)
    passes.marks.clear()
    cpu_before, began = time.clock_gettime(loop_clock), time.perf_counter()
    _streams(port, args.streams, args.tokens, args.store)
    wall, cpu = time.perf_counter() - began, time.clock_gettime(loop_clock) - cpu_before
    tokens = _output_tokens(base) - tokens_before
    out.update(
        tokens=tokens,
        wall=wall,
        loop_ms=cpu * 1000 / tokens,
        gap_ms=statistics.median(passes.gaps()) * 1000,
        pass_ms=statistics.median(b - a for a, b in passes.marks) * 1000,
    )
    os.kill(os.getpid(), signal.SIGINT)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--store", action="store_true", help="store the responses (SQLite)")
    parser.add_argument("--model", default=None, help="a GGUF (default: oars's own)")
    args = parser.parse_args()
    model = args.model or str(pull())
    passes, port = Passes(), _free_port()
    out: dict[str, Any] = {}
    driver = threading.Thread(target=_drive, args=(args, port, passes, out), daemon=True)
    with tempfile.TemporaryDirectory() as home:
        os.environ["OARS_HOME"] = home  # after the pull: nothing kept from a run before
        driver.start()
        serve = ["serve", "--model", model, "--port", str(port), "--log-level", "warning"]
        cli.main(serve + ([] if args.store else ["--store", "none"]))
    if not out:
        raise SystemExit("the run did not finish")
    print(json.dumps(out))


if __name__ == "__main__":
    main()

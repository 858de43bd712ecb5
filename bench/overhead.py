"""What a generated token costs outside llama.cpp, in a real `oars serve` on the default model.

    .venv/bin/python -m bench.overhead [--streams 1] [--tokens 200] [--reps 3] [--store]

The server runs in this process (its event loop on the main thread, as `oars serve` runs it);
each rep, `--streams` client processes stream `--tokens` tokens each (greedy, `store` as asked).
It reports, per generated token:

- the event loop thread's CPU time (turning tokens into events, SSE, the store's writes);
- the engine thread's time between two forward passes (wall, median): sampling, handing the
  token over, planning the next batch. On 2 cores both come out of llama.cpp's share, whose
  threads wait for each other at every step;
- the forward pass itself (llama_decode, wall, median), for scale.

The client runs in other processes, so its CPU is not counted (but it shares the cores).
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.vs_llama_server import _thread_cpu
from oars import cli
from oars.engines import llama
from oars.weights import pull
from tests.model.conftest import _free_port

CLIENT = """
import httpx, sys
port, tokens, store, start = sys.argv[1:5]
body = {"model": "bench", "input": f"Count from {start} to 500, separated by commas.",
        "stream": True, "temperature": 0, "max_output_tokens": int(tokens), "store": store == "1"}
with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/responses", json=body, timeout=600) as r:
    for _ in r.iter_lines():
        pass
"""


class Passes:
    """Wall times around every llama_decode of the server's context."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, float]] = []  # (entered, returned)
        real = llama.LlamaContext.decode
        marks = self.marks

        def decode(context: Any, feeds: Any) -> None:
            entered = time.perf_counter()
            try:
                real(context, feeds)
            finally:
                marks.append((entered, time.perf_counter()))

        llama.LlamaContext.decode = decode  # type: ignore[method-assign,assignment]

    def gaps(self) -> list[float]:
        """Returned → next entered, within a busy stretch (not idle waits)."""
        m = self.marks
        return [b[0] - a[1] for a, b in itertools.pairwise(m) if b[0] - a[1] < 0.05]


def _drive(args: argparse.Namespace, port: int, passes: Passes, out: dict[str, Any]) -> None:
    base = f"http://127.0.0.1:{port}"
    while True:
        try:
            httpx.get(f"{base}/v1/models", timeout=5)
            break
        except httpx.HTTPError:
            time.sleep(0.2)
    loop_id = threading.main_thread().native_id
    assert loop_id is not None

    def streams(n: int, tokens: int) -> float:
        began = time.perf_counter()
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    CLIENT,
                    str(port),
                    str(tokens),
                    "1" if args.store else "0",
                    str(i + 1),
                ]
            )
            for i in range(n)
        ]
        for p in procs:
            p.wait()
        return time.perf_counter() - began

    streams(1, 16)  # warm
    usage = httpx.get(f"{base}/metrics", timeout=5).text
    tokens_before = _output_tokens(usage)
    passes.marks.clear()
    cpu_before = _thread_cpu(os.getpid())[loop_id]
    wall = sum(streams(args.streams, args.tokens) for _ in range(args.reps))
    cpu = _thread_cpu(os.getpid())[loop_id] - cpu_before
    tokens = _output_tokens(httpx.get(f"{base}/metrics", timeout=5).text) - tokens_before
    decodes = [b - a for a, b in passes.marks]
    out.update(
        tokens=tokens,
        wall=wall,
        loop_ms=cpu * 1000 / tokens,
        gap_ms=statistics.median(passes.gaps()) * 1000,
        pass_ms=statistics.median(decodes) * 1000,
    )
    os.kill(os.getpid(), signal.SIGINT)


def _output_tokens(metrics: str) -> int:
    return int(
        sum(
            sample.value
            for family in text_string_to_metric_families(metrics)
            for sample in family.samples
            if sample.name == "oars_tokens_total" and sample.labels["kind"] == "output"
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--store", action="store_true", help="store the responses (SQLite)")
    args = parser.parse_args()
    model = pull()
    passes = Passes()
    port = _free_port()
    out: dict[str, Any] = {}
    driver = threading.Thread(target=_drive, args=(args, port, passes, out), daemon=True)
    with tempfile.TemporaryDirectory() as home:
        os.environ["OARS_HOME"] = home
        driver.start()
        cli.main(
            ["serve", "--model", str(model), "--port", str(port), "--log-level", "warning"]
            + ([] if args.store else ["--store", "none"])
        )
    if not out:
        raise SystemExit("the bench did not finish")
    print(
        f"{args.streams} stream(s) × {args.tokens} tokens × {args.reps} reps, "
        f"store {'on' if args.store else 'off'}: {out['tokens']} tokens in {out['wall']:.1f} s"
    )
    print(f"event loop thread CPU: {out['loop_ms']:.3f} ms per token")
    print(f"between two passes (engine thread, wall, median): {out['gap_ms']:.3f} ms")
    print(f"one forward pass (llama_decode, wall, median): {out['pass_ms']:.2f} ms")


if __name__ == "__main__":
    main()

"""A new process serving a prompt it kept on disk: where its time to first token goes.

    .venv/bin/python -m bench.lab.restart [--tokens 8000]

First, a process of its own evaluates a system prompt of about `--tokens` tokens (random words,
as bench.vs_llama_server's Codex-sized session) and keeps it (OARS_HOME in a temporary folder);
at 8,000 tokens that takes about 90 s on 2 cores. Then a new process starts the engine and at
once sends the same system prompt with another user message, in-process (no HTTP), timing: the
engine's start (weights, vocabulary tables, warming), the request's preparation, finding the
kept state (mapped), loading it into a slot, the pass over the remaining tokens, and the first
token.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.prompts import chat
from oars.engines.llama import LlamaEngine
from oars.generation import ChatMessage, EngineRequest, SamplingParams
from oars.settings import EngineSettings
from oars.weights import pull


def _request(tokens: int, user: str) -> EngineRequest:
    system, question = chat("restart", tokens, user)
    messages = (ChatMessage("system", system["content"]), ChatMessage("user", question["content"]))
    return EngineRequest(
        messages=messages, sampling=SamplingParams(temperature=0.0, max_output_tokens=4)
    )


async def _first_token(engine: LlamaEngine, request: EngineRequest) -> float:
    start = time.perf_counter()
    opened = await engine.open(request)
    async for _ in engine.generate(opened):
        return time.perf_counter() - start
    raise RuntimeError("no output")


def _timed(times: dict[str, float], name: str, call: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(call)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            times.setdefault(name, time.perf_counter() - start)  # the first call's

    return timed


def _phase(phase: str, home: Path, tokens: int) -> dict[str, float]:
    start = time.perf_counter()
    engine = LlamaEngine(
        pull(), EngineSettings(context=16384), gpu_layers=0, prefix_folder=home / "prefixes"
    )
    times = {"engine start": time.perf_counter() - start}
    if phase == "keep":
        times["first send"] = asyncio.run(_first_token(engine, _request(tokens, "Hello.")))
        store = engine.batcher.prefix_store
        assert store is not None
        store.flush()
        return times
    store, context = engine.batcher.prefix_store, engine.batcher.context
    assert store is not None
    store.find = _timed(times, "find the kept state", store.find)  # type: ignore[method-assign]
    engine.prepare = _timed(times, "prepare (render, tokenize)", engine.prepare)  # type: ignore[method-assign]
    context.load = _timed(times, "load it into a slot", context.load)  # type: ignore[method-assign]
    context.decode = _timed(times, "pass over the new tokens", context.decode)  # type: ignore[method-assign]
    request = _request(tokens, "List the files you would read first.")
    times["time to first token"] = asyncio.run(_first_token(engine, request))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=8000)
    parser.add_argument("--phase", choices=("keep", "restart"), help=argparse.SUPPRESS)
    parser.add_argument("--home", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(_phase(args.phase, args.home, args.tokens)))
        return
    with tempfile.TemporaryDirectory(prefix="oars-restart-") as tmp:
        for phase in ("keep", "restart"):
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench.lab.restart",
                    "--phase",
                    phase,
                    "--home",
                    tmp,
                    "--tokens",
                    str(args.tokens),
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            times = json.loads(out.strip().splitlines()[-1])
            print(f"{phase}: " + ", ".join(f"{k} {v:.3f} s" for k, v in times.items()))


if __name__ == "__main__":
    main()

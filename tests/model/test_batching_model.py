"""Continuous batching on the real model: concurrent streams, the same text as alone, a slot
freed by a hang-up, 429 past the queue, and prompts kept on disk across a restart."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from oars.validator import validate_sse
from oars.weights import model_path
from tests.model.conftest import _serve

pytestmark = pytest.mark.model

GREEDY = {"model": "default", "temperature": 0, "seed": 11, "max_output_tokens": 24}
TOPICS = ("the sea", "a lighthouse", "the number seven", "autumn rain")
LONG = {
    "model": "default",  # writes to its token limit (at temperature 0)
    "input": "List the numbers from 1 to 2000, one per line, with no other text.",
    "max_output_tokens": 2000,
    "temperature": 0,
}


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _serve(tmp_path_factory, "--ctx", "4096", "--parallel", "4")


@pytest.fixture(scope="module")
def one_slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _serve(tmp_path_factory, "--ctx", "4096", "--parallel", "1", "--queue-depth", "2")


def _timed_stream(server: str, body: dict[str, Any]) -> dict[str, Any]:
    """Stream one response; its final object, and when its first delta and its end came."""
    start = time.monotonic()
    first = None
    lines = []
    with httpx.stream(
        "POST", f"{server}/responses", json={**body, "stream": True}, timeout=300
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            lines.append(line)
            if first is None and line == "event: response.output_text.delta":
                first = time.monotonic() - start
    report = validate_sse("\n".join(lines) + "\n")
    assert report.ok, report.text()
    return {"final": report.final, "first": first, "end": time.monotonic() - start}


def _debug_server(
    factory: pytest.TempPathFactory, folder: Path, *args: str
) -> Generator[str, None, None]:
    """A server of 2,048-token sequences logging at debug level to `folder / "oars.log"`;
    `next()` starts it, `close()` stops it."""
    served = _serve(factory, "--ctx", "2048", "--log-level", "debug", *args, folder=folder)
    return cast(Generator[str, None, None], served)


def _text(final: dict[str, Any]) -> str:
    return "".join(
        c["text"] for item in final["output"] if item["type"] == "message" for c in item["content"]
    )


def test_batched_requests_give_the_text_each_gives_alone(four: str) -> None:
    bodies = [{**GREEDY, "input": f"Write two lines about {t}."} for t in TOPICS]
    alone = [_timed_stream(four, body)["final"] for body in bodies]
    with ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(lambda b: _timed_stream(four, b), bodies))
    assert [_text(r["final"]) for r in together] == [_text(f) for f in alone]
    assert all(_text(f) for f in alone)
    assert [r["final"]["usage"] for r in together] == [f["usage"] for f in alone]
    # they ran together: every first token came before the last stream ended
    assert max(r["first"] for r in together) < max(r["end"] for r in together)


def _logprobs(final: dict[str, Any]) -> list[tuple[str, float, list[float]]]:
    return [
        (lp["token"], lp["logprob"], [t["logprob"] for t in lp["top_logprobs"]])
        for item in final["output"]
        if item["type"] == "message"
        for c in item["content"]
        for lp in c["logprobs"]
    ]


def test_a_sequence_s_logprobs_do_not_depend_on_what_runs_beside_it(four: str) -> None:
    """Prompts of unequal lengths (some past 256 tokens, where llama.cpp pads the memory a
    pass reads), sampled (temperature 1, seeded): each token's logprobs in a batch are its
    lone run's to the last bit, so the same seed gives the same text at any load."""
    bodies = [
        {
            **GREEDY,
            "temperature": 1,
            "max_output_tokens": 12,
            "include": ["message.output_text.logprobs"],
            "top_logprobs": 3,
            "input": f"Write two lines about {t}." + " Be brief." * (30 * n),
        }
        for n, t in enumerate(TOPICS)
    ]  # ~40 to ~310 tokens
    alone = [_timed_stream(four, body)["final"] for body in bodies]
    with ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(lambda b: _timed_stream(four, b), bodies))
    assert all(_logprobs(f) for f in alone)
    assert [_logprobs(r["final"]) for r in together] == [_logprobs(f) for f in alone]
    assert max(r["first"] for r in together) < max(r["end"] for r in together)


def test_prompts_waiting_together_share_passes_and_change_no_logprob(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """Prompts that arrive together are evaluated in shared passes where llama.cpp's graphs
    keep 8 rows or more (the same length, or one longer by 8 tokens or more, but not one
    longer by a token); each token's logprobs are still its lone run's to the last bit."""
    server = _debug_server(tmp_path_factory, tmp_path, "--parallel", "4")
    base = next(server)
    try:
        bodies = [
            {
                **GREEDY,
                "temperature": 1,
                "max_output_tokens": 8,
                "include": ["message.output_text.logprobs"],
                "top_logprobs": 2,
                "input": f"Write a line about the letter {letter}." + extra,
            }
            for letter, extra in zip("ABCD", ("", " Be", " Be brief." * 4, ""), strict=True)
        ]
        alone = [_timed_stream(base, body)["final"] for body in bodies]
        start = (tmp_path / "oars.log").stat().st_size
        with ThreadPoolExecutor(len(bodies)) as pool:
            together = list(pool.map(lambda b: _timed_stream(base, b), bodies))
    finally:
        server.close()
    assert all(_logprobs(f) for f in alone)
    assert [_logprobs(r["final"]) for r in together] == [_logprobs(f) for f in alone]
    with open(tmp_path / "oars.log", encoding="utf-8") as log:
        log.seek(start)
        fed = [
            [int(n) for n in re.findall(r"\d+:\d+\+(\d+)", line)]
            for line in log
            if "pass feeds=" in line
        ]
    assert any(sum(n > 1 for n in feeds) >= 2 for feeds in fed), fed


def test_four_streams_at_once_each_start_while_the_others_run(four: str) -> None:
    bodies = [
        {
            **LONG,
            "max_output_tokens": 48,
            "input": f"List the numbers from {n} to 2000, one per line, with no other text.",
        }
        for n in (1, 10, 100, 300)
    ]
    with ThreadPoolExecutor(len(bodies)) as pool:
        results = list(pool.map(lambda b: _timed_stream(four, b), bodies))
    assert all(r["final"]["usage"]["output_tokens"] == 48 for r in results)
    first_end = min(r["end"] for r in results)
    assert all(r["first"] < first_end for r in results)


# a JSON answer that must hold 2,000 numbers: the model cannot end it early
ENDLESS = {
    **LONG,
    "text": {
        "format": {
            "type": "json_schema",
            "name": "numbers",
            "schema": {
                "type": "object",
                "properties": {
                    "numbers": {"type": "array", "items": {"type": "integer"}, "minItems": 2000}
                },
                "required": ["numbers"],
                "additionalProperties": False,
            },
        }
    },
}


def _queued(server: str) -> float:
    metrics = httpx.get(f"{server.removesuffix('/v1')}/metrics", timeout=10).text
    lines = [line for line in metrics.splitlines() if line.startswith("oars_generations_queued{")]
    return sum(float(line.split()[-1]) for line in lines)


def _busy_stream(server: str, started: threading.Event, stop: threading.Event) -> None:
    with httpx.stream(
        "POST", f"{server}/responses", json={**ENDLESS, "stream": True}, timeout=300
    ) as response:
        for line in response.iter_lines():
            if line == "event: response.output_text.delta":
                started.set()
            if stop.is_set():
                return


def test_a_hang_up_frees_the_slot_and_past_the_queue_comes_a_429(one_slot: str) -> None:
    started, stop = threading.Event(), threading.Event()
    runner = threading.Thread(target=_busy_stream, args=(one_slot, started, stop))
    runner.start()
    assert started.wait(60)
    # one running, two may wait: a third waiting request is refused at once
    waiting: list[dict[str, Any]] = []
    body = {**GREEDY, "input": "Say hello.", "max_output_tokens": 8}
    queued = [
        threading.Thread(target=lambda: waiting.append(_timed_stream(one_slot, body)))
        for _ in range(2)
    ]
    for thread in queued:
        thread.start()
    deadline = time.monotonic() + 30
    while _queued(one_slot) < 2:  # both accepted, waiting for the only sequence
        assert time.monotonic() < deadline
        time.sleep(0.1)
    refused = httpx.post(f"{one_slot}/responses", json=body, timeout=30)
    assert refused.status_code == 429, refused.text
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    # the running stream hangs up: its slot goes to the waiting requests, which complete
    stop.set()
    runner.join(30)
    for thread in queued:
        thread.join(60)
    assert [r["final"]["usage"]["output_tokens"] for r in waiting] == [8, 8]
    assert httpx.post(f"{one_slot}/responses", json=body, timeout=60).status_code == 200


def test_a_long_prompt_is_kept_on_disk_for_a_new_process(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    home = {"OARS_HOME": str(tmp_path)}
    args = (
        "--model",
        str(model_path()),
        "--ctx",
        "4096",
        "--prefix-cache-min-tokens",
        "256",
        "--prefix-cache-mb",
        "16",
    )
    # what a past llama.cpp version left, over the bound: this process cannot use it
    stale = tmp_path / "prefixes/0123456789abcdef/old.kv"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(bytes(20 * 2**20))
    instructions = "You are a careful assistant for a software project. " * 40
    # unseeded: a seeded request evaluates its whole prompt
    body = {
        "model": "default",
        "temperature": 0,
        "instructions": instructions,
        "max_output_tokens": 4,
    }
    server = cast(Generator[str, None, None], _serve(tmp_path_factory, *args, env=home))
    first = _timed_stream(next(server), {**body, "input": "Say A."})["final"]
    deadline = time.monotonic() + 30  # written in the background
    while not (kept := list((tmp_path / "prefixes").glob("*/*.kv"))):
        assert time.monotonic() < deadline, "the prompt was not kept"
        time.sleep(0.2)
    server.close()
    assert len(kept) == 1 and not stale.parent.exists()
    server = cast(Generator[str, None, None], _serve(tmp_path_factory, *args, env=home))
    second = _timed_stream(next(server), {**body, "input": "Say B."})["final"]
    server.close()
    usage, before = second["usage"], first["usage"]
    assert before["input_tokens_details"]["cached_tokens"] == 0
    cached = usage["input_tokens_details"]["cached_tokens"]
    # everything up to where "Say A." and "Say B." differ
    assert 400 < cached < usage["input_tokens"] == before["input_tokens"]
    # with flash attention llama.cpp lays the memory out otherwise: what was kept without it
    # is not loaded, and the prompt is evaluated again
    flash = (*args, "--flash-attn", "on")
    folder = tmp_path / "flash"
    folder.mkdir()
    server = cast(
        Generator[str, None, None], _serve(tmp_path_factory, *flash, env=home, folder=folder)
    )
    third = _timed_stream(next(server), {**body, "input": "Say C."})["final"]
    server.close()
    assert third["status"] == "completed" and _text(third)
    assert third["usage"]["input_tokens_details"]["cached_tokens"] == 0
    assert "flash attention on" in (folder / "oars.log").read_text()


def test_llama_cpp_s_own_log_comes_through_oars_s_log_at_debug_level(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    server = _debug_server(tmp_path_factory, tmp_path, "--parallel", "1", "--log-format", "json")
    next(server)
    server.close()
    lines = [
        json.loads(line)
        for line in (tmp_path / "oars.log").read_text().splitlines()
        if line.startswith("{")
    ]
    llama = [line for line in lines if line["logger"] == "oars.llama"]
    buffers = [
        line["message"]
        for line in llama
        if re.match(r"load_tensors: +\S+ model buffer size = +[\d.]+ MiB$", line["message"])
    ]
    # whole lines, pieces joined: where llama.cpp put the weights; none repacked (a batch's
    # rows would go through other kernels than a lone row)
    assert buffers and not [b for b in buffers if "REPACK" in b], buffers
    # nor flash attention (its kernels also depend on the batch), unless `--flash-attn on`
    flash = [
        m
        for line in llama
        if (m := re.match(r"llama_context: +flash_attn += (\w+)", line["message"]))
    ]
    assert flash and {m.group(1) for m in flash} == {"disabled"}
    assert {line["level"] for line in llama} == {"debug"}

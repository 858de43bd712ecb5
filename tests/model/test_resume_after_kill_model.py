"""The issue's own steps on the real model: two `oars serve` replicas on one SQLite file, a
stored background stream on replica a, `kill -9` right after a delta, and the client resumes on
replica b after the last sequence number it received, once b has ended the orphan. What it
assembles is the stored response: no number twice, none missing, the same text.
(`tests/fast/test_resume_after_kill.py` cuts every stage of a stream, on PostgreSQL too.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from oars.validator import validate_events, validate_sse
from tests.model.conftest import SECRET_KEY, _free_port, _stop, _wait_ready

pytestmark = pytest.mark.model


@contextmanager
def _replica(store: Path, name: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = _free_port()
    log = store.parent / f"{name}.log"
    cmd = [
        *(sys.executable, "-m", "oars.cli", "serve", "--port", str(port)),
        *("--store", str(store), "--replica", name, "--ctx", "1024"),
    ]
    with open(log, "wb") as out:
        env = {**os.environ, "OARS_SECRET_KEY": SECRET_KEY}
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base, proc, log)
        yield f"{base}/v1", proc
    finally:
        if proc.poll() is None:
            _stop(proc)


class _Reader(threading.Thread):
    """The client: reads the stream live until it ends or breaks."""

    def __init__(self, base: str) -> None:
        super().__init__(daemon=True)
        self.base = base
        self.events: list[dict[str, Any]] = []

    def run(self) -> None:
        body = {
            "input": "Write a long story about a dragon.",
            "stream": True,
            "background": True,
            "store": True,
            "max_output_tokens": 200,
            "temperature": 0,
        }
        try:
            with httpx.stream("POST", f"{self.base}/responses", json=body, timeout=60) as stream:
                for line in stream.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(json.loads(line.removeprefix("data: ")))
        except httpx.HTTPError:
            pass  # its replica died


def test_a_stream_cut_by_kill_resumes_on_another_replica_as_stored(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    store = tmp_path_factory.mktemp("replicas") / "oars.db"
    with _replica(store, "a") as (a, victim):
        reader = _Reader(a)
        reader.start()
        deadline = time.monotonic() + 120
        while sum(e["type"] == "response.output_text.delta" for e in list(reader.events)) < 3:
            assert reader.is_alive() and time.monotonic() < deadline, reader.events[-3:]
            time.sleep(0.001)
        os.kill(victim.pid, signal.SIGKILL)  # right after a delta reached the client
        victim.wait()
        reader.join(timeout=30)
    received = reader.events
    assert received[-1]["type"] == "response.output_text.delta", received[-1]
    response_id = received[0]["response"]["id"]
    with _replica(store, "b") as (b, _):
        deadline = time.monotonic() + 60  # b ends the orphan once a's lease (10 s) lapses
        while (stored := httpx.get(f"{b}/responses/{response_id}").json())["status"] != "failed":
            assert time.monotonic() < deadline, stored["status"]
            time.sleep(0.25)
        last = received[-1]["sequence_number"]
        params = {"stream": "true", "starting_after": str(last)}
        rest = validate_sse(httpx.get(f"{b}/responses/{response_id}", params=params).text).events
    whole = received + rest
    numbers = [e["sequence_number"] for e in whole]
    assert numbers == list(range(len(numbers))), numbers
    report = validate_events(whole)
    assert report.ok, report.text()
    assert whole[-1]["type"] == "response.failed" and whole[-1]["response"] == stored
    text = "".join(e["delta"] for e in whole if e["type"] == "response.output_text.delta")
    assert text and text == stored["output"][0]["content"][0]["text"]

"""The issue's own steps on the real model: two `oars serve` replicas on one SQLite file, a
stored background stream on replica a, `kill -9` right after a delta, and the client resumes on
replica b after the last sequence number it received, once b has ended the orphan. What it
assembles is the stored response: no number twice, none missing, the same text.
(`tests/fast/test_resume_after_kill.py` cuts every stage of a stream, on PostgreSQL too.)"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.fast.test_resume_after_kill import Reader, _check_resume
from tests.model.conftest import serving

pytestmark = pytest.mark.model


def _replica(store: Path, name: str) -> list[str]:
    return ["--store", str(store), "--replica", name, "--ctx", "1024"]


STORY = {
    "input": "Write a long story about a dragon.",
    "stream": True,
    "background": True,
    "store": True,
    "max_output_tokens": 200,
    "temperature": 0,
}


def test_a_stream_cut_by_kill_resumes_on_another_replica_as_stored(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    store = tmp_path_factory.mktemp("replicas") / "oars.db"
    with serving(store.parent / "a.log", *_replica(store, "a")) as (a, victim):
        reader = Reader(a, STORY)
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
    with serving(store.parent / "b.log", *_replica(store, "b")) as (b, _):
        # b ends the orphan once a's lease (10 s) lapses; the resumed stream must agree
        _check_resume(b, received)

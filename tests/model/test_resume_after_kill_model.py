"""The issue's own steps on the real model: two `oars serve` replicas on one SQLite file, a
stored background stream on replica a, `kill -9` right after a delta, and the client resumes on
replica b after the last sequence number it received, once b has ended the orphan. What it
assembles is the stored response: no number twice, none missing, the same text.
(`tests/fast/test_resume_after_kill.py` cuts every stage of a stream, on PostgreSQL too.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.fast.test_resume_after_kill import Reader, _check_resume
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
    with _replica(store, "a") as (a, victim):
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
    with _replica(store, "b") as (b, _):
        # b ends the orphan once a's lease (10 s) lapses; the resumed stream must agree
        _check_resume(b, received)

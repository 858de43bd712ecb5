"""`oars serve --workers N`: gateway processes on one port sharing one store (a real SQLite file),
in front of replay upstreams. Connections spread over the workers; a chain, a background
response and its resumed stream work whichever worker each request lands on; SIGTERM stops
every worker; the embedded engine is refused."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from oars.engines.upstream import replica_name
from oars.validator import validate_sse
from tests.conftest import free_port
from tests.fast.test_gateway_replicas import ROOT, _toml
from tests.fast.test_replicas import running
from tests.upstream_replay import Replay, text_stream


@contextmanager
def workers(config: Path, store: Path, count: int) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    cmd = [sys.executable, "-c", "import sys; from oars.cli import main; sys.exit(main())"]
    cmd += ["serve", "--upstreams", str(config), "--port", str(port), "--replica", "w"]
    cmd += ["--store", f"sqlite:///{store}", "--workers", str(count)]
    with running(cmd, port) as served:
        yield served


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_workers_share_the_port_and_the_store(tmp_path: Path) -> None:
    with ExitStack() as stack:
        three = [stack.enter_context(Replay()) for _ in range(3)]
        for upstream in three:
            upstream.default = text_stream(["Hello", " there", " friend"])
        config = _toml(tmp_path / "up.toml", [u.url for u in three])
        store = tmp_path / "oars.db"
        base, proc = stack.enter_context(workers(config, store, 2))
        pids = _children(proc.pid)
        assert len(pids) == 2

        async def many() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=30) as client:
                body = {"model": "m", "input": "hi", "stream": True}
                return await asyncio.gather(
                    *(client.post(f"{base}/responses", json=body) for _ in range(32))
                )

        for r in asyncio.run(many()):  # each on a connection of its own
            report = validate_sse(r.text)
            assert report.ok, report.text()
        # a chain, each turn on a new connection: every worker finds what the other kept
        previous = httpx.post(f"{base}/responses", json={"model": "m", "input": "t0"}).json()
        for i in range(1, 8):
            body = {"model": "m", "input": f"t{i}", "previous_response_id": previous["id"]}
            r = httpx.post(f"{base}/responses", json=body, timeout=30)
            assert r.status_code == 200, r.text
            previous = r.json()
        served = {
            u.url for u in three if any(b["messages"][-1]["content"] == "t7" for b in u.bodies)
        }
        chain = [u for u in three if any(b["messages"][-1]["content"] == "t1" for b in u.bodies)]
        assert served == {chain[0].url}  # the chain kept its upstream replica across workers
        started = httpx.post(
            f"{base}/responses", json={"model": "m", "input": "bg", "background": True}
        ).json()
        replay = httpx.get(f"{base}/responses/{started['id']}", params={"stream": "true"})
        report = validate_sse(replay.text)
        assert report.ok and report.final is not None, report.text()
        assert report.final["status"] == "completed"
        with sqlite3.connect(store) as db:
            owners = {row[0] for row in db.execute("SELECT owner FROM responses")}
            served_by = {row[0] for row in db.execute("SELECT served_by FROM responses")}
        assert owners == {"w/0", "w/1"}  # both workers served, each as its own replica
        assert served_by <= {replica_name(u.url) for u in three}
        proc.terminate()
        assert proc.wait(timeout=30) == 0
        for pid in pids:  # no worker outlives the parent
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)


def test_workers_are_for_the_gateway(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", "import sys; from oars.cli import main; sys.exit(main())"]
    cmd += ["serve", "--workers", "2", "--port", str(free_port()), "--store", "none"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "--workers is for the gateway" in done.stderr

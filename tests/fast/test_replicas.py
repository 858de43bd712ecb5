"""Several `oars` processes on one store: what one replica starts, another reads, follows and
cancels; a replica killed mid-generation leaves no response stuck. Real processes, a real
PostgreSQL (and a real SQLite file for the restart case), the scripted engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from oars.validator import validate_sse
from tests.conftest import McpProcess, free_port, new_database

ROOT = Path(__file__).parent.parent.parent


@contextmanager
def replica(
    store: str,
    name: str,
    *,
    chunks: int = 3,
    delay: float = 0.0,
    port: int | None = None,
    mcp_call: str | None = None,
    script: list[str] | None = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = port or free_port()
    cmd = [
        sys.executable,
        "-m",
        "tests.replica",
        "--store",
        store,
        "--port",
        str(port),
        "--replica",
        name,
        "--chunks",
        str(chunks),
        "--delay",
        str(delay),
        *(["--mcp-call", mcp_call] if mcp_call else []),
        *(["--script", json.dumps(script)] if script else []),
    ]
    with running(cmd, port) as served:
        yield served


@contextmanager
def running(cmd: list[str], port: int) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A server process on `port`, once it answers: its base URL and the process; stopped
    (SIGTERM) at the end if it still runs."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        _wait(base, proc)
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
        if proc.stderr is not None:
            proc.stderr.close()


def _wait(base: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(proc.stderr.read().decode() if proc.stderr else "exited")
        try:
            httpx.get(f"{base.removesuffix('/v1')}/health", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError("replica did not start")


def _until(
    base: str, response_id: str, statuses: tuple[str, ...], timeout: float = 30
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body: dict[str, Any] = httpx.get(f"{base}/responses/{response_id}", timeout=10).json()
        if body["status"] in statuses:
            return body
        time.sleep(0.05)
    raise AssertionError(f"{response_id} never reached {statuses}")


def test_two_replicas_share_one_postgresql(postgres_server: str) -> None:
    url = new_database(postgres_server)
    with replica(url, "a", chunks=60, delay=0.03) as (a, _), replica(url, "b") as (b, _):
        made = httpx.post(f"{a}/responses", json={"input": "hello"}, timeout=30).json()
        assert httpx.get(f"{b}/responses/{made['id']}").json() == made
        items = httpx.get(f"{b}/responses/{made['id']}/input_items").json()
        assert items["data"][0]["content"][0]["text"] == "hello"
        chained = httpx.post(
            f"{b}/responses", json={"input": "again", "previous_response_id": made["id"]}
        ).json()
        assert chained["status"] == "completed"
        assert len(httpx.get(f"{b}/responses/{chained['id']}/input_items").json()["data"]) == 3

        # a background stream started on A, dropped after a few events, resumed on B
        seen: list[dict[str, Any]] = []
        with httpx.stream(
            "POST",
            f"{a}/responses",
            json={"input": "x", "background": True, "stream": True},
            timeout=30,
        ) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    seen.append(json.loads(line[6:]))
                if len(seen) == 6:
                    break
        response_id = seen[0]["response"]["id"]
        resumed = httpx.get(
            f"{b}/responses/{response_id}",
            timeout=60,
            params={"stream": "true", "starting_after": 5},
        )
        tail = validate_sse(resumed.text).events
        assert tail[0]["sequence_number"] == 6 and tail[-1]["type"] == "response.completed"
        whole = validate_sse(
            httpx.get(f"{b}/responses/{response_id}", timeout=30, params={"stream": "true"}).text
        )
        assert whole.ok, whole.text()
        assert whole.events[6:] == tail

        # cancelled from B while A runs it
        long = httpx.post(f"{a}/responses", json={"input": "x", "background": True}).json()
        _until(b, long["id"], ("in_progress",))
        cancelled = httpx.post(f"{b}/responses/{long['id']}/cancel", timeout=30).json()
        assert cancelled["status"] == "cancelled"
        assert _until(a, long["id"], ("cancelled",))["status"] == "cancelled"


def test_kill_9_mid_generation_leaves_no_response_stuck(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/oars.db"
    port = free_port()
    with replica(url, "solo", chunks=400, delay=0.02, port=port) as (base, proc):
        done = httpx.post(f"{base}/responses", json={"input": "keep me", "stream": True}).text
        final = validate_sse(done).final
        assert final is not None
        before = httpx.get(f"{base}/responses/{final['id']}").content
        run = httpx.post(f"{base}/responses", json={"input": "x", "background": True}).json()
        _until(base, run["id"], ("in_progress",))
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    with replica(url, "solo", port=port) as (base, _):
        failed = httpx.get(f"{base}/responses/{run['id']}").json()
        assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
        assert httpx.get(f"{base}/responses/{final['id']}").content == before
        replay = httpx.get(f"{base}/responses/{run['id']}", params={"stream": "true"}, timeout=30)
        assert validate_sse(replay.text).events[-1]["type"] == "response.failed"


def test_a_live_replica_fails_a_dead_ones_runs(postgres_server: str) -> None:
    url = new_database(postgres_server)
    with replica(url, "b") as (b, _), replica(url, "a", chunks=400, delay=0.02) as (a, proc):
        run = httpx.post(f"{a}/responses", json={"input": "x", "background": True}).json()
        _until(b, run["id"], ("in_progress",))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        failed = _until(b, run["id"], ("failed",), timeout=20)
        assert failed["error"]["code"] == "server_error"


def test_an_mcp_approval_asked_on_one_replica_runs_on_another(
    postgres_server: str, mcp_http: McpProcess
) -> None:
    url = new_database(postgres_server)
    open_it = '<tool_call>{"name": "vault__open_vault", "arguments": {"code": "1234"}}</tool_call>'
    slow = '<tool_call>{"name": "vault__slow", "arguments": {"seconds": 60}}</tool_call>'
    tool = {"type": "mcp", "server_label": "vault", "server_url": mcp_http.url}
    with (
        replica(url, "a", mcp_call=open_it) as (a, _),
        replica(url, "b", mcp_call=slow) as (b, _),
    ):
        asked = httpx.post(f"{a}/responses", json={"input": "open", "tools": [tool]}, timeout=30)
        request = asked.json()["output"][-1]
        assert request["type"] == "mcp_approval_request", asked.text
        answer = {"type": "mcp_approval_response", "approval_request_id": request["id"]}
        body = {
            "previous_response_id": asked.json()["id"],
            "input": [{**answer, "approve": True}],
            "tools": [tool],
            "stream": True,
        }
        ran = validate_sse(httpx.post(f"{b}/responses", json=body, timeout=30).text)
        assert ran.ok, ran.text()
        assert ran.final is not None
        call, _ = ran.final["output"]
        assert call["approval_request_id"] == request["id"] and "aubergine" in call["output"]

        # a background response waiting on a slow call, cancelled from the other replica
        never = {**tool, "require_approval": "never"}
        run = httpx.post(
            f"{b}/responses", json={"input": "x", "tools": [never], "background": True}
        ).json()
        follow = {"stream": "true"}
        with httpx.stream("GET", f"{a}/responses/{run['id']}", params=follow, timeout=30) as r:
            for line in r.iter_lines():  # the call is running on B once A's log shows it
                if line == "event: response.mcp_call_arguments.done":
                    break
        started = time.monotonic()
        cancelled = httpx.post(f"{a}/responses/{run['id']}/cancel", timeout=30).json()
        assert cancelled["status"] == "cancelled" and time.monotonic() - started < 10
        last = cancelled["output"][-1]
        assert last == {**last, "type": "mcp_call", "status": "incomplete", "output": None}

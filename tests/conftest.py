"""Shared helpers: run requests through the app, normalize ids for golden comparisons."""

from __future__ import annotations

import contextlib
import glob
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import openai

_ID = re.compile(r"^(resp|msg|rs|fc|call|ctc|mcp|mcpl|mcpr|ts|tso|sh|lsh|apc|cmp)_[0-9a-f]{16,}$")


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """What is still garbage when the session ends is collected here, before pytest's own last
    collection, and an object finalized unclosed (a client socket of some test, left in a
    reference cycle) is printed rather than failing a session whose tests all passed. Within a
    test, such a leak still fails that test."""
    import gc

    def report(unraisable: Any) -> None:
        print(
            f"left open at the session's end: {unraisable.object!r} ({unraisable.exc_value})",
            file=sys.stderr,
        )

    hook, sys.unraisablehook = sys.unraisablehook, report
    try:
        for _ in range(3):
            gc.collect()
    finally:
        sys.unraisablehook = hook


def normalize_ids(value: Any, names: dict[str, str] | None = None) -> Any:
    """Replace ids by stable placeholders in order of appearance; zero the timestamps."""
    names = {} if names is None else names
    if isinstance(value, dict):
        return {
            k: 0
            if k in ("created_at", "completed_at") and v is not None
            else normalize_ids(v, names)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [normalize_ids(v, names) for v in value]
    if isinstance(value, str) and _ID.match(value):
        prefix = value.split("_", 1)[0]
        if value not in names:
            count = sum(1 for n in names.values() if n.startswith(f"<{prefix}_"))
            names[value] = f"<{prefix}_{count}>"
        return names[value]
    return value


# ---- a real PostgreSQL server for the store tests -----------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        pytest.fail("PostgreSQL is not installed: `make test` installs Debian's postgresql")
    return found[-1]


def _as_postgres(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: there, run it as Debian's `postgres` user."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


class Postgres:
    """A throwaway PostgreSQL server on loopback, from Debian's packages (as `postgres` when
    root): started and stopped at will, for fault tests."""

    def __init__(self) -> None:
        self.data = tempfile.mkdtemp(prefix="oars-pg-")
        if os.geteuid() == 0:
            shutil.chown(self.data, "postgres", "postgres")
        self.port = free_port()
        self.url = f"postgresql://oars@127.0.0.1:{self.port}"
        subprocess.run(
            _as_postgres([_pg_bin("initdb"), "-D", self.data, "-A", "trust", "-U", "oars"]),
            check=True,
            capture_output=True,
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(
            _as_postgres(
                [
                    _pg_bin("pg_ctl"),
                    "-D",
                    self.data,
                    "-o",
                    options,
                    "-l",
                    f"{self.data}/log",
                    "-w",
                    "start",
                ]
            ),
            check=True,
            capture_output=True,
        )

    def stop(self) -> None:
        """At once, as a crash would (no clean shutdown)."""
        subprocess.run(
            _as_postgres([_pg_bin("pg_ctl"), "-D", self.data, "-m", "immediate", "stop"]),
            check=False,
            capture_output=True,
        )

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.data, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A throwaway PostgreSQL on loopback, for the session: its base URL (no database)."""
    server = Postgres()
    server.start()
    try:
        yield server.url
    finally:
        server.remove()


def new_database(server: str) -> str:
    """A fresh, empty database on the server: its URL."""
    import asyncio

    import asyncpg

    name = f"t_{secrets.token_hex(6)}"

    async def create() -> None:
        conn = await asyncpg.connect(f"{server}/postgres")
        try:
            await conn.execute(f"CREATE DATABASE {name}")
        finally:
            await conn.close()

    asyncio.run(create())
    return f"{server}/{name}"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: object) -> str:
    """Each store test runs on a real SQLite file and on a real PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/oars.db"
    server: str = request.getfixturevalue("postgres_server")
    return new_database(server)


@contextlib.contextmanager
def serving(app: Any) -> Iterator[str]:
    """An app served by a real uvicorn on loopback, in a thread of this process: its base URL."""
    import uvicorn

    config = uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{config.port}"
    finally:
        server.should_exit = True
        thread.join(10)


@contextlib.contextmanager
def files_server(
    url: str | None, folder: Any, engine: Any = None, embedder: Any = None, **settings: Any
) -> Iterator[str]:
    """The app on the scripted engine (`engine`, or one of its own), with its store at `url`
    (None: no store) and uploaded files in `folder`, served, running `file_search` over its
    vector stores with vectors of `embedder` (None: keywords only): its base URL."""
    from oars.http import create_app
    from oars.mcp.config import McpConfig
    from oars.ranking import searchers
    from oars.service import ResponsesService
    from oars.settings import ServerSettings
    from oars.store import SqlStore
    from oars.testing import ScriptedEngine
    from oars.toolbox import ToolboxFactory

    store = SqlStore(url) if url else None
    files = searchers(store, embedder) if store is not None else None
    app = create_app(
        ResponsesService(
            engine or ScriptedEngine(), toolboxes=ToolboxFactory(McpConfig(), files=files)
        ),
        store,
        settings=ServerSettings(**settings),
        files=folder,
        embedder=embedder,
    )
    with serving(app) as base:
        yield base


def sdk(base: str, key: str = "k") -> openai.OpenAI:
    """The openai SDK's client of a server, without retries."""
    import openai

    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)


# ---- a real MCP server (tests/mcp_server.py) ------------------------------------------------------


class McpProcess:
    """The tests' MCP server in a process of its own on loopback."""

    def __init__(self, transport: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.base}/sse" if transport == "sse" else f"{self.base}/mcp"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.mcp_server", transport, str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while not self._answers():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                pytest.fail(f"the MCP server ({transport}) did not start")
            time.sleep(0.05)

    def _answers(self) -> bool:
        import httpx

        try:
            return httpx.get(f"{self.base}/stats", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    @staticmethod
    def unused_url() -> str:
        """The URL of a server that is not there (a port nothing listens on)."""
        return f"http://127.0.0.1:{free_port()}/mcp"

    def stats(self) -> dict[str, Any]:
        import httpx

        stats: dict[str, Any] = httpx.get(f"{self.base}/stats", timeout=5).json()
        return stats

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="session")
def mcp_http() -> Iterator[McpProcess]:
    """The tests' MCP server over streamable HTTP, for the session."""
    server = McpProcess("streamable-http")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def mcp_sse() -> Iterator[McpProcess]:
    """The tests' MCP server over SSE, for the session."""
    server = McpProcess("sse")
    yield server
    server.stop()

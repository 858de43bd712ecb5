"""A model served by several upstream replicas: chains stay on the replica that has their
prompt cached, new sessions of one agent share one, health checks eject and readmit, and a
refusal before the first byte goes elsewhere (never after it). Real `oars serve` processes in
front of replay upstreams that record what each served."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai.types.responses import Response
from starlette.testclient import TestClient

from oars.engines.upstream.config import UpstreamConfig, replica_name
from oars.engines.upstream.replicas import BALANCED, CHAIN, PREFIX, ReplicaSet
from oars.generation import ChatMessage, EngineRequest, Route
from oars.http import create_app
from oars.service import ResponsesService
from tests.conftest import free_port, new_database
from tests.fast.test_operator import scrape, value
from tests.fast.test_replicas import running
from tests.upstream_replay import Replay, Scenario, text_stream

ROOT = Path(__file__).parent.parent.parent


@pytest.fixture
def three() -> Iterator[list[Replay]]:
    with ExitStack() as stack:
        yield [stack.enter_context(Replay()) for _ in range(3)]


def _toml(path: Path, urls: list[str], **extra: Any) -> Path:
    lines = ["[[upstream]]", 'model = "m"', f"urls = {json.dumps(urls)}"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@contextmanager
def gateway(config: Path, store: str, name: str = "g1") -> Iterator[str]:
    """`oars serve` in front of the upstreams in `config`: its base URL."""
    port = free_port()
    cmd = [sys.executable, "-c", "from oars.cli import main; main()", "serve"]
    cmd += ["--upstreams", str(config), "--port", str(port), "--store", store, "--replica", name]
    with running(cmd, port) as (base, _):
        yield base


def _create(base: str, **body: Any) -> dict[str, Any]:
    r = httpx.post(f"{base}/responses", json={"model": "m", **body}, timeout=30)
    assert r.status_code == 200, r.text
    Response.model_validate(r.json())  # the SDK's own type of a final object
    return dict(r.json())


def _served(upstreams: list[Replay]) -> list[int]:
    return [len([b for b in u.bodies if b.get("stream")]) for u in upstreams]


def _metrics(base: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return scrape(httpx.get(f"{base.removesuffix('/v1')}/metrics", timeout=10).text)


def _routed(base: str, route: str) -> float:
    samples = _metrics(base)
    return sum(
        v
        for (name, labels), v in samples.items()
        if name == "oars_upstream_requests_total" and ("route", route) in labels
    )


def _chain(base: str, turns: int, first: dict[str, Any] | None = None) -> None:
    """A chain whose every turn names another `prompt_cache_key`: only the chain's record
    keeps it on one replica (the keys alone would scatter it)."""
    previous = _create(base, input="turn 0", prompt_cache_key="key-0", **(first or {}))
    for i in range(1, turns):
        previous = _create(
            base,
            input=f"turn {i}",
            prompt_cache_key=f"key-{i}",
            previous_response_id=previous["id"],
        )


def test_a_chain_stays_on_the_replica_that_served_it(three: list[Replay], tmp_path: Path) -> None:
    config = _toml(tmp_path / "up.toml", [u.url for u in three])
    with gateway(config, f"sqlite:///{tmp_path / 'oars.db'}") as base:
        for chain in range(3):
            before = _served(three)
            _chain(base, 5, {"instructions": f"agent {chain}"})
            grew = [after - b for after, b in zip(_served(three), before, strict=True)]
            assert sorted(grew) == [0, 0, 5], grew
        assert _routed(base, CHAIN) == 3 * 4


def test_a_conversation_stays_on_its_replica(three: list[Replay], tmp_path: Path) -> None:
    config = _toml(tmp_path / "up.toml", [u.url for u in three])
    with gateway(config, f"sqlite:///{tmp_path / 'oars.db'}") as base:
        conversation = httpx.post(f"{base}/conversations", json={}, timeout=10).json()["id"]
        for i in range(4):
            _create(base, input=f"turn {i}", prompt_cache_key=f"k{i}", conversation=conversation)
        assert sorted(_served(three)) == [0, 0, 4]


def test_replicas_of_oars_on_postgresql_route_a_chain_alike(
    three: list[Replay], tmp_path: Path, postgres_server: str
) -> None:
    config = _toml(tmp_path / "up.toml", [u.url for u in three])
    store = new_database(postgres_server)
    with gateway(config, store, "a") as a, gateway(config, store, "b") as b:
        previous = _create(a, input="turn 0", prompt_cache_key="key-0")
        for i in range(1, 6):
            base = (a, b)[i % 2]
            previous = _create(
                base,
                input=f"turn {i}",
                prompt_cache_key=f"key-{i}",
                previous_response_id=previous["id"],
            )
        assert sorted(_served(three)) == [0, 0, 6]


def test_a_websocket_chain_without_a_store_stays_on_its_replica(three: list[Replay]) -> None:
    engine = ReplicaSet(UpstreamConfig("m", urls=tuple(u.url for u in three)))
    app = create_app(ResponsesService({"m": engine}, strict_models=True))
    with TestClient(app) as client, client.websocket_connect("/v1/responses") as ws:
        previous = None
        for i in range(5):
            body = {"model": "m", "input": f"turn {i}", "store": False, "prompt_cache_key": f"k{i}"}
            if previous:
                body["previous_response_id"] = previous
            ws.send_text(json.dumps({"type": "response.create", **body}))
            while (event := json.loads(ws.receive_text()))["type"] != "response.completed":
                assert event["type"] != "error", event
            previous = event["response"]["id"]
    assert sorted(_served(three)) == [0, 0, 5]


def test_new_sessions_of_one_agent_share_a_replica(three: list[Replay], tmp_path: Path) -> None:
    config = _toml(tmp_path / "up.toml", [u.url for u in three])
    tools = [{"type": "function", "name": "ls", "parameters": {"type": "object"}}]
    with gateway(config, f"sqlite:///{tmp_path / 'oars.db'}") as base:
        for task in range(6):  # one agent: its instructions, tools and opening message
            opening = {"role": "user", "content": "<environment>cwd=/src</environment>"}
            task_message = {"role": "user", "content": f"task {task}"}
            _create(
                base,
                instructions="You are a coding agent.",
                tools=tools,
                input=[opening, task_message],
            )
        assert sorted(_served(three)) == [0, 0, 6]
        for agent in range(12):  # twelve agents spread over the replicas
            _create(base, instructions=f"You are agent {agent}.", input="hello")
        assert sum(1 for n in _served(three) if n > 0) >= 2
        assert _routed(base, PREFIX) == 18


def test_health_checks_eject_and_readmit(three: list[Replay], tmp_path: Path) -> None:
    config = _toml(tmp_path / "up.toml", [u.url for u in three], health_interval=0.2)
    sick = three[0]
    name = replica_name(sick.url)
    with gateway(config, "none") as base:

        def in_service() -> float:
            return value(_metrics(base), "oars_upstream_in_service", model="m", replica=name)

        sick.healthy = False
        _until(lambda: in_service() == 0)
        before = len(sick.bodies)
        for i in range(9):
            _create(base, input="hi", prompt_cache_key=f"k{i}", store=False)
        assert len(sick.bodies) == before  # no request reached it while out of service
        sick.healthy = True
        _until(lambda: in_service() == 1)
        samples = _metrics(base)
        changes = {
            change: value(
                samples,
                "oars_upstream_health_changes_total",
                model="m",
                replica=name,
                change=change,
            )
            for change in ("ejected", "readmitted")
        }
        assert changes == {"ejected": 1, "readmitted": 1}


def test_a_health_check_that_times_out_ejects_only_an_idle_replica(
    three: list[Replay],
) -> None:
    """A server that answers its checks only between generations (llama-cpp-python's) stays
    in service, and keeps its chains, while it streams; silent and idle, it leaves."""
    slow, other = three[0], three[1]
    engine = ReplicaSet(UpstreamConfig("m", urls=(slow.url, other.url), health_interval=0.2))
    slow.health_delay = 2.0  # the check gives up after 1 s
    slow.play(Scenario(text_stream(["a", "b", "c", "d"]).chunks, chunk_delay=0.5))
    key = _key_for(engine, replica_name(slow.url))

    async def go() -> list[bool]:
        request = EngineRequest((ChatMessage("user", "x"),), route=Route(cache_key=key))
        opened = await engine.open(request)
        assert opened.served_by == replica_name(slow.url)
        chunks = engine.generate(opened)
        await anext(chunks)
        await engine.check()  # mid-stream: busy, not gone
        busy = engine.replicas[0].healthy
        async for _ in chunks:
            pass
        await engine.check()  # idle and silent: out
        idle = engine.replicas[0].healthy
        await engine.aclose()
        return [busy, idle, engine.replicas[1].healthy]

    assert asyncio.run(go()) == [True, False, True]


def _until(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.05)


def _key_for(replicas: ReplicaSet, name: str) -> str:
    """A `prompt_cache_key` whose requests prefer the replica `name`."""
    for i in range(1000):
        key = f"key-{i}"
        request = EngineRequest((ChatMessage("user", "x"),), route=Route(cache_key=key))
        if replicas.order(request)[0][0].name == name:
            return key
    raise AssertionError("no key prefers it")


def _app(urls: list[str]) -> tuple[ReplicaSet, Any]:
    engine = ReplicaSet(UpstreamConfig("m", urls=tuple(urls)))
    return engine, create_app(ResponsesService({"m": engine}, strict_models=True))


def _post(app: Any, **body: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=30) as c:
            r = await c.post("/v1/responses", json={"model": "m", "input": "x", **body})
        await app.state.oars.service.aclose()  # its connections belong to this loop
        return r

    return asyncio.run(go())


def test_a_refused_connection_is_retried_on_another_replica(three: list[Replay]) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    engine, app = _app([dead, three[0].url])
    key = _key_for(engine, replica_name(dead))
    r = _post(app, prompt_cache_key=key)
    assert r.status_code == 200 and r.json()["output"][0]["content"][0]["text"] == "Hello there"
    assert _served(three)[:1] == [1]
    assert [x.healthy for x in engine.replicas] == [False, True]  # the refusal ejected it
    assert [x.in_flight for x in engine.replicas] == [0, 0]


def test_a_5xx_before_the_first_byte_is_retried_and_none_after_it(three: list[Replay]) -> None:
    first, second = three[0], three[1]
    engine, app = _app([first.url, second.url])
    key = _key_for(engine, replica_name(first.url))
    first.play(Scenario(status=503, error={"error": {"message": "overloaded"}}))
    r = _post(app, prompt_cache_key=key)
    assert r.status_code == 200, r.text
    assert (len(first.bodies), len(second.bodies)) == (1, 1)
    assert [x.healthy for x in engine.replicas] == [True, True]  # a 5xx ejects nobody
    cut = text_stream(["Hel", "lo", " there"])
    first.play(Scenario(cut.chunks, cut_after=2))
    r = _post(app, prompt_cache_key=key, stream=False)
    assert r.status_code >= 500  # broken after the first byte: failed, not retried
    assert (len(first.bodies), len(second.bodies)) == (2, 1)
    assert [x.in_flight for x in engine.replicas] == [0, 0]


def test_a_busy_preferred_replica_yields_to_the_least_busy() -> None:
    engine = ReplicaSet(UpstreamConfig("m", urls=("http://a:1/v1", "http://b:1/v1"), imbalance=2))
    request = EngineRequest((ChatMessage("user", "x"),), route=Route(follow="http://a:1/v1"))
    assert engine.order(request)[1] == CHAIN
    engine.replicas[0].in_flight = 2  # two beyond the other: within the bound
    chosen, why = engine.order(request)
    assert (chosen[0].name, why) == ("http://a:1/v1", CHAIN)
    engine.replicas[0].in_flight = 3  # three beyond it: past the bound
    chosen, why = engine.order(request)
    assert (chosen[0].name, why) == ("http://b:1/v1", BALANCED)
    engine.replicas[0].in_flight = 0
    engine.replicas[0].healthy = False
    assert [r.name for r in engine.order(request)[0]] == ["http://b:1/v1"]

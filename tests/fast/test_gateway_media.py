"""Images, files and audio through the gateway: the chat-completions parts vLLM and OpenAI take,
kept in replayed history; a 400 naming the part for a model that does not take it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from oars.engines.upstream import UpstreamConfig
from oars.engines.upstream.replicas import ReplicaSet
from oars.http import create_app
from oars.service import ResponsesService
from oars.store import SqlStore
from oars.testing import ScriptedEngine
from tests.upstream_replay import Replay

PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
PDF = "data:application/pdf;base64,JVBERi0xLjQKJcfsj6IKMSAwIG9iago8PD4+CmVuZG9iagp0cmFpbGVyCjw8Pj4KJSVFT0YK"
WAV = "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YQAAAAA="

MIXED = [
    {"type": "input_text", "text": "What is in these?"},
    {"type": "input_image", "image_url": "https://example.com/cat.jpg", "detail": "high"},
    {"type": "input_image", "image_url": PNG},
    {"type": "input_file", "filename": "a.pdf", "file_data": PDF},
    {"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}},
]
CHAT_PARTS = [
    {"type": "text", "text": "What is in these?"},
    {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg", "detail": "high"}},
    {"type": "image_url", "image_url": {"url": PNG}},
    {"type": "file", "file": {"file_data": PDF, "filename": "a.pdf"}},
    {"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}},
]


@pytest.fixture
def upstream() -> Iterator[Replay]:
    with Replay() as replay:
        yield replay


def _posts(app: Any, *bodies: dict[str, Any]) -> list[httpx.Response]:
    """POST each body in turn; `previous_response_id: "<last>"` names the one before."""

    async def go() -> list[httpx.Response]:
        out: list[httpx.Response] = []
        transport = httpx.ASGITransport(app=app)
        client = httpx.AsyncClient(transport=transport, base_url="http://t", timeout=30)
        async with app.router.lifespan_context(app), client as c:
            for body in bodies:
                if body.get("previous_response_id") == "<last>":
                    body = {**body, "previous_response_id": out[-1].json()["id"]}
                out.append(await c.post("/v1/responses", json={"model": "m", **body}))
        return out

    return asyncio.run(go())


def _gateway(url: str, tmp: Any = None, **options: Any) -> Any:
    engine = ReplicaSet(UpstreamConfig("m", url, **options))
    store = SqlStore(f"sqlite:///{tmp / 'oars.db'}") if tmp is not None else None
    return create_app(ResponsesService({"m": engine}, strict_models=True), store)


def test_parts_reach_the_upstream_in_the_chat_shapes_and_stay_in_history(
    upstream: Replay, tmp_path: Any
) -> None:
    app = _gateway(upstream.url, tmp_path)
    first, second = _posts(
        app,
        {"input": [{"role": "user", "content": MIXED}]},
        {"input": "And now?", "previous_response_id": "<last>"},
    )
    assert first.status_code == 200, first.text
    assert second.status_code == 200, second.text
    for body in upstream.bodies:
        assert body["messages"][0] == {"role": "user", "content": CHAT_PARTS}
    assert upstream.bodies[1]["messages"][-1] == {"role": "user", "content": "And now?"}


@pytest.mark.parametrize(
    ("modalities", "index", "kind"),
    [
        (["text"], 1, "input_image"),
        (["text", "image"], 3, "input_file"),
        (["text", "image", "file"], 4, "input_audio"),
    ],
)
def test_a_part_the_model_does_not_take_is_a_400_naming_it(
    upstream: Replay, modalities: list[str], index: int, kind: str
) -> None:
    (r,) = _posts(
        _gateway(upstream.url, modalities=tuple(modalities)),
        {"input": [{"role": "user", "content": MIXED}]},
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == f"input[0].content[{index}]"
    assert error["code"] == "unsupported_content"
    assert kind in error["message"]
    assert upstream.bodies == []  # refused before any byte went upstream


@pytest.mark.parametrize(
    ("part", "param"),
    [
        ({"type": "input_image", "file_id": "file-abc"}, "input[0].content[0].file_id"),
        ({"type": "input_file", "file_id": "file-abc"}, "input[0].content[0].file_id"),
        ({"type": "input_file", "file_url": "https://x/a.pdf"}, "input[0].content[0].file_url"),
        ({"type": "input_image"}, "input[0].content[0].image_url"),
        ({"type": "input_image", "image_url": PNG, "detail": "max"}, "input[0].content[0].detail"),
        ({"type": "input_audio", "input_audio": {"data": WAV}}, "input[0].content[0].input_audio"),
    ],
)
def test_parts_it_cannot_forward_are_400s(
    upstream: Replay, part: dict[str, Any], param: str
) -> None:
    (r,) = _posts(_gateway(upstream.url), {"input": [{"role": "user", "content": [part]}]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert upstream.bodies == []


def test_the_embedded_engine_refuses_media_for_a_text_model() -> None:
    app = create_app(ResponsesService(ScriptedEngine(["x"])))
    (r,) = _posts(app, {"input": [{"role": "user", "content": MIXED[:2]}]})
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["param"], error["code"]) == ("input[0].content[1]", "unsupported_content")
    assert "takes text only" in error["message"]


def test_modalities_are_configured_per_upstream(tmp_path: Any) -> None:
    from oars.engines.upstream import load_upstreams

    path = tmp_path / "up.toml"
    path.write_text(
        '[[upstream]]\nmodel = "v"\nurls = ["http://a/v1"]\nmodalities = ["text", "image"]\n'
    )
    assert load_upstreams(str(path))[0].modalities == ("text", "image")
    path.write_text(
        '[[upstream]]\nmodel = "v"\nurl = "http://a/v1"\nmodalities = ["image", "smell"]\n'
    )
    with pytest.raises(ValueError, match="modalities"):
        load_upstreams(str(path))


def test_a_prewarm_through_the_gateway_leaves_no_upstream_stream_open(upstream: Replay) -> None:
    """Codex's WebSocket prewarm (`generate: false`): the upstream counts the input once, and
    no stream is opened, left unread or unclosed."""
    import json

    from starlette.testclient import TestClient

    engine = ReplicaSet(UpstreamConfig("m", upstream.url))
    app = create_app(ResponsesService({"m": engine}, strict_models=True))
    with TestClient(app) as client, client.websocket_connect("/v1/responses") as ws:
        for _ in range(3):
            ws.send_text(
                json.dumps(
                    {"type": "response.create", "model": "m", "input": "hi", "generate": False}
                )
            )
            while (event := json.loads(ws.receive_text()))["type"] != "response.completed":
                assert event["type"] != "error", event
            assert event["response"]["usage"]["input_tokens"] == 7
        assert [b["stream"] for b in upstream.bodies] == [False, False, False]
        assert not engine.busy and [r.in_flight for r in engine.replicas] == [0]
        assert not upstream.closed.is_set()

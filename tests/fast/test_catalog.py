"""`/v1/models` as a catalog, read by the openai SDK over a real socket: OpenAI's `Model`
fields valid for `models.list()` and `retrieve()`, each model's capabilities from what oars
knows of it (null where it knows nothing), Codex's catalog of the same models, and a 404 in
OpenAI's error shape for a model not served."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from oars import api
from oars.engines.base import Engine, ModelInfo
from oars.engines.upstream import ReplicaSet, UpstreamConfig, UpstreamEngine
from oars.engines.upstream.config import listed_context
from oars.families import THINK_TAGS, Harmony, Hermes
from oars.http import create_app
from oars.mcp.config import McpConfig
from oars.ranking import searchers
from oars.service import ResponsesService
from oars.store import SqlStore
from oars.testing import ScriptedEngine
from oars.toolbox import ToolboxFactory
from oars.web_search import web_search
from tests.conftest import serving
from tests.upstream_replay import Replay

THINKS = ModelInfo(
    "thinker",
    8192,
    reasoning=Hermes(THINK_TAGS).reasons,
    reasoning_efforts=Hermes(THINK_TAGS).efforts,
)
UNREACHED = "http://127.0.0.1:9/v1"  # the listing asks the upstream nothing


@contextlib.contextmanager
def _serving(engines: dict[str, Engine], **kw: Any) -> Iterator[tuple[openai.OpenAI, str]]:
    app = create_app(ResponsesService(engines, **kw))
    with serving(app) as url, openai.OpenAI(base_url=f"{url}/v1", api_key="k") as client:
        yield client, url


def _engines() -> dict[str, Engine]:
    configured = UpstreamConfig(
        "big", UNREACHED, context_window=131072, parse_think=True, modalities=("text", "image")
    )
    return {
        "thinker": ScriptedEngine(info=THINKS),
        "plain": ScriptedEngine(info=ModelInfo("plain", 4096, reasoning=False)),
        "org/big": UpstreamEngine(configured),
        "bare": UpstreamEngine(UpstreamConfig("bare", UNREACHED)),
    }


def test_the_sdk_lists_and_retrieves_models_with_their_capabilities() -> None:
    with _serving(_engines()) as (client, url):
        listed = client.models.list().data
        one = client.models.retrieve("org/big")  # a name with a slash, as upstreams' are
        raw = httpx.get(f"{url}/v1/models").json()
    assert [m.id for m in listed] == ["thinker", "plain", "org/big", "bare"]
    assert all(m.object == "model" and m.created > 0 for m in listed)
    assert one.id == "org/big" and one.owned_by == "upstream"
    api.ModelList.model_validate(raw)
    thinker, plain, big, bare = raw["data"]
    assert (thinker["context_window"], thinker["reasoning"]) == (8192, True)
    assert thinker["reasoning_efforts"] == ["none", "low", "medium", "high"]
    assert (plain["reasoning"], plain["reasoning_efforts"]) == (False, [])
    assert big["context_window"] == 131072 and big["input_modalities"] == ["text", "image"]
    assert big["reasoning"] is True
    # an upstream configured with nothing: oars knows nothing, and says so
    assert bare["context_window"] is None and bare["reasoning"] is None
    for entry in raw["data"]:
        assert entry["supports_search_tool"] is True and entry["server_tools"] == ["tool_search"]
        assert {"function", "custom", "tool_search", "apply_patch"} <= set(entry["client_tools"])
        assert entry["apply_patch_tool_type"] == "freeform"


def test_codex_reads_the_same_models_as_its_catalog() -> None:
    with _serving(_engines()) as (_, url):
        models = httpx.get(f"{url}/v1/models").json()["models"]
    thinker, plain, big, bare = models
    assert [m["slug"] for m in models] == ["thinker", "plain", "org/big", "bare"]
    assert thinker["context_window"] == 8192 and "context_window" not in bare
    assert [e["effort"] for e in thinker["supported_reasoning_levels"]][-1] == "high"
    assert plain["supported_reasoning_levels"] == [] and plain["input_modalities"] == ["text"]
    # Codex tags text and images only: a file or audio upstream is text and image to it
    assert big["input_modalities"] == ["text", "image"] and bare["input_modalities"] == [
        "text",
        "image",
    ]
    for model in models:
        assert model["apply_patch_tool_type"] == "freeform" and model["supports_search_tool"]
        assert "base_instructions" not in model  # the operator's to write


def test_harmony_reasons_at_its_three_levels() -> None:
    family = Harmony()
    assert family.reasons and family.efforts == ("low", "medium", "high")
    assert not Hermes().reasons and Hermes().efforts == ()


def test_mcp_is_a_tool_the_server_runs_when_it_runs_any() -> None:
    toolboxes = ToolboxFactory(McpConfig.of(allow=["http://127.0.0.1"]))
    with _serving({"thinker": ScriptedEngine(info=THINKS)}, toolboxes=toolboxes) as (_, url):
        entry = httpx.get(f"{url}/v1/models/thinker").json()
    assert entry["server_tools"] == ["tool_search", "mcp"] and entry["id"] == "thinker"


def test_web_search_is_a_tool_the_server_runs_when_it_has_a_backend() -> None:
    web = web_search("searxng=http://127.0.0.1:9")  # never asked here
    toolboxes = ToolboxFactory(McpConfig(), web=web)
    with _serving({"thinker": ScriptedEngine(info=THINKS)}, toolboxes=toolboxes) as (_, url):
        entry = httpx.get(f"{url}/v1/models/thinker").json()
    assert entry["server_tools"] == ["tool_search", "mcp", "web_search"]
    api.CatalogModel.model_validate(entry)  # as the document says (it listed no web_search)


def test_file_search_is_a_tool_the_server_runs_when_it_keeps_vector_stores(tmp_path: Any) -> None:
    store = SqlStore(f"sqlite:///{tmp_path}/oars.db")
    toolboxes = ToolboxFactory(McpConfig(), files=searchers(store))
    with _serving({"thinker": ScriptedEngine(info=THINKS)}, toolboxes=toolboxes) as (_, url):
        entry = httpx.get(f"{url}/v1/models/thinker").json()
    assert entry["server_tools"] == ["tool_search", "mcp", "file_search"]
    api.CatalogModel.model_validate(entry)


def test_an_unknown_model_is_a_404_in_openais_shape() -> None:
    with _serving(_engines()) as (client, _), pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("nope")
    error = caught.value.body
    assert isinstance(error, dict)
    assert (error["code"], error["param"], error["type"]) == (
        "model_not_found",
        "model",
        "invalid_request_error",
    )


def test_a_configured_context_window_is_a_number_of_tokens() -> None:
    with pytest.raises(ValueError, match="context_window"):
        UpstreamConfig("m", UNREACHED, context_window=0)


def test_an_upstreams_listing_gives_the_context_when_the_table_does_not() -> None:
    """vLLM lists `max_model_len`; the gateway reads it once, in the background, for the model
    by its upstream name. A listing without it, or a table that says it, is not overruled."""
    with Replay() as vllm, Replay() as bare:
        vllm.listing = [
            {"id": "other", "max_model_len": 1},
            {"id": "Qwen/Q", "max_model_len": 32768},
        ]
        engines: dict[str, Engine] = {
            "listed": ReplicaSet(UpstreamConfig("listed", vllm.url, upstream_model="Qwen/Q")),
            "unlisted": ReplicaSet(UpstreamConfig("unlisted", bare.url)),
            "told": ReplicaSet(
                UpstreamConfig("told", vllm.url, upstream_model="Qwen/Q", context_window=8)
            ),
        }
        with _serving(engines) as (_, url):
            deadline = time.monotonic() + 10
            while (windows := _windows(url))["listed"] is None and time.monotonic() < deadline:
                time.sleep(0.05)
    assert windows == {"listed": 32768, "unlisted": None, "told": 8}


def _windows(url: str) -> dict[str, int | None]:
    return {m["id"]: m["context_window"] for m in httpx.get(f"{url}/v1/models").json()["data"]}


def test_a_listing_is_read_for_the_model_named_and_a_positive_number() -> None:
    listing = {"data": [{"id": "a", "max_model_len": True}, {"id": "b", "context_length": 4096}]}
    assert listed_context(listing, "b") == 4096
    assert listed_context(listing, "a") is None and listed_context(listing, "c") is None
    assert listed_context({"data": "x"}, "a") is None and listed_context([], "a") is None

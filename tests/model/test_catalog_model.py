"""`/v1/models` on the real default model: the openai SDK lists and retrieves it, and its entry
says what the engine knows of it (the context it was started with, text only, a family that does
not think)."""

from __future__ import annotations

import httpx
import openai
import pytest

from oars import api

pytestmark = pytest.mark.model

MODEL = "qwen2.5-coder-0.5b-instruct"


def test_the_default_model_is_listed_with_what_the_engine_knows(server: str) -> None:
    with openai.OpenAI(base_url=server, api_key="unused", max_retries=0) as client:
        listed = client.models.list().data
        one = client.models.retrieve(MODEL)
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("no-such-model")
    assert [m.id for m in listed] == [MODEL] and one.id == MODEL and one.object == "model"
    body = httpx.get(f"{server}/models").json()
    api.ModelList.model_validate(body)
    entry, codex = body["data"][0], body["models"][0]
    assert entry["context_window"] == 4096  # the server's --ctx
    assert entry["input_modalities"] == ["text"] and entry["reasoning"] is False
    assert entry["reasoning_efforts"] == []
    # its own tool search, the MCP servers a request names (`oars serve` runs them), and file
    # search over the vector stores of its store
    assert entry["server_tools"] == ["tool_search", "mcp", "file_search"]
    assert entry["supports_search_tool"]
    assert codex["slug"] == MODEL and codex["context_window"] == 4096
    assert codex["input_modalities"] == ["text"] and codex["supported_reasoning_levels"] == []

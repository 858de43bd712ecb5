"""`web_search` on the real embedded model, run through a SearXNG-compatible backend on
loopback (`oars.testing.search_backend`): the model searches, reads what only the backend knows, and
answers with it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any

import pytest

from oars.testing import DOCS, base_url, search_backend
from tests.model.conftest import _serve, stream

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def backend() -> Iterator[ThreadingHTTPServer]:
    with search_backend() as server:
        yield server


@pytest.fixture(scope="module")
def searching_server(
    tmp_path_factory: pytest.TempPathFactory, backend: ThreadingHTTPServer
) -> Iterator[str]:
    yield from _serve(
        tmp_path_factory,
        *("--ctx", "4096", "--temperature", "0"),
        *("--web-search", f"searxng={base_url(backend)}"),
    )


def test_a_forced_search_answers_with_what_only_the_backend_knows(
    searching_server: str, backend: ThreadingHTTPServer
) -> None:
    report = stream(
        searching_server,
        {
            "input": "What is the code word of the lighthouse autumn release?",
            "tools": [{"type": "web_search"}],
            "tool_choice": {"type": "web_search"},
            "include": ["web_search_call.action.sources"],
            "max_output_tokens": 80,
        },
    )
    final = report.final
    assert final["status"] == "completed", final
    call, *rest = final["output"]
    assert call["type"] == "web_search_call" and call["status"] == "completed", call
    assert call["action"]["type"] == "search" and call["action"]["query"]
    assert call["action"]["query"] in backend.queries  # type: ignore[attr-defined]
    assert {"type": "url", "url": DOCS} in call["action"]["sources"]
    answer = rest[-1]
    assert answer["type"] == "message", final["output"]
    assert "heron-42" in answer["content"][0]["text"].lower(), answer


def test_the_agents_sdks_web_search_tool(searching_server: str) -> None:
    """The Agents SDK's hosted `WebSearchTool`, forced: one response holds the search and the
    answer, which is the run's final output."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIResponsesModel,
        Runner,
        WebSearchTool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    async def run() -> Any:
        client = AsyncOpenAI(base_url=searching_server, api_key="unused", max_retries=0)
        model = OpenAIResponsesModel(model="qwen2.5-coder-0.5b-instruct", openai_client=client)
        agent = Agent(
            name="Researcher",
            instructions="Answer from what the web search finds.",
            tools=[WebSearchTool(search_context_size="low")],
            model=model,
            model_settings=ModelSettings(tool_choice="web_search", max_tokens=80),
        )
        try:
            return await Runner.run(
                agent, "What is the code word of the lighthouse autumn release?", max_turns=2
            )
        finally:
            await client.close()

    result = asyncio.run(run())
    kinds = [item.type for item in result.new_items]
    assert "tool_call_item" in kinds, kinds  # the web_search_call, as the SDK names it
    assert "heron-42" in str(result.final_output).lower(), result.final_output

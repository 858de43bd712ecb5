"""`file_search` on the real embedded model over a vector store the openai SDK built: the model
searches, reads what only one file knows, and answers with it; the Agents SDK's
`FileSearchTool` runs end to end."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.model.conftest import MODEL, _serve, stream

pytestmark = pytest.mark.model

FACT = "The Aldermoor lighthouse keeper's cat is named Pemberton and sleeps by the lamp."
OTHER = "The Aldermoor harbour market opens on Tuesdays and sells smoked fish and rope."
QUESTION = "What is the name of the Aldermoor lighthouse keeper's cat?"


@pytest.fixture(scope="module")
def searching_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _serve(tmp_path_factory, *("--ctx", "4096", "--temperature", "0"))


@pytest.fixture(scope="module")
def store(searching_server: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A vector store of two notes, indexed; the id of the one that knows the fact."""
    folder = tmp_path_factory.mktemp("notes")
    (folder / "keeper.txt").write_text(FACT)
    (folder / "market.txt").write_text(OTHER)
    client = openai.OpenAI(base_url=searching_server, api_key="unused", max_retries=0)
    with client:
        ids = [
            client.files.create(file=folder / name, purpose="assistants").id
            for name in ("keeper.txt", "market.txt")
        ]
        vs = client.vector_stores.create(name="aldermoor", file_ids=ids)
        for file_id in ids:
            done = client.vector_stores.files.poll(file_id, vector_store_id=vs.id)
            assert done.status == "completed", done
    return vs.id, ids[0]


def test_a_forced_file_search_answers_with_what_only_one_file_knows(
    searching_server: str, store: tuple[str, str]
) -> None:
    vs_id, keeper = store
    tool = {"type": "file_search", "vector_store_ids": [vs_id], "max_num_results": 2}
    report = stream(
        searching_server,
        {
            "input": QUESTION,
            "tools": [tool],
            "tool_choice": {"type": "file_search"},
            "include": ["file_search_call.results"],
            "max_output_tokens": 200,
        },
    )
    final = report.final
    assert final["status"] == "completed", (final["output"], final.get("incomplete_details"))
    call, *rest = final["output"]
    assert call["type"] == "file_search_call" and call["status"] == "completed", call
    assert call["queries"] and call["results"], call
    assert call["results"][0]["file_id"] == keeper, call["results"]
    answer = rest[-1]
    assert answer["type"] == "message", final["output"]
    text = answer["content"][0]
    assert "pemberton" in text["text"].lower(), answer
    for citation in text["annotations"]:  # the small model may cite; what it cites is right
        assert citation["type"] == "file_citation" and citation["file_id"] in (keeper,), citation
        assert 0 <= citation["index"] <= len(text["text"])


def test_the_agents_sdks_file_search_tool(searching_server: str, store: tuple[str, str]) -> None:
    """The Agents SDK's hosted `FileSearchTool`, forced: one response holds the search and the
    answer, which is the run's final output."""
    from agents import (
        Agent,
        FileSearchTool,
        ModelSettings,
        OpenAIResponsesModel,
        Runner,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    vs_id, _ = store

    async def run() -> Any:
        client = AsyncOpenAI(base_url=searching_server, api_key="unused", max_retries=0)
        model = OpenAIResponsesModel(model=MODEL, openai_client=client)
        agent = Agent(
            name="Librarian",
            instructions="Answer from what the file search finds.",
            tools=[FileSearchTool(vector_store_ids=[vs_id], max_num_results=2)],
            model=model,
            model_settings=ModelSettings(tool_choice="file_search", max_tokens=200),
        )
        try:
            return await Runner.run(agent, QUESTION, max_turns=2)
        finally:
            await client.close()

    result = asyncio.run(run())
    kinds = [item.type for item in result.new_items]
    assert "tool_call_item" in kinds, kinds  # the file_search_call, as the SDK names it
    assert "pemberton" in str(result.final_output).lower(), result.final_output

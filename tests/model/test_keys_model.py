"""API keys on a real `oars serve`, through the openai SDK: a wrong key is refused, and what one
key stores does not exist for another."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import openai
import pytest

from tests.model.conftest import MODEL, _serve

pytestmark = pytest.mark.model

A, B = "team-a-secret", "team-b-secret"


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _serve(tmp_path_factory, "--ctx", "2048", "--api-key", A, "--api-key", B)


def test_keys_through_the_sdk(keyed_server: str, closing: contextlib.ExitStack) -> None:
    a, b, stranger = (
        closing.enter_context(openai.OpenAI(base_url=keyed_server, api_key=key, max_retries=0))
        for key in (A, B, "guess")
    )
    with pytest.raises(openai.AuthenticationError):
        stranger.models.list()
    first = a.responses.create(
        model=MODEL, input="Name a colour.", max_output_tokens=8, temperature=0
    )
    assert first.status in ("completed", "incomplete") and first.output_text
    with pytest.raises(openai.NotFoundError):
        b.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        b.responses.create(
            model=MODEL, input="And another?", previous_response_id=first.id, max_output_tokens=8
        )
    assert a.responses.retrieve(first.id).output_text == first.output_text
    second = a.responses.create(
        model=MODEL,
        input="And another?",
        previous_response_id=first.id,
        max_output_tokens=8,
        temperature=0,
    )
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens  # the history came along

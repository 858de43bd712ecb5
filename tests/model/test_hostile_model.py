"""Hostile input against the real engine: what used to crash, hang or cost minutes."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.model.conftest import MODEL

pytestmark = pytest.mark.model


def _post(server: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server}/responses", json={"model": MODEL, **body}, timeout=120)


def _grammar_tool(definition: str) -> dict[str, Any]:
    return {
        "type": "custom",
        "name": "g",
        "format": {"type": "grammar", "syntax": "lark", "definition": definition},
    }


def test_what_cannot_fit_is_refused_before_it_is_rendered(server: str) -> None:
    many = [{"role": "user", "content": "hi"}] * 15_000
    for body in ({"input": many}, {"input": "a" * 50_000_000}):
        r = _post(server, body)
        assert r.status_code == 400, r.text[:300]
        error = r.json()["error"]
        assert error["code"] == "context_length_exceeded" and error["param"] == "input"
        assert error["message"].startswith("The input is at least")  # the early bound


def test_a_long_chain_of_rules_does_not_take_the_server_down(server: str) -> None:
    """A chain of rules, written out as one regex, nests deeper than llguidance parses: a 400
    naming the grammar. A list of 5,500 words is one flat regex and runs."""
    rules = [f'r{i}: "a" r{i + 1} | "b"' for i in range(2_900)]
    chain = "\n".join(["start: r0", *rules, 'r2900: "z"'])
    words = "start: " + " | ".join(f'"w{i}x"' for i in range(5_500))
    body = {"input": "Write.", "tool_choice": "required", "max_output_tokens": 8}
    r = _post(server, {**body, "tools": [_grammar_tool(chain)]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].format.definition"
    r = _post(server, {**body, "tools": [_grammar_tool(words)]})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["status"] in ("completed", "incomplete"), r.json()["error"]
    assert httpx.get(f"{server.removesuffix('/v1')}/health", timeout=10).status_code == 200


def test_a_seed_past_32_bits_and_a_huge_tool_name_are_400s(server: str) -> None:
    r = _post(server, {"input": "x", "seed": 99999999999999999})
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed"
    tool = {"type": "function", "name": "f" * 3000, "parameters": {"type": "object"}}
    r = _post(server, {"input": "x", "tools": [tool], "tool_choice": "auto"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].name"

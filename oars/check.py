"""`oars check URL --model M`: a fixed battery of requests against any Responses endpoint.

Every stream and object goes through the validator (openai SDK types plus invariants I1–I12).
Each check passes, fails with its first violation (event number, rule, excerpt), or is skipped
(a capability the server says it does not have, e.g. stored responses).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from openai.types.responses import Response
from pydantic import ValidationError

from oars.validator import SNAPSHOT_FIELDS, Report, same_response, validate_sse

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"location": {"type": "string"}},
        "required": ["location"],
        "additionalProperties": False,
    },
    "strict": True,
}
QUESTION = "What's the weather in Paris?"


class CheckFailed(Exception):
    def __init__(self, message: str, *, rule: str = "check", event: int = -1, excerpt: str = ""):
        super().__init__(message)
        self.rule, self.event, self.excerpt = rule, event, excerpt


class CheckSkipped(Exception):
    pass


@dataclass(frozen=True)
class Result:
    name: str
    status: str  # "passed" | "failed" | "skipped"
    detail: str = ""
    rule: str = ""
    event: int = -1


class Checker:
    """Runs the battery with one HTTP client (any transport) against `base_url` (…/v1)."""

    def __init__(self, client: httpx.Client, base_url: str, model: str, max_tokens: int = 48):
        self.client, self.base, self.model, self.max_tokens = (
            client,
            base_url.rstrip("/"),
            model,
            max_tokens,
        )

    def post(self, body: dict[str, Any]) -> httpx.Response:
        return self.client.post(f"{self.base}/responses", json=body, timeout=600)

    def body(self, **fields: Any) -> dict[str, Any]:
        # Greedy, so that a check's outcome depends on the server, not on a sampling draw.
        return {
            "model": self.model,
            "max_output_tokens": self.max_tokens,
            "temperature": 0,
            **fields,
        }

    def stream(self, body: dict[str, Any]) -> Report:
        response = self.post({**body, "stream": True})
        if response.status_code != 200:
            raise CheckFailed(f"HTTP {response.status_code}: {response.text[:200]}", rule="http")
        report = validate_sse(response.text)
        if not report.ok:
            v = report.violations[0]
            raise CheckFailed(v.message, rule=v.rule, event=v.index, excerpt=v.excerpt)
        return report

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        response = self.post(body)
        if response.status_code != 200:
            raise CheckFailed(f"HTTP {response.status_code}: {response.text[:200]}", rule="http")
        obj: dict[str, Any] = response.json()
        check_object(obj)
        return obj

    def run(self, only: set[str] | None = None) -> list[Result]:
        results = []
        for name, check in CHECKS.items():
            if only and name not in only:
                continue
            results.append(_run_one(name, check, self))
        return results


def _run_one(name: str, check: Callable[[Checker], str], checker: Checker) -> Result:
    try:
        return Result(name, "passed", check(checker))
    except CheckSkipped as exc:
        return Result(name, "skipped", str(exc))
    except CheckFailed as exc:
        detail = f"{exc} [{exc.excerpt}]" if exc.excerpt else str(exc)
        return Result(name, "failed", detail, exc.rule, exc.event)
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        return Result(name, "failed", f"{type(exc).__name__}: {exc}", "http")


def check_object(obj: dict[str, Any]) -> None:
    missing = [f for f in SNAPSHOT_FIELDS if f not in obj]
    if missing:
        raise CheckFailed(f"response lacks required fields {missing}", rule="schema")
    try:
        Response.model_validate(obj)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise CheckFailed(f"{err['loc']} {err['msg']}", rule="schema") from exc


def _final(report: Report) -> dict[str, Any]:
    final = report.final
    assert final is not None  # a valid report always has a terminal event
    return final


def _expect_status(obj: dict[str, Any], *statuses: str) -> None:
    if obj.get("status") not in statuses:
        raise CheckFailed(f"status {obj.get('status')!r}, expected {' or '.join(statuses)}")


def _items(obj: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [i for i in obj.get("output") or [] if i.get("type") == kind]


# ---- the battery -----------------------------------------------------------------------------


def check_text(c: Checker) -> str:
    obj = c.create(c.body(input="Say hello in exactly 3 words."))
    _expect_status(obj, "completed", "incomplete")
    if not _items(obj, "message"):
        raise CheckFailed("no message in output")
    return "non-streaming text response"


def check_streaming(c: Checker) -> str:
    report = c.stream(c.body(input="Count from 1 to 5."))
    return f"{len(report.events)} events"


def check_system_prompt(c: Checker) -> str:
    c.stream(
        c.body(
            input=[
                {"role": "system", "content": "Answer in French."},
                {"role": "user", "content": "Say hello."},
            ]
        )
    )
    return "system message accepted"


def check_multi_turn(c: Checker) -> str:
    c.stream(
        c.body(
            input=[
                {"role": "user", "content": "My name is Ada."},
                {"role": "assistant", "content": "Nice to meet you, Ada."},
                {"role": "user", "content": "What is my name?"},
            ]
        )
    )
    return "history accepted"


def _forced_call(c: Checker) -> dict[str, Any]:
    choice = {"type": "function", "name": "get_weather"}
    final = _final(c.stream(c.body(input=QUESTION, tools=[WEATHER], tool_choice=choice)))
    calls = _items(final, "function_call")
    if not calls:
        raise CheckFailed("forced tool_choice produced no function_call")
    try:
        json.loads(calls[0]["arguments"])
    except json.JSONDecodeError as exc:
        raise CheckFailed(f"arguments are not JSON: {calls[0]['arguments'][:80]}") from exc
    return calls[0]


def check_tool_forced(c: Checker) -> str:
    return f"called {_forced_call(c)['name']}"


def check_tool_auto(c: Checker) -> str:
    final = _final(c.stream(c.body(input=QUESTION, tools=[WEATHER], tool_choice="auto")))
    return "called a tool" if _items(final, "function_call") else "answered in text"


def check_tool_round_trip(c: Checker) -> str:
    call = _forced_call(c)
    history = [
        {"role": "user", "content": QUESTION},
        {k: call[k] for k in ("type", "call_id", "name", "arguments")},
        {
            "type": "function_call_output",
            "call_id": call["call_id"],
            "output": json.dumps({"temp_c": 18, "condition": "light rain"}),
        },
    ]
    final = _final(c.stream(c.body(input=history, tools=[WEATHER])))
    return "answered" if _items(final, "message") else "called again"


def check_reasoning(c: Checker) -> str:
    final = _final(c.stream(c.body(input="Is 91 prime?", reasoning={"effort": "low"})))
    return "reasoning item present" if _items(final, "reasoning") else "no reasoning (model)"


TRUNCATION_LIMIT = 16  # the smallest max_output_tokens OpenAI accepts


def check_truncation(c: Checker) -> str:
    # A reply far longer than the limit (about 200 tokens), so stopping early is not an excuse.
    prompt = "Count from 1 to 100 in digits, separated by commas."
    report = c.stream(c.body(input=prompt, max_output_tokens=TRUNCATION_LIMIT))
    final = _final(report)
    last = report.events[-1]["type"]
    output_tokens = (final.get("usage") or {}).get("output_tokens", 0)
    if last != "response.incomplete" and output_tokens < TRUNCATION_LIMIT:
        raise CheckFailed(
            f"the model stopped after {output_tokens} tokens, before the limit "
            f"of {TRUNCATION_LIMIT}; truncation untested",
            rule="I10",
        )
    if last != "response.incomplete":
        raise CheckFailed(
            f"{output_tokens} tokens reached max_output_tokens but the stream "
            f"ended with {last}, expected response.incomplete",
            rule="I10",
            event=len(report.events) - 1,
        )
    if (final.get("incomplete_details") or {}).get("reason") != "max_output_tokens":
        raise CheckFailed("incomplete_details.reason is not max_output_tokens", rule="I10")
    return "response.incomplete"


def check_previous_response(c: Checker) -> str:
    first = c.create(c.body(input="My name is Ada.", store=True))
    if not first.get("store"):
        raise CheckSkipped("the server does not store responses (store: false)")
    stored = c.client.get(f"{c.base}/responses/{first['id']}", timeout=60)
    if stored.status_code != 200 or not same_response(stored.json(), first):
        raise CheckFailed(
            f"GET /responses/{{id}} gave HTTP {stored.status_code} or a response "
            "other than the one created",
            rule="I12",
        )
    report = c.stream(c.body(input="What is my name?", previous_response_id=first["id"]))
    final = report.final or {}
    if final.get("previous_response_id") != first["id"]:
        raise CheckFailed("the continuation does not echo previous_response_id", rule="I11")
    return "stored, read back unchanged, and continued"


BAD_REQUESTS: list[tuple[str, bytes | dict[str, Any]]] = [
    ("temperature out of range", {"input": "x", "temperature": 9}),
    ("missing input", {}),
    ("input of the wrong type", {"input": 42}),
    ("unknown previous_response_id", {"input": "x", "previous_response_id": "resp_nope"}),
    ("invalid JSON", b"{not json"),
]


def check_bad_requests(c: Checker) -> str:
    for label, body in BAD_REQUESTS:
        if isinstance(body, bytes):
            r = c.client.post(
                f"{c.base}/responses",
                content=body,
                headers={"content-type": "application/json"},
                timeout=60,
            )
        else:
            r = c.post({"model": c.model, **body})
        if not 400 <= r.status_code < 500:
            raise CheckFailed(f"{label}: HTTP {r.status_code}, expected 4xx", rule="errors")
        error = (
            r.json().get("error")
            if r.headers.get("content-type", "").startswith("application/json")
            else None
        )
        if not isinstance(error, dict) or not {"message", "type"} <= set(error):
            raise CheckFailed(f"{label}: body is not an OpenAI error object", rule="errors")
    return f"{len(BAD_REQUESTS)} malformed requests rejected with 4xx"


CHECKS: dict[str, Callable[[Checker], str]] = {
    "text": check_text,
    "streaming": check_streaming,
    "system-prompt": check_system_prompt,
    "multi-turn": check_multi_turn,
    "tool-forced": check_tool_forced,
    "tool-auto": check_tool_auto,
    "tool-round-trip": check_tool_round_trip,
    "reasoning": check_reasoning,
    "truncation": check_truncation,
    "previous-response-id": check_previous_response,
    "bad-requests": check_bad_requests,
}


def table(results: list[Result]) -> str:
    width = max(len(r.name) for r in results)
    lines = [f"{'check':<{width}}  result   detail", f"{'-' * width}  -------  ------"]
    for r in results:
        where = f"event {r.event}: " if r.event >= 0 else ""
        rule = f"{r.rule}: " if r.rule and r.status == "failed" else ""
        lines.append(f"{r.name:<{width}}  {r.status:<7}  {rule}{where}{r.detail}")
    failed = sum(r.status == "failed" for r in results)
    passed = sum(r.status == "passed" for r in results)
    lines.append(f"{passed} passed, {failed} failed")
    return "\n".join(lines)

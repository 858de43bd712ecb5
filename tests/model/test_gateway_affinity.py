"""Chain affinity against real upstreams: two llama-cpp-python servers on the default GGUF
behind one `oars serve`. A chain continued by `previous_response_id` goes back to the replica
that served its last turn, whose prompt cache still holds that turn's prompt; the same chain
sent to the two replicas in turn finds the previous turn's prompt on neither.

The signal. llama-cpp-python's server reports no cached tokens: its usage is `prompt_tokens`,
`completion_tokens` and `total_tokens` only (`Llama._create_completion` builds it so in
llama_cpp/llama.py; `CompletionUsage` in llama_cpp/llama_types.py has no other field), so what
oars reports as `usage.input_tokens_details.cached_tokens` for it is 0, and this test says so
(llama.cpp's own `llama-server` does report them, in `prompt_tokens_details`, and oars passes
them on). What it does report, verbose (its default), on stderr: `Llama.generate: H
prefix-match hit, remaining R prompt tokens to eval` when a request's prompt starts with H tokens
its context still holds (no line: none), then, at the end of each completion, llama.cpp's
timings, whose `prompt eval time = … / N tokens` ends the request's record. The test sends one
request at a time and reads what each server's log grew by during each turn: the replica that
served the turn (the only one with `POST /v1/chat/completions` lines), and its first record, the
turn's generation, whose H + N is the turn's `input_tokens`. (The second record is oars' own
one-token request that counts the prompt, as this upstream streams no usage.)

The bound. llama-cpp-python keeps one context (no `--cache`): the tokens of its last request.
After a turn that is the turn's prompt (the counting request evaluates exactly the prompt, and
samples its one token without evaluating it), and the next turn's prompt begins with it, so with
affinity H is at least the previous turn's `input_tokens` (and at most that plus the previous
turn's output, what a generation could leave). Round-robin, turn N lands on the replica that
served turn N-2: H covers turn N-2's prompt, never turn N-1's.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.model.conftest import MODEL, _serve, llama_server

pytestmark = pytest.mark.model

INSTRUCTIONS = """You are Ledger, the operations assistant of a small bookshop called The Quiet
Page. You help the staff with stock, orders, opening hours and customers' questions.

Rules you always follow:
1. Answer in one short sentence. Never use lists, headings or code blocks.
2. The shop opens at nine in the morning and closes at six in the evening, Monday to Saturday.
   On Sundays it is closed. On public holidays it opens at ten and closes at four.
3. Orders from the distributor arrive on Tuesdays and Fridays. An order placed before noon on
   the day before arrives with the next delivery; later orders wait for the one after.
4. Customers may return a book within thirty days with its receipt, for a refund in the way
   they paid. Without a receipt they get a credit note for the shop's current price.
5. Signed copies, second-hand books and special orders cannot be returned.
6. The loyalty card gives one stamp per book bought; ten stamps give a free paperback up to
   twelve euros. Stamps expire after two years.
7. Staff discount is twenty percent on new books and does not combine with other offers.
8. Gift wrapping is free in December and costs one euro the rest of the year.
9. The reading group meets on the first Thursday of each month at seven in the evening; the
   shop closes to the public at six on that day as on any other.
10. If you do not know something, say that you will ask the manager, Ms. Okafor.
11. Prices are in euros and include VAT. Never invent a price that is not given to you.
12. Be friendly and brief; the staff read your answers between customers.
"""

QUESTIONS = [
    "When does the shop open on a Saturday?",
    "And on a public holiday?",
    "Which days does the distributor deliver?",
    "Can a customer return a signed copy?",
    "How many stamps give a free paperback?",
    "Who do I ask if you do not know?",
]

ACCESS = "POST /v1/chat/completions"
HIT = re.compile(r"Llama\.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens")
EVAL = re.compile(r"llama_perf_context_print: prompt eval time = .* / +(\d+) tokens")


@dataclass(frozen=True)
class Upstream:
    url: str
    log: Path


@dataclass(frozen=True)
class Record:
    """One completion in an upstream's log: the prompt tokens its context held (`hit`) and the
    ones it evaluated."""

    hit: int
    evaluated: int


@dataclass(frozen=True)
class Turn:
    replica: int  # which upstream served it, from their logs
    records: tuple[Record, ...]  # that upstream's completions during the turn
    input_tokens: int
    output_tokens: int
    cached_tokens: int  # as oars reports them

    @property
    def hit(self) -> int:
        """What the turn's generation (the turn's first completion) found in the cache."""
        return self.records[0].hit


@pytest.fixture(scope="module")
def gateway_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[Upstream]]]:
    """Two llama-cpp-python servers (one thread each: they take turns) and one `oars serve`
    with three models on them: the default model's name on both, as two replicas; `a` on the
    first alone and `b` on the second alone, for a chain that alternates between them.

    The replicas' health checks run at their default interval: llama-cpp-python answers its
    model listing (the health path) only between two completions (`get_models` waits for the
    lock its generations hold), so a check during a turn times out; the gateway must keep a
    replica that is streaming in service, or the chain would move at its next turn."""
    with contextlib.ExitStack() as stack:
        upstreams = [
            Upstream(*stack.enter_context(llama_server(tmp_path_factory.mktemp(name), threads=1)))
            for name in ("replica-a", "replica-b")
        ]
        first, second = (u.url for u in upstreams)
        config = tmp_path_factory.mktemp("gateway") / "upstreams.toml"
        config.write_text(
            f'[[upstream]]\nmodel = "{MODEL}"\nurls = ["{first}", "{second}"]\n'
            f'[[upstream]]\nmodel = "a"\nurl = "{first}"\n'
            f'[[upstream]]\nmodel = "b"\nurl = "{second}"\n'
        )
        serve = contextlib.contextmanager(_serve)
        gateway = stack.enter_context(
            serve(tmp_path_factory, "--upstreams", str(config), "--temperature", "0")
        )
        yield gateway, upstreams


def _records(text: str) -> list[Record]:
    """The completions in a stretch of a log, in order: a prefix-match line (when there was a
    hit) belongs to the timings that follow it."""
    records, hit = [], 0
    for line in text.splitlines():
        if m := HIT.search(line):
            hit = int(m.group(1))
        elif m := EVAL.search(line):
            records.append(Record(hit, int(m.group(1))))
            hit = 0
    return records


def _turn(gateway: str, upstreams: list[Upstream], body: dict[str, Any]) -> tuple[str, Turn]:
    """Send one turn; what it made (its id) and what each upstream logged meanwhile. Each
    upstream writes a completion's lines before it answers it, and oars answers after the
    upstream's answers, so the logs are complete when the turn returns."""
    sizes = [u.log.stat().st_size for u in upstreams]
    r = httpx.post(f"{gateway}/responses", json=body, timeout=300)
    assert r.status_code == 200, r.text
    response = r.json()
    assert response["status"] in ("completed", "incomplete"), response
    grown = []
    for upstream, size in zip(upstreams, sizes, strict=True):
        with open(upstream.log, "rb") as f:
            f.seek(size)
            grown.append(f.read().decode(errors="replace"))
    served = [i for i, text in enumerate(grown) if ACCESS in text]
    assert len(served) == 1, f"the turn reached {len(served)} upstreams: {grown}"
    text = grown[served[0]]
    records = tuple(_records(text))
    # The generation and oars' counting request: two requests, two completions.
    assert text.count(ACCESS) == len(records) == 2, text
    usage = response["usage"]
    turn = Turn(
        served[0],
        records,
        usage["input_tokens"],
        usage["output_tokens"],
        usage["input_tokens_details"]["cached_tokens"],
    )
    # The record is the turn's: what the generation found cached plus what it evaluated is
    # the prompt oars counted.
    assert turn.hit + records[0].evaluated == turn.input_tokens, turn
    return response["id"], turn


def _chain(gateway: str, upstreams: list[Upstream], models: list[str], session: str) -> list[Turn]:
    """Six turns, each continuing the last by `previous_response_id`; the first message names
    the session, so two chains share the instructions and nothing after them."""
    turns: list[Turn] = []
    previous: str | None = None
    for i, (model, question) in enumerate(zip(models, QUESTIONS, strict=True)):
        body: dict[str, Any] = {
            "model": model,
            "instructions": INSTRUCTIONS,
            "input": f"(Session {session}.) {question}" if i == 0 else question,
            "store": True,
            "temperature": 0,
            "max_output_tokens": 16,
        }
        if previous is not None:
            body["previous_response_id"] = previous
        previous, turn = _turn(gateway, upstreams, body)
        turns.append(turn)
    return turns


def _growing(turns: list[Turn]) -> None:
    inputs = [t.input_tokens for t in turns]
    assert all(a < b for a, b in itertools.pairwise(inputs)), inputs
    assert inputs[0] > 300, "the instructions are a few hundred tokens"


def _shown(turns: list[Turn]) -> str:
    return "; ".join(
        f"replica {t.replica} input {t.input_tokens} output {t.output_tokens} "
        f"hit {t.hit} evaluated {t.records[0].evaluated} cached {t.cached_tokens}"
        for t in turns
    )


def test_the_upstream_reports_no_cached_tokens(
    gateway_pair: tuple[str, list[Upstream]],
) -> None:
    """Why the test reads logs: the same prompt twice, the second all but wholly from the
    cache, and the usage says nothing of it."""
    _, upstreams = gateway_pair
    body = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": "Hi"},
        ],
        "max_tokens": 4,
        "temperature": 0,
    }
    upstream = upstreams[0]
    for _ in range(2):
        size = upstream.log.stat().st_size
        r = httpx.post(f"{upstream.url}/chat/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert set(usage) == {"prompt_tokens", "completion_tokens", "total_tokens"}, usage
    with open(upstream.log, "rb") as f:
        f.seek(size)
        (record,) = _records(f.read().decode(errors="replace"))
    assert record.hit == usage["prompt_tokens"] - 1  # all but the last, evaluated for its logits


def test_a_chain_reuses_its_replicas_prompt_cache_on_every_turn(
    gateway_pair: tuple[str, list[Upstream]],
) -> None:
    gateway, upstreams = gateway_pair
    turns = _chain(gateway, upstreams, [MODEL] * len(QUESTIONS), "affinity")
    shown = _shown(turns)
    assert len({t.replica for t in turns}) == 1, shown
    _growing(turns)
    for previous, turn in itertools.pairwise(turns):
        assert previous.input_tokens <= turn.hit, shown
        assert turn.hit <= previous.input_tokens + previous.output_tokens, shown
    # llama-cpp-python's server reports no cached tokens, so neither does oars (see above).
    assert [t.cached_tokens for t in turns] == [0] * len(turns), shown
    print(shown)


def test_a_chain_sent_to_the_replicas_in_turn_reuses_no_previous_turn(
    gateway_pair: tuple[str, list[Upstream]],
) -> None:
    """The control: the same chain alternating between `a` (the first server) and `b` (the
    second). Each replica still holds the turn before last, so the cache is there, but not the
    previous turn's prompt."""
    gateway, upstreams = gateway_pair
    models = ["a", "b"] * (len(QUESTIONS) // 2)
    turns = _chain(gateway, upstreams, models, "round-robin")
    shown = _shown(turns)
    assert [t.replica for t in turns] == [0, 1] * (len(QUESTIONS) // 2), shown
    _growing(turns)
    for previous, turn in itertools.pairwise(turns):
        assert turn.hit < previous.input_tokens, shown
    for before_last, turn in zip(turns[:-2], turns[2:], strict=True):
        assert before_last.input_tokens <= turn.hit, shown
        assert turn.hit <= before_last.input_tokens + before_last.output_tokens, shown
    assert [t.cached_tokens for t in turns] == [0] * len(turns), shown
    print(shown)

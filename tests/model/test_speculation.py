"""Speculative decoding on the real model: a reply that copies its prompt is drafted from it and
verified, a seeded reply's tokens and logprobs do not depend on what runs beside it while it
drafts, the default measures what a pass costs at startup, and `--speculation off` drafts
nothing. The first two run with `--speculation on` (drafts sized by acceptance alone): on two
busy cores the measured curve decides whether a draft pays at all, by a margin within its
noise."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.model.conftest import _serve
from tests.model.test_batching_model import TOPICS, _logprobs, _text, _timed_stream

pytestmark = pytest.mark.model

SOURCE = "".join(
    f"def area_of_{shape}(size: float) -> float:\n"
    f'    """The area of a {shape} of the given size."""\n'
    f"    return {factor} * size * size\n\n\n"
    for shape, factor in (("square", "1.0"), ("circle", "3.14159"), ("triangle", "0.43301"))
)
COPY = {
    "model": "default",
    "temperature": 0,
    "max_output_tokens": 60,
    "input": f"Here is shapes.py:\n\n```python\n{SOURCE}```\n\nRepeat the file exactly, in a "
    "code block, and nothing else.",
}


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _serve(tmp_path_factory, "--ctx", "2048", "--parallel", "4", "--speculation", "on")


def _drafts(server: str) -> tuple[float, float]:
    """The server's draft tokens verified so far, and accepted."""
    text = httpx.get(f"{server.removesuffix('/v1')}/metrics", timeout=10).text
    found = dict(
        re.findall(r"^(oars_draft_tokens(?:_accepted)?)_total\{[^}]*\} (\S+)$", text, re.M)
    )
    return float(found["oars_draft_tokens"]), float(found["oars_draft_tokens_accepted"])


def _delta(server: str, before: tuple[float, float]) -> tuple[float, float]:
    after = _drafts(server)
    return after[0] - before[0], after[1] - before[1]


def test_a_reply_that_copies_its_prompt_is_drafted_from_it(four: str) -> None:
    before = _drafts(four)
    final = _timed_stream(four, COPY)["final"]
    drafted, accepted = _delta(four, before)
    text = _text(final)
    assert "def area_of_square(size: float) -> float:" in text, text
    assert '    """The area of a square of the given size."""' in text, text
    # most of the copy came from drafts, and most drafts were right
    assert accepted >= 20 and accepted / drafted > 0.6, (drafted, accepted)
    assert final["usage"]["output_tokens"] == 60


def test_a_seeded_reply_drafts_as_alone_beside_other_streams(four: str) -> None:
    """A seeded sequence drafts whatever runs beside it, each draft verified in a pass of its
    own: its tokens and their logprobs are its lone run's to the last bit."""
    seeded: dict[str, Any] = {
        **COPY,
        "temperature": 1,
        "seed": 7,
        "max_output_tokens": 40,
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 2,
    }
    before = _drafts(four)
    alone = _timed_stream(four, seeded)["final"]
    assert _delta(four, before)[1] > 0  # it drafted, and some drafts held
    others = [
        {"model": "default", "input": f"Write two lines about {t}.", "max_output_tokens": 40}
        for t in TOPICS[:3]
    ]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda b: _timed_stream(four, b), [seeded, *others]))
    assert _logprobs(alone)
    assert _logprobs(together[0]["final"]) == _logprobs(alone)
    assert _text(together[0]["final"]) == _text(alone)
    assert max(r["first"] for r in together) < max(r["end"] for r in together)


def test_by_default_a_pass_s_cost_is_measured_at_startup_and_off_drafts_nothing(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    folder = tmp_path_factory.mktemp("auto")
    for server in _serve(tmp_path_factory, "--ctx", "2048", folder=folder):
        final = _timed_stream(server, COPY)["final"]
        assert "def area_of_square(size: float) -> float:" in _text(final)
        drafted, accepted = _drafts(server)
        assert accepted <= drafted
    logged = (folder / "oars.log").read_text()
    curve = re.search(r"speculation: a pass of 1-8 rows costs ([\d., ]+) × one row", logged)
    assert curve is not None, logged[-2000:]
    costs = [float(c) for c in curve.group(1).split(", ")]
    assert len(costs) == 8 and costs[0] == 1.0 and max(costs) > 1.0  # a CPU's rows are not free
    for server in _serve(tmp_path_factory, "--ctx", "2048", "--speculation", "off"):
        final = _timed_stream(server, COPY)["final"]
        assert "def area_of_square(size: float) -> float:" in _text(final)
        assert _drafts(server) == (0.0, 0.0)

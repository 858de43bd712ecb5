"""File citations. The marker filter (`oars.parsing.citations`): fed whole, split in two at
every position, or a character at a time, a text gives the same text and the same markers. The
builder: a cited answer after a file search holds one text in every view."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oars.events.builder import Found, ResponseBuilder
from oars.events.replay import replay
from oars.generation import FinishReason, Usage
from oars.normalize import normalize
from oars.parsing import Segment, SegmentKind
from oars.parsing.citations import MAX_MARKER, Cited, Marks
from oars.validator import validate_events

CASES: list[tuple[str, str, list[Cited]]] = [
    ("See 【1】 here.", "See  here.", [Cited("1", 4)]),
    ("【2†notes.md】Start", "Start", [Cited("2", 0)]),
    ("One【1】【2】two【3】", "Onetwo", [Cited("1", 3), Cited("2", 3), Cited("3", 6)]),
    ("no marker at all", "no marker at all", []),
    ("left 【 open", "left 【 open", []),
    ("a【b\nc】d", "a【b\nc】d", []),
    ("empty 【】 one", "empty 【】 one", []),
    ("twice 【【4】", "twice 【", [Cited("4", 7)]),
    ("long 【" + "x" * MAX_MARKER + "】", "long 【" + "x" * MAX_MARKER + "】", []),
    ("ends 【5", "ends 【5", []),
    ("【 6 † spaced 】.", ".", [Cited("6", 0)]),
]


def _run(chunks: list[str]) -> tuple[str, list[Cited]]:
    marks = Marks()
    text: list[str] = []
    cited: list[Cited] = []
    for chunk in chunks:
        shown, found = marks.feed(chunk)
        text.append(shown)
        cited += found
    text.append(marks.finish())
    return "".join(text), cited


@pytest.mark.parametrize(("source", "text", "cited"), CASES)
def test_a_text_gives_the_same_pieces_however_it_is_cut(
    source: str, text: str, cited: list[Cited]
) -> None:
    assert _run([source]) == (text, cited)
    for cut in range(len(source) + 1):
        assert _run([source[:cut], source[cut:]]) == (text, cited), cut
    assert _run(list(source)) == (text, cited)


def test_a_marker_is_held_until_it_closes() -> None:
    marks = Marks()
    assert marks.feed("Cited 【1") == ("Cited ", [])
    assert marks.feed("2】 then") == (" then", [Cited("12", 6)])
    assert marks.feed(" 【x") == (" ", [])
    assert marks.finish() == "【x"


@given(st.lists(st.text(alphabet="ab【】†1\n", max_size=12), max_size=8))
def test_any_chunking_joins_to_the_one_shot_result(chunks: list[str]) -> None:
    assert _run(chunks) == _run(["".join(chunks)])


FOUND = Found("1", "file-abc", "notes.md", 0.9, "The answer is 42.", {"team": "core"})


def _cited_stream(chunks: list[str], *, include: bool = False) -> list[dict[str, Any]]:
    """The events of a response whose file search found `FOUND`, then wrote `chunks`."""
    echo = normalize({"input": "x"}, served_model="m").echo
    builder = ResponseBuilder(echo, model="m", include_results=include)
    events = builder.start()
    events += builder.file_search_call()
    events += builder.file_search_done(["the answer"], [FOUND])
    for chunk in chunks:
        events += builder.add(Segment(SegmentKind.TEXT, chunk))
    return events + builder.finish(FinishReason.STOP, Usage(1, 1))


def test_a_cited_answer_holds_one_text_in_every_view_however_it_is_cut() -> None:
    """A marker cut at every position: the deltas, `output_text.done`, the done item and the
    final response hold the same text, the marker gone, and the citation is added between
    the deltas around it, at the point it stood, in all four."""
    source = "It is 42【1】. Also 【9】here."  # 9 names no result: dropped
    text = "It is 42. Also here."
    citation = {"type": "file_citation", "file_id": "file-abc", "filename": "notes.md", "index": 8}
    for cut in range(len(source) + 1):
        events = _cited_stream([source[:cut], source[cut:]])
        report = validate_events(events)
        assert report.ok, (cut, report.text())
        deltas = [e for e in events if e["type"] == "response.output_text.delta"]
        assert "".join(e["delta"] for e in deltas) == text
        [done] = [e for e in events if e["type"] == "response.output_text.done"]
        [item] = [e["item"] for e in events if e["type"] == "response.output_item.done"][1:]
        final = events[-1]["response"]["output"][1]["content"][0]
        assert done["text"] == item["content"][0]["text"] == final["text"] == text
        assert item["content"][0]["annotations"] == final["annotations"] == [citation]
        added = [e for e in events if e["type"] == "response.output_text.annotation.added"]
        assert [e["annotation"] for e in added] == [citation]
        before = events[: events.index(added[0])]
        shown = "".join(e["delta"] for e in before if e["type"] == "response.output_text.delta")
        assert shown == text[:8], cut
        replayed = replay(events, events[-1]["response"]).response["output"]
        assert replayed == events[-1]["response"]["output"]


def test_a_file_search_shows_its_results_only_when_included() -> None:
    plain = _cited_stream(["Done."])
    included = _cited_stream(["Done."], include=True)
    for events, results in ((plain, None), (included, [FOUND.wire()])):
        search = events[-1]["response"]["output"][0]
        assert search == {
            "id": search["id"],
            "type": "file_search_call",
            "status": "completed",
            "queries": ["the answer"],
            "results": results,
        }
        added = next(e for e in events if e["type"] == "response.output_item.added")
        assert added["item"]["queries"] == [] and added["item"]["results"] is None
        assert validate_events(events).ok

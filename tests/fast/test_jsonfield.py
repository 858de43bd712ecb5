"""StringField decodes a JSON string field however its object text is chunked."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from oars.parsing.jsonfield import StringField

PATCH = '*** Begin Patch\n*** Add File: a "quoted" \\ path\n+héllo 👋\tend\n*** End Patch\n'


def _decode(chunks: list[str]) -> str:
    field = StringField("input")
    return "".join(field.feed(c) for c in chunks)


def test_every_two_way_split() -> None:
    for ascii_only in (False, True):
        text = json.dumps({"input": PATCH}, ensure_ascii=ascii_only)
        for i in range(len(text) + 1):
            assert _decode([text[:i], text[i:]]) == PATCH, (ascii_only, i)
        assert _decode(list(text)) == PATCH


@settings(max_examples=200, deadline=None)
@given(
    value=st.text(),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12),
    ascii_only=st.booleans(),
)
def test_random_values_and_chunkings(value: str, cuts: list[int], ascii_only: bool) -> None:
    text = json.dumps({"other": [1, "x"], "input": value, "after": 2}, ensure_ascii=ascii_only)
    points = sorted({min(c, len(text)) for c in cuts})
    chunks = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    assert _decode(chunks) == value


def test_broken_escapes_decode_to_replacement_characters() -> None:
    """What an unconstrained model may write: every chunking gives the same, encodable text."""
    cases = {
        '{"input": "x\\ud83d"}': "x\ufffd",  # a high surrogate with no low half
        '{"input": "x\\ude00y"}': "x\ufffdy",  # a lone low surrogate
        '{"input": "x\\ud83d\\n"}': "x\ufffd\n",
        '{"input": "a\\uzzzzb"}': "a\ufffdzzzzb",  # not hex
        '{"input": "x\\ud83d\\ude00y"}': "x😀y",
    }
    for text, value in cases.items():
        for i in range(len(text) + 1):
            assert _decode([text[:i], text[i:]]) == value, (text, i)
        assert _decode(list(text)) == value
        value.encode()  # no lone surrogate survives

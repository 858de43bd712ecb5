"""One sequence's sampling on a fake model: a vocabulary and a scripted argmax per step."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from oars.engines.base import ModelInfo
from oars.engines.sequence import Prepared, SequenceDecoder
from oars.generation import (
    ChatMessage,
    EngineChunk,
    EngineRequest,
    FinishReason,
    SamplingParams,
)
from oars.parsing.pipeline import PassThrough

EOS, CALL_END = 0, 7  # two end-of-generation tokens; harmony's <|call|> is one in gpt-oss
CONTROL = {5: b"<|channel|>", 6: b"<|im_start|>", CALL_END: b"<|call|>"}
VOCAB = {EOS: b"", 1: b"The answer", 2: b" is 4", 3: b".", 4: b"E", **CONTROL}


@dataclass
class FakeEngine:
    """What `SequenceDecoder` uses of `LlamaEngine`."""

    script: list[int]
    markers: frozenset[int] = frozenset()
    info: ModelInfo = field(default_factory=lambda: ModelInfo("fake", 4096))
    n_ctx: int = 4096
    grammars: None = None
    speculation: None = None
    indents: None = None

    def is_end(self, token: int) -> bool:
        return token in (EOS, CALL_END)

    def token_bytes(self, token: int) -> bytes:
        return VOCAB[token]

    def visible_bytes(self, token: int) -> bytes:
        hidden = token in CONTROL and token not in self.markers
        return b"" if hidden else VOCAB[token]

    def marker_text(self, token: int) -> str:
        return VOCAB[token].decode() if token in self.markers else ""


def _decode(engine: FakeEngine, **sampling: object) -> list[EngineChunk]:
    chunks: list[EngineChunk] = []
    params = SamplingParams(**{"temperature": 0.0, **sampling})  # type: ignore[arg-type]
    request = EngineRequest(messages=(ChatMessage("user", "q"),), sampling=params)
    sequence = SequenceDecoder(engine, Prepared(request, PassThrough(), "q", (1,)), chunks.append)  # type: ignore[arg-type]
    sequence.start(cached=0)
    for token in engine.script:  # each step's logits put the script's token on top
        logits = np.linspace(0.0, 1.0, len(VOCAB), dtype=np.float32)
        logits[token] = 30.0
        if sequence.step(logits) is None:
            break
    return chunks


def _text(chunks: list[EngineChunk]) -> str:
    return "".join(c.text for c in chunks)


def test_text_held_for_a_stop_sequence_is_output_when_generation_ends() -> None:
    # "." could begin "...", and "E" could begin "END": held back, then the model stops.
    assert _text(_decode(FakeEngine([1, 2, 3, EOS]), stop=("...",))) == "The answer is 4."
    assert _text(_decode(FakeEngine([1, 2, 4, EOS]), stop=("END",))) == "The answer is 4E"


def test_a_matched_stop_sequence_is_cut_with_what_follows() -> None:
    chunks = _decode(FakeEngine([1, 2, 3, 1, EOS]), stop=(" is",))
    assert _text(chunks) == "The answer"
    assert chunks[-1].finish is FinishReason.STOP and chunks[-1].stop_sequence == " is"


def test_the_first_stop_sequence_to_match_is_named_and_none_for_an_end_token() -> None:
    chunks = _decode(FakeEngine([1, 2, 3, EOS]), stop=("4.", " is"))
    assert _text(chunks) == "The answer" and chunks[-1].stop_sequence == " is"
    assert _decode(FakeEngine([1, 2, EOS]), stop=("END",))[-1].stop_sequence is None


def test_control_tokens_are_hidden_unless_the_parser_reads_them() -> None:
    script = [5, 1, 6, EOS]
    assert _text(_decode(FakeEngine(script))) == "The answer"
    shown = _text(_decode(FakeEngine(script, markers=frozenset({5}))))
    assert shown == "<|channel|>The answer"


def test_a_vanishing_temperature_is_greedy_not_nan() -> None:
    chunks = _decode(FakeEngine([1, 2, EOS]), temperature=1e-40)
    assert _text(chunks) == "The answer is 4"


def test_an_end_token_the_parser_reads_reaches_it() -> None:
    assert _text(_decode(FakeEngine([1, CALL_END]))) == "The answer"
    shown = _text(_decode(FakeEngine([1, CALL_END], markers=frozenset({CALL_END}))))
    assert shown == "The answer<|call|>"

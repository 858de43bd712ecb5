"""Constrained decoding with llguidance: token masks for a model's vocabulary.

One `Grammars` per model builds the llguidance tokenizer once (about a second) and compiles each
request's `Constraint`; one `TokenMask` per generation masks logits and follows sampled tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from oars.errors import InvalidRequest
from oars.family import Constraint, GrammarKind
from oars.tools import COMPACT_JSON

# Compact JSON: no free whitespace between tokens, so a small model cannot wander off in spaces.
_JSON_OPTIONS: Any = COMPACT_JSON


class Grammars:
    def __init__(self, vocab: Any, n_vocab: int) -> None:
        self._vocab, self._n_vocab = vocab, n_vocab
        self._tokenizer: Any = None

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from llguidance.llamacpp import lltokenizer_from_vocab

            self._tokenizer = lltokenizer_from_vocab(self._vocab, n_vocab=self._n_vocab)
        return self._tokenizer

    def compile(self, constraint: Constraint) -> str:
        """The llguidance grammar for a constraint; `InvalidRequest` if it is not usable."""
        from llguidance import LLMatcher

        try:
            grammar = _SOURCES[constraint.kind](constraint.source)
        except ValueError as exc:
            raise InvalidRequest(f"Invalid grammar: {exc}", param=constraint.param) from exc
        error = LLMatcher.validate_grammar(grammar, self.tokenizer)
        if error and not error.startswith("WARNING"):
            raise InvalidRequest(
                f"Unsupported or invalid {constraint.kind.value}: {error}", param=constraint.param
            )
        return str(grammar)

    def mask(self, grammar: str) -> TokenMask:
        return TokenMask(self.tokenizer, grammar, self._n_vocab)


def _json_schema(source: str) -> str:
    from llguidance import LLMatcher

    return str(LLMatcher.grammar_from_json_schema(source, defaults=_JSON_OPTIONS))


def _lark(source: str) -> str:
    from llguidance import LLMatcher

    return str(LLMatcher.grammar_from_lark(source))


_SOURCES = {GrammarKind.JSON_SCHEMA: _json_schema, GrammarKind.LARK: _lark}


class TokenMask:
    """Follows one generation through a grammar."""

    def __init__(self, tokenizer: Any, grammar: str, n_vocab: int) -> None:
        from llguidance import LLMatcher
        from llguidance.numpy import allocate_token_bitmask

        self._matcher = LLMatcher(tokenizer, grammar, log_level=0)
        self._bitmask = allocate_token_bitmask(1, n_vocab)
        self._n_vocab = n_vocab

    def apply(self, logits: np.ndarray) -> None:
        """Set the logits of tokens the grammar forbids next to -inf, in place."""
        from llguidance.numpy import fill_next_token_bitmask

        fill_next_token_bitmask(self._matcher, self._bitmask, 0)
        bits = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")[: self._n_vocab]
        logits[bits == 0] = -np.inf

    def consume(self, tokens: list[int]) -> None:
        if not self._matcher.consume_tokens(tokens):
            raise RuntimeError(f"grammar rejected a token: {self._matcher.get_error()}")

    @property
    def done(self) -> bool:
        """The grammar is complete: only end-of-generation may follow."""
        return bool(self._matcher.is_stopped())

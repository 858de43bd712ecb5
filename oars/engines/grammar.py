"""Constrained decoding with llguidance: token masks for a model's vocabulary.

One `Grammars` per model builds the llguidance tokenizer once (about a second) and compiles each
request's `Constraint`; one `TokenMask` per generation masks logits and follows sampled tokens.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from oars.errors import InvalidRequest
from oars.families import Constraint, GrammarKind
from oars.tools import COMPACT_JSON, MAX_GRAMMAR

# Compact JSON: no free whitespace between tokens, so a small model cannot wander off in spaces.
_JSON_OPTIONS: Any = COMPACT_JSON


class Grammars:
    def __init__(self, vocab: Any, n_vocab: int) -> None:
        self._vocab, self._n_vocab = vocab, n_vocab
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    @property
    def tokenizer(self) -> Any:
        with self._lock:  # built once (seconds), even when warming and a request ask at once
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
        error = LLMatcher.validate_grammar(grammar, self.tokenizer, limits=limits())
        if error and not error.startswith("WARNING"):
            raise InvalidRequest(
                f"Unsupported or invalid {constraint.kind.value}: {error}", param=constraint.param
            )
        # Building the matcher applies llguidance's size limits (lexer states, grammar size):
        # a grammar past them fails here, as a 400, not when the generation starts.
        matcher = LLMatcher(self.tokenizer, grammar, log_level=0, limits=limits())
        if matcher.is_error():
            raise InvalidRequest(
                f"The {constraint.kind.value} is too large or complex to "
                f"follow: {matcher.get_error()}",
                param=constraint.param,
            )
        return str(grammar)

    def mask(self, grammar: str) -> TokenMask:
        return TokenMask(self.tokenizer, grammar, self._n_vocab)


def limits() -> Any:
    """llguidance's limits, sized for what a request may send (a custom tool's grammar is at
    most `MAX_GRAMMAR` characters, so a rule has fewer alternatives than that): one
    alternative per word of a 5,000-word list is fine. Errors name the problem without
    printing the whole grammar into logs and answers."""
    from llguidance import LLParserLimits

    return LLParserLimits(
        max_items_in_row=MAX_GRAMMAR // 2, step_max_items=200_000, verbose_errors=False
    )


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

        self._matcher = LLMatcher(tokenizer, grammar, log_level=0, limits=limits())
        self._bitmask = allocate_token_bitmask(1, n_vocab)
        self._n_vocab = n_vocab
        self._filled = False

    def fill(self) -> None:
        """Compute the mask of what may come next (llguidance leaves the GIL meanwhile, so a
        batch's masks are computed in parallel, and alongside the forward pass)."""
        from llguidance.numpy import fill_next_token_bitmask

        fill_next_token_bitmask(self._matcher, self._bitmask, 0)
        self._filled = True

    def apply(self, logits: np.ndarray) -> None:
        """Set the logits of tokens the grammar forbids next to -inf, in place."""
        if not self._filled:
            self.fill()
        bits = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")[: self._n_vocab]
        logits[bits == 0] = -np.inf

    def consume(self, tokens: list[int]) -> None:
        self._filled = False
        if not self._matcher.consume_tokens(tokens):
            raise RuntimeError(f"grammar rejected a token: {self._matcher.get_error()}")

    @property
    def done(self) -> bool:
        """The grammar is complete: only end-of-generation may follow."""
        return bool(self._matcher.is_stopped())


# llguidance walks a grammar's rules recursively: a long chain of rules (`r1: "a" r2 | …`)
# overflows an 8 MiB thread stack and kills the process. Every thread that compiles or follows
# a grammar gets this much (address space only: pages are touched as the recursion needs them).
GRAMMAR_STACK = 256 * 2**20


def big_stack_thread(target: Callable[[], None], name: str) -> threading.Thread:
    old = threading.stack_size(GRAMMAR_STACK)
    try:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
    finally:
        threading.stack_size(old)
    return thread


class BigStackPool(ThreadPoolExecutor):
    """A thread pool whose threads have `GRAMMAR_STACK` of stack."""

    def _adjust_thread_count(self) -> None:
        old = threading.stack_size(GRAMMAR_STACK)
        try:
            super()._adjust_thread_count()  # type: ignore[misc]
        finally:
            threading.stack_size(old)

"""One request's decoding: the engine's batcher hands a sequence its logits each step, and the
sequence picks the next token (penalties, grammar mask, banned openings, sampling), decodes its
text, holds back what may start a stop sequence, and sends `EngineChunk`s with their logprobs.
A lazy constraint (a call grammar that starts at a trigger in the output) lives here too, and
`Prepared`, the request as the engine hands it to a sequence.
"""

from __future__ import annotations

import codecs
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from oars.engines.base import Opened
from oars.engines.batching import Place
from oars.engines.grammar import Grammars, TokenMask
from oars.engines.sampler import log_softmax, penalize, sample, top_indices
from oars.engines.speculation import Drafter, Indents, PassCost
from oars.families import Plan
from oars.generation import EngineChunk, FinishReason, TokenLogprob, TopLogprob, Usage
from oars.parsing.holdback import split_holdback

_PENALTY_WINDOW = 64
_TRIGGER_REACH = 64  # characters a call trigger can span


@dataclass(frozen=True)
class Prepared(Opened):
    """A request rendered, tokenized and known to fit the context, with its family's plan."""

    prompt: str = ""
    prompt_tokens: tuple[int, ...] = ()
    plan: Plan | None = None
    grammar: str | None = None  # the plan's constraint, compiled
    place: Place | None = None  # its place among the accepted requests

    @property
    def input_tokens(self) -> int:
        return len(self.prompt_tokens)


class Model(Protocol):
    """What a sequence asks of the engine that runs it: what each token spells and is, the
    openings a plan bans, the grammars, and a sequence's context length."""

    @property
    def n_ctx(self) -> int: ...

    @property
    def grammars(self) -> Grammars: ...

    @property
    def llm(self) -> Any: ...  # llama-cpp-python's `Llama`: its tokenizer

    @property
    def speculation(self) -> PassCost | None: ...  # None: no drafts

    @property
    def indents(self) -> Indents | None: ...  # the vocabulary's indents, for drafts

    def banned_openings(self, prefixes: tuple[str, ...]) -> np.ndarray: ...

    def is_end(self, token: int) -> bool: ...

    def marker_text(self, token: int) -> str: ...

    def visible_bytes(self, token: int) -> bytes: ...

    def token_bytes(self, token: int) -> bytes: ...


class _Lazy:
    """A constraint that starts when one of its triggers matches the output (see `Constraint`)."""

    def __init__(self, engine: Model, prepared: Prepared) -> None:
        assert prepared.plan is not None and prepared.plan.constraint is not None
        constraint = prepared.plan.constraint
        self.engine, self.grammar = engine, prepared.grammar or ""
        self.triggers = [re.compile(t) for t in constraint.triggers]
        self._may_rearm = constraint.rearm
        self._scan_from = 0
        self._anchored = False

    def check(self, text: str) -> TokenMask | None:
        """A mask already fed the triggering text, if a trigger matches now."""
        for trigger in self.triggers:
            found = trigger.search(text, self._scan_from)
            if found is None:
                continue
            mask = self.engine.grammars.mask(self.grammar)
            tail = text[found.start(1) :].encode()
            try:
                mask.consume(self.engine.llm.tokenize(tail, add_bos=False, special=False))
            except RuntimeError:
                self._scan_from = len(text)  # not the start of a valid call after all
                return None
            self._anchored = trigger.pattern.startswith("^")
            return mask
        # Triggers are short: only the tail can still start one, so each check stays O(1) in
        # the output's length (the anchored trigger has had its chance by then).
        self._scan_from = max(self._scan_from, len(text) - _TRIGGER_REACH)
        return None

    def rearm(self, text_len: int = 0) -> bool:
        """After a completed grammar: keep generating (watching for triggers) or stop."""
        self._scan_from = text_len
        return self._may_rearm and not self._anchored


class SequenceDecoder:
    """One request's decoding state: the batcher hands it logits, it picks and sends tokens."""

    def __init__(
        self,
        engine: Model,
        prepared: Prepared,
        emit: Callable[[EngineChunk | BaseException], object],
    ) -> None:
        self.engine, self.prepared, self.emit = engine, prepared, emit
        self.cancel = threading.Event()
        request = prepared.request
        self.prompt = prepared.prompt_tokens
        self.params = request.sampling
        # A reused prefix and a fresh prefill differ in float rounding, and sampling amplifies
        # that: a seeded run evaluates its whole prompt so that the same seed gives the same text.
        self.reuse = self.params.seed is None
        self.top_logprobs = request.top_logprobs
        plan = prepared.plan
        self.opening_ban = plan.opening_ban if plan is not None else ()
        self.rng = np.random.default_rng(self.params.seed)
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.held = ""  # text held back because it may start a stop sequence
        self.stop_sequence: str | None = None  # the stop sequence that matched
        self.produced = 0
        self.cached = 0
        self.budget = 0
        self.history: list[int] = []
        self.text = ""  # the output so far, for lazy constraints' triggers
        self.lazy: _Lazy | None = None
        self.mask: TokenMask | None = None
        self.drafter: Drafter | None = None

    @property
    def cancelled(self) -> bool:
        return self.cancel.is_set()

    def start(self, cached: int) -> None:
        """On the batcher's thread (grammars need its deep stack)."""
        self.cached = cached
        room = self.engine.n_ctx - len(self.prompt)
        self.budget = min(room, self.params.max_output_tokens or room)
        self.history = list(self.prompt[-_PENALTY_WINDOW:])
        if (cost := self.engine.speculation) is not None:
            self.drafter = Drafter(self.prompt, self.budget, cost, self.engine.indents)
        grammar, plan = self.prepared.grammar, self.prepared.plan
        constraint = plan.constraint if plan is not None else None
        if grammar is not None and constraint is not None and constraint.triggers:
            self.lazy = _Lazy(self.engine, self.prepared)
        elif grammar is not None:
            self.mask = self.engine.grammars.mask(grammar)

    def before_step(self) -> Callable[[], object] | None:
        return self.mask.fill if self.mask is not None else None

    def fail(self, error: BaseException) -> None:
        self.emit(error)

    def draft(self, crowded: bool) -> tuple[int, ...]:
        """A seeded sequence drafts whatever runs beside it, so that its text does not depend
        on the load; another steps back while other sequences run (on two cores a pass is
        compute-bound, and a rejected row there slows every stream)."""
        if self.drafter is None or (crowded and self.params.seed is None):
            return ()
        return self.drafter.draft(self.budget - self.produced)

    def step(self, logits: np.ndarray) -> int | None:
        engine = self.engine
        lps = log_softmax(logits) if self.top_logprobs is not None else None
        penalize(logits, self.history[-_PENALTY_WINDOW:], self.params.repetition_penalty)
        if self.mask is not None:
            self.mask.apply(logits)
        if self.produced == 0 and self.opening_ban:
            logits[engine.banned_openings(self.opening_ban)] = -np.inf
        token = sample(logits, self.params, self.rng)
        self.produced += 1
        self.history.append(token)
        if self.drafter is not None:
            self.drafter.add(token)
        if engine.is_end(token):
            self._finish(FinishReason.STOP, engine.marker_text(token))
            return None
        if self.mask is not None:
            self.mask.consume([token])
        if self._emit_token(token, lps) or self._grammar_finished():
            self._finish(FinishReason.STOP)
            return None
        if self.produced >= self.budget:
            self._finish(FinishReason.LENGTH)
            return None
        return token

    def _finish(self, reason: FinishReason, end_marker: str = "") -> None:
        usage = Usage(
            input_tokens=len(self.prompt), cached_tokens=self.cached, output_tokens=self.produced
        )
        # Text held back as a possible stop sequence is output unless a stop sequence matched.
        stop = self.stop_sequence
        tail = "" if stop is not None else self.held + self.decoder.decode(b"", final=True)
        self.emit(EngineChunk(tail + end_marker, 0, finish=reason, usage=usage, stop_sequence=stop))

    def _grammar_finished(self) -> bool:
        """True when a completed grammar ends the output; arms or disarms lazy constraints."""
        if self.lazy is None:
            return self.mask is not None and self.mask.done
        if self.mask is None:
            self.mask = self.lazy.check(self.text)
            return False
        if not self.mask.done:
            return False
        self.mask = None
        return not self.lazy.rearm(len(self.text))

    def _emit_token(self, token: int, lps: np.ndarray | None) -> bool:
        """Decode one token and send its text; True when a stop sequence ended the output."""
        raw = self.engine.visible_bytes(token)
        text = self.decoder.decode(raw)
        self.text += text
        logprobs = self._logprobs(token, raw, text, lps)
        # Stop sequences end free text; inside a constrained call they would only break it.
        stops = self.params.stop if self.mask is None else ()
        if not stops:
            self.emit(EngineChunk(self.held + text, 1, logprobs))
            self.held = ""
            return False
        buffer = self.held + text
        found = [(p, s) for s in stops if (p := buffer.find(s)) >= 0]
        if found:
            cut, self.stop_sequence = min(found)  # the first to match (Anthropic names it)
            self.emit(EngineChunk(buffer[:cut], 1, logprobs))
            return True
        safe, self.held = split_holdback(buffer, stops)
        self.emit(EngineChunk(safe, 1, logprobs))
        return False

    def _logprobs(
        self, token: int, raw: bytes, text: str, lps: np.ndarray | None
    ) -> tuple[TokenLogprob, ...]:
        """The model's own distribution (before penalties and grammar masks)."""
        if lps is None or self.top_logprobs is None:
            return ()
        top = tuple(
            TopLogprob(self._show(b := self.engine.token_bytes(int(t))), tuple(b), float(lps[t]))
            for t in top_indices(lps, self.top_logprobs)
        )
        # `token` is the text this token added (a token ending mid-character adds none yet), so
        # the tokens of a delta always concatenate to its text; `bytes` are the token's own bytes.
        return (TokenLogprob(text, tuple(raw), float(lps[token]), top),)

    @staticmethod
    def _show(raw: bytes) -> str:
        return raw.decode("utf-8", errors="replace")

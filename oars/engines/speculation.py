"""Speculative decoding from the context: a sequence drafts the tokens it expects next from its
own prompt and output, and the batcher verifies them as extra rows of the sequence's next pass
(`Batcher.step`). An agent's output copies its input (a patch repeats the lines around a change,
a rewrite repeats the file, a call repeats paths), so a match of the last few tokens earlier in
the context often says what comes next.

Every token is still sampled from its own row's logits by the sequence's full sampler; a draft
token counts only where the sample equals it, so speculation changes how many tokens a pass
yields, never which tokens a request may receive. Verify rows are not one-row decode to the bit
(llama.cpp multiplies a graph's rows with other kernels than a lone row's), so greedy text may
differ at near-ties from the text without speculation.

A draft pays only where most of it is accepted and its rows cost little: on two CPU cores a pass
of 2 rows cost 1.70× one row, of 8 rows 4.48× (`bench.lab.speculation`); on a GPU the curve is
nearly flat. So each engine measures its own curve at startup (`PassCost.measure`), and each
sequence drafts as many tokens as pay at its recent acceptance, none when none pays.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from oars.engines.batching import Context

log = logging.getLogger("oars.engine")

KEY = 3  # tokens a match must share (shorter keys drafted on nearly every pass of chat)
MAX_DRAFT = 7  # 8 rows a pass: llama.cpp's K-quant kernels change at 8 rows (`KERNEL_ROWS`)
# A sequence's acceptance is taken as accepted tokens over accepted tokens and missed drafts
# (a draft ends at its first miss), counted from this prior: 6 to 1 before it has drafted. On
# the two-core box (4 rows cost 2.4-2.9 one row, 6 rows 3.0-3.7, 2 rows 1.65-2.15) that drafts
# 3 to 5 tokens where 6 or 7 tokens match, none where only the key does (a lone token pays only
# at 95 %), and a missed first draft stops it.
_PRIOR_HITS, _PRIOR_MISSES = 6.0, 1.0
# Its own record weighs at most this many (so a copy that ends stops drafting within a few
# misses, however long it ran) and fades by `_FADE` a token (so a sequence that stopped tries
# again some 45 tokens later on that box).
_RECORD = 8.0
_FADE = 0.98
_GAIN = 1.2  # what a draft must promise a unit of cost against none (the curve is noisy)
_RUN = MAX_DRAFT + KEY - 1  # a run this long allows the longest draft
_PROBE_PROMPT = 64  # tokens in the memory while the curve is measured
_PROBE_REPS = 2


@dataclass(frozen=True)
class PassCost:
    """What a pass of one sequence costs at 1, 2, … rows with logits each, relative to one row
    (`relative[k - 1]` for k rows)."""

    relative: tuple[float, ...]

    def best_draft(self, acceptance: float, limit: int) -> int:
        """The draft length that yields the most tokens a unit of pass cost when each drafted
        token is accepted with probability `acceptance` (given the ones before it were): 0
        when none yields `_GAIN` times a pass of one row."""
        best, value = 0, _GAIN
        expected = term = 1.0
        for drafted in range(1, min(limit, len(self.relative) - 1) + 1):
            term *= acceptance
            expected += term
            gain = expected / self.relative[drafted]
            if gain > value:
                best, value = drafted, gain
        return best

    @classmethod
    def flat(cls) -> PassCost:
        """Extra rows cost nothing: drafts as long as acceptance allows (`--speculation on`)."""
        return cls((1.0,) * (MAX_DRAFT + 1))

    @classmethod
    def measure(cls, context: Context, seq: int) -> PassCost | None:
        """Time passes of 1 to `MAX_DRAFT + 1` rows of sequence `seq` after a short prompt,
        the fastest of `_PROBE_REPS` each, cutting the rows off again after each. None when
        the memory cannot drop a suffix (a recurrent or hybrid model): no speculation then."""
        from oars.engines.batching import Feed

        prompt = [(17 * i) % 1000 + 100 for i in range(_PROBE_PROMPT)]
        rows = prompt[: MAX_DRAFT + 1]
        context.decode([Feed(seq, prompt, 0, False)])
        best = [float("inf")] * len(rows)
        try:
            for _ in range(_PROBE_REPS):
                for k in range(1, len(rows) + 1):
                    began = time.perf_counter()
                    context.decode([Feed(seq, rows[:k], _PROBE_PROMPT, True, k - 1)])
                    best[k - 1] = min(best[k - 1], time.perf_counter() - began)
                    if not context.forget(seq, _PROBE_PROMPT):
                        return None
        finally:
            context.forget(seq, 0)
        return cls(tuple(round(b / best[0], 3) for b in best))


class Drafter:
    """One sequence's drafts: the tokens that followed the most recent earlier occurrence of
    its last `KEY` tokens in its prompt and output, or, while the source of the last draft is
    still being copied, the tokens after it. The length comes from the sequence's own recent
    acceptance and the engine's `PassCost`, so the schedule depends only on the sequence's own
    tokens and the engine's configuration, never on what runs beside it."""

    def __init__(self, prompt: Sequence[int], room: int, cost: PassCost) -> None:
        self._tokens = np.empty(len(prompt) + room + 1, dtype=np.int32)
        self._tokens[: len(prompt)] = prompt
        self._n = len(prompt)
        self._cost = cost
        self._hits = self._misses = 0.0
        self._seen = self._n  # tokens counted into the record
        self._source: int | None = None  # where the last draft was copied from
        self._draft = 0  # its length (0: none is out)
        self._drafted_at = 0  # the length of the sequence when it was made

    def add(self, token: int) -> None:
        """A token the sequence sampled."""
        self._tokens[self._n] = token
        self._n += 1

    @property
    def acceptance(self) -> float:
        hits, misses = self._hits + _PRIOR_HITS, self._misses + _PRIOR_MISSES
        return hits / (hits + misses)

    def draft(self, limit: int) -> tuple[int, ...]:
        """The tokens expected after the last one added, at most `limit`; () for none. A
        draft is no longer than the run of tokens its source shares with the sequence's end,
        less `KEY - 1`: a match of just the key (a phrase that recurs in any text) drafts one
        token, which pays only where extra rows are nearly free; a sequence copying for a while
        drafts as many as pay."""
        self._settle()
        if self._cost.best_draft(self.acceptance, limit) == 0:
            self._source = None
            return ()
        source = self._source if self._source is not None else self._find()
        if source is None:
            return ()
        run = self._run(source)
        drafted = self._cost.best_draft(self.acceptance, min(limit, run - KEY + 1))
        if drafted == 0:
            self._source = None  # found afresh next time: the sequence moves on meanwhile
            return ()
        tokens = self._tokens[source : min(source + drafted, self._n)]
        self._source, self._draft, self._drafted_at = source, len(tokens), self._n
        return tuple(int(t) for t in tokens)

    def _run(self, source: int) -> int:
        """How many tokens before `source` equal the sequence's last ones (up to `_RUN`)."""
        t, n, run = self._tokens, self._n, 0
        while run < min(_RUN, source) and t[source - 1 - run] == t[n - 1 - run]:
            run += 1
        return run

    def _settle(self) -> None:
        """Learn from the last draft what the sequence sampled after it, and fade the record."""
        n = self._n
        fade = _FADE ** (n - self._seen)
        self._hits, self._misses, self._seen = self._hits * fade, self._misses * fade, n
        if not self._draft:
            return
        source, at, drafted = self._source, self._drafted_at, self._draft
        assert source is not None
        came = self._tokens[at:n]
        copied = self._tokens[source : source + len(came)]
        same = came[: len(copied)] == copied
        accepted = int(np.argmin(same)) if not same.all() else len(copied)
        self._hits += min(accepted, drafted)
        self._misses += accepted < drafted
        if (weight := self._hits + self._misses) > _RECORD:
            self._hits, self._misses = (
                self._hits * _RECORD / weight,
                self._misses * _RECORD / weight,
            )
        self._draft = 0
        # still copying its source (the draft and what followed it): go on from there
        self._source = source + len(came) if accepted == len(came) else None

    def _find(self) -> int | None:
        """Where the tokens after the most recent earlier occurrence of the last `KEY` begin."""
        n, t = self._n, self._tokens
        if n <= KEY:
            return None
        match = t[: n - KEY] == t[n - KEY]
        for i in range(1, KEY):
            match &= t[i : n - KEY + i] == t[n - KEY + i]
        found = np.flatnonzero(match)
        return int(found[-1]) + KEY if found.size else None

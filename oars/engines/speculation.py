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
sequence drafts as many tokens as pay at its recent acceptance, none when none pays (a long
match is then followed unverified, so that its acceptance is learnt all the same).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from oars.engines.batching import Context

log = logging.getLogger("oars.engine")

KEY = 3  # tokens a match must share (shorter keys drafted on nearly every pass of chat)
MAX_DRAFT = 7  # 8 rows a pass: llama.cpp's K-quant kernels change at 8 rows (`KERNEL_ROWS`)
# A sequence's acceptance is taken as accepted tokens over accepted tokens and missed drafts
# (a draft ends at its first miss), counted from this prior: 8 to 1 before it has drafted. On
# the two-core box (4 rows cost 2.3-3.2 one row, 6 rows 2.9-3.8, 2 rows 1.8-2.4 over 20 starts)
# that drafts 3 to 5 tokens where 6 or 7 tokens match, none where only the key does (a lone
# token pays only at 95 %), and a missed first draft stops it on most curves. At 6 to 1 the
# dearest curves of those starts let no first draft pay, and a server drafted nothing all run.
_PRIOR_HITS, _PRIOR_MISSES = 8.0, 1.0
# Its own record weighs at most this many (so a copy that ends stops drafting within a few
# misses, however long it ran) and fades by `_FADE` a token (so a sequence that one miss
# stopped tries again some 30 tokens later on that box's median curve).
_RECORD = 8.0
_FADE = 0.98
# Where no draft pays at the record, a match this long or longer (7 tokens and more) is
# followed all the same, unverified: its record then rises as the sequence copies it. A later
# start measured a curve dearer still (4 rows 2.88 one row, 6 rows 3.95), where nothing paid at
# the prior, and its bench run drafted nothing again. Replayed on the greedy replies the bench
# records, copies then yielded 1.14-1.47× the tokens a unit of pass cost on that curve (one
# patch 0.97×), and on the lab's, the median startup and the dearest curves the same as before;
# following matches of 5 or 6 tokens as well cost patches up to 8 % on the dearest curves.
_SHADOW = 5
_GAIN = 1.2  # what a draft must promise a unit of cost against none (the curve is noisy)
_RUN = MAX_DRAFT + KEY - 1  # a run this long allows the longest draft
# A new match in the sequence's own output drafts only where the run is this long: a reply
# says its own phrases again without going on as it did (chat's new matches in its output,
# replayed on the bench's greedy replies: 29-50 % missed their first token, whatever the
# run), where an agent copies its prompt
_OWN_RUN = 8
_CONTEXT = 32  # tokens before a match compared to choose among matches
_REALIGN = 4  # how far past a break a copy is looked for again (see `Drafter._realign`)
_RENAME = 3  # the most tokens a rename writes for one
_COPY = KEY + 2  # a copy this long that breaks off is looked for again past the break
_PROBE_PROMPT = 64  # tokens in the memory while the curve is measured
# Rounds in which each size is timed once and one row (every ratio's base) twice, the fastest
# of each kept. Two rounds that timed one row once each: a start on the idle box (run G,
# docs/benchmarks.md) measured 2 rows at 1.19× one row and 8 at 3.04×, where five other starts
# that hour measured 1.76-1.97× and 4.53-5.67×, and chat ran at 0.94 of no drafts.
_PROBE_REPS = 3
# A pass of several rows does more work than one of a row: a curve where one costs under this
# much of it was measured with the one-row passes stalled (a busy machine: 8 rows at 0.12 of
# one row, measured beside a test suite on two cores), and is measured again, up to
# `_PROBE_TRIES` times; then the rows are taken to cost what they would without batching
# (no draft pays).
_FLOOR = 0.8
_PROBE_TRIES = 3


@dataclass(frozen=True)
class PassCost:
    """What a pass of one sequence costs at 1, 2, … rows with logits each, relative to one row
    (`relative[k - 1]` for k rows)."""

    relative: tuple[float, ...]
    steady: bool = True  # False: the measure stayed implausible, and no draft pays

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
    def linear(cls) -> PassCost:
        """Each row costs what a pass of one does: no draft pays."""
        return cls(tuple(float(k) for k in range(1, MAX_DRAFT + 2)), steady=False)

    @classmethod
    def measure(
        cls, context: Context, seq: int, clock: Callable[[], float] = time.perf_counter
    ) -> PassCost | None:
        """Time passes of 1 to `MAX_DRAFT + 1` rows of sequence `seq` after a short prompt,
        the fastest of `_PROBE_REPS` rounds each (of every try, see `_FLOOR`), cutting the rows
        off again after each. None when the memory cannot drop a suffix (a recurrent or hybrid
        model): no speculation then."""
        from oars.engines.batching import Feed

        prompt = [(17 * i) % 1000 + 100 for i in range(_PROBE_PROMPT)]
        rows = prompt[: MAX_DRAFT + 1]
        half = len(rows) // 2
        sizes = [1, *range(2, half + 1), 1, *range(half + 1, len(rows) + 1)]
        context.decode([Feed(seq, prompt, 0, False)])
        best = [float("inf")] * len(rows)
        try:
            for _ in range(_PROBE_TRIES):
                for _ in range(_PROBE_REPS):
                    for k in sizes:
                        began = clock()
                        context.decode([Feed(seq, rows[:k], _PROBE_PROMPT, True, k - 1)])
                        best[k - 1] = min(best[k - 1], clock() - began)
                        if not context.forget(seq, _PROBE_PROMPT):
                            return None
                relative = tuple(round(b / best[0], 3) for b in best)
                if min(relative) >= _FLOOR:
                    return cls(relative)
        finally:
            context.forget(seq, 0)
        return cls.linear()


class Indents:
    """The vocabulary's tokens made of one whitespace character repeated (`'    '`), so that a
    copy indented some spaces more or less than its source is drafted so on every line: a
    patch writes each context line one space further in than the file, a moved block four. A
    tokenizer has one token a width, so each width would otherwise be learnt line by line."""

    def __init__(self, pieces: Sequence[bytes]) -> None:
        self._runs = {
            token: (piece[0], len(piece))
            for token, piece in enumerate(pieces)
            if piece and piece[0] in b" \t" and piece == piece[:1] * len(piece)
        }
        self._tokens = {run: token for token, run in self._runs.items()}
        self._inverse: dict[int, dict[int, int]] = {}

    def shift(self, token: int, written: int) -> int:
        """How many characters wider `written` is than `token`, where both are runs of one
        whitespace character; 0 otherwise."""
        a, b = self._runs.get(token), self._runs.get(written)
        return b[1] - a[1] if a is not None and b is not None and a[0] == b[0] else 0

    def shifted(self, token: int, by: int) -> int | None:
        """The token `by` characters wider than `token`, if `token` is a run and that exists."""
        run = self._runs.get(token)
        return None if run is None else self._tokens.get((run[0], run[1] + by))

    def sources(self, by: int) -> dict[int, int]:
        """Each run's token, shifted `by`: the token it was shifted from."""
        if by not in self._inverse:
            self._inverse[by] = {w: t for t in self._runs if (w := self.shifted(t, by)) is not None}
        return self._inverse[by]


class Drafter:
    """One sequence's drafts: the tokens that followed an earlier occurrence of its last `KEY`
    tokens in its prompt and output (the one sharing the most context), or, while the source
    of the last draft is still being copied, the tokens after it. A copy that breaks off goes
    on where the source does a token or two later (`_realign`), and what the sequence wrote
    there for a token of the source is drafted for it from then on (a rename; a listing's
    line break written `", "`; a patch's wider indent, at every depth once seen at one,
    `Indents`). The length comes from the sequence's own recent acceptance and the engine's
    `PassCost`, so the schedule depends only on the sequence's own tokens and the engine's
    configuration, never on what runs beside it."""

    def __init__(
        self, prompt: Sequence[int], room: int, cost: PassCost, indents: Indents | None = None
    ) -> None:
        self._tokens = np.empty(len(prompt) + room + 1, dtype=np.int32)
        self._tokens[: len(prompt)] = prompt
        self._n = self._prompt = len(prompt)
        self._cost = cost
        self._hits = self._misses = 0.0
        self._seen = self._n  # tokens counted into the record
        self._source: int | None = None  # where the last draft was copied from
        self._skip = 0  # tokens of the rename of `_source`'s token written already
        self._draft = 0  # its length (0: none is out)
        self._drafted_at = 0  # the length of the sequence when it was made
        self._copied = 0  # tokens the sequence has copied from that source in a row
        # where a copy of `_COPY` tokens or more broke off: the source's token the sequence
        # did not copy, and the sequence's length then (see `_realign`)
        self._broke: tuple[int, int] | None = None
        # a token of the source, with the token after it, that the sequence writes as other
        # tokens wherever it copies the two (a rename: `load_rows` → `read_rows` leaves
        # `load_orders` alone; a listing's line break written `", "`), learnt where a copy broke
        # off at it and went on after it
        self._renames: dict[tuple[int, int], tuple[int, ...]] = {}
        # a token of the source the sequence rewrote the same way before two different tokens,
        # drafted so wherever it recurs (a patch's context line indented one space more than
        # the file's: the indent is one token, and the token after it differs on every line)
        self._anywhere: dict[int, tuple[int, ...]] = {}
        # the indent shift seen where a copy broke off at an indent and went on after it
        # (`Indents`): every indent of the source is drafted that much wider, until a copy
        # where the sequence keeps one as it was
        self._indents = indents
        self._shift = 0

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
        source, skip, run = self._source, self._skip, _RUN
        if source is None:
            skip = 0
            source = self._realign()
        if source is None and (source := self._find()) is not None:
            self._copied = run = 0
        if source is None:
            return ()
        run = max(run, self._run(source))
        # (only a new match: a copy going on, or realigned, counts its run as `_RUN`)
        if run < _OWN_RUN and source >= self._prompt:
            return ()
        self._copied = max(self._copied, run)
        longest = min(limit, run - KEY + 1)
        drafted = self._cost.best_draft(self.acceptance, longest)
        if not drafted and longest < _SHADOW:
            self._source = None  # found afresh next time: the sequence moves on meanwhile
            return ()
        tokens = self._copy(source, skip, drafted or longest)
        self._source, self._skip, self._draft, self._drafted_at = source, skip, len(tokens), self._n
        # where no draft pays, the copy is followed unverified (a shadow draft): the record
        # learns from the tokens the sequence samples all the same, and drafting starts once
        # the copy has shown it pays (else a sequence that never drafted never would)
        return tuple(int(t) for t in tokens) if drafted else ()

    def _realign(self) -> int | None:
        """Where a copy that broke off goes on, if it does: a rename replaces a word of the
        source by others, a list writes a listing's line breaks as `", "`, an edit drops or
        adds a token, and then the copy goes on. So for `_REALIGN` tokens after a break, the
        sequence's last token is looked for among the source's first `_REALIGN` tokens from
        where the copy broke; the copy resumes after it, and the miss at the break is taken
        back from the sequence's record. Where one source token was written as up to
        `_RENAME` others, they are drafted for it from then on before the same next token
        (`_renames`), and before any once it was written alike before two (`_anywhere`)."""
        if self._broke is None:
            return None
        broke, at = self._broke
        if self._n - at > _REALIGN:
            self._broke = None
            return None
        t, n = self._tokens, self._n
        window = t[broke : min(broke + _REALIGN, at)]
        found = np.flatnonzero(window == t[n - 1])
        if not found.size:
            return None
        self._broke = None
        self._misses = max(0.0, self._misses - 1.0)  # the copy goes on: its break is forgiven
        if found[0] == 1 and 1 <= n - 1 - at <= _RENAME:  # one token written as others
            token, written = int(t[broke]), tuple(int(x) for x in t[at : n - 1])
            if any(k[0] == token and w == written for k, w in self._renames.items()):
                self._anywhere[token] = written
            self._renames[token, int(t[broke + 1])] = written
            if self._indents is not None and len(written) == 1:
                self._shift = self._indents.shift(token, written[0]) or self._shift
        return broke + int(found[0]) + 1

    def _renamed(self, position: int) -> tuple[int, ...] | None:
        """What the sequence writes for the token at `position`, if it renames it."""
        if not self._rewriting:
            return None
        token = int(self._tokens[position])
        if position + 1 < self._n:
            written = self._renames.get((token, int(self._tokens[position + 1])))
            if written is not None:
                return written
        written = self._anywhere.get(token)
        if written is None and self._shift and self._indents is not None:
            wider = self._indents.shifted(token, self._shift)
            written = None if wider is None else (wider,)
        return written

    @property
    def _rewriting(self) -> bool:
        """The sequence writes some token of its sources as others (a rename, an indent)."""
        return bool(self._renames) or self._shift != 0

    def _copy(self, source: int, skip: int, length: int) -> np.ndarray:
        """The source's next `length` tokens (those there are) as the sequence writes them,
        from `source` with `skip` tokens of its rename written already."""
        if not self._rewriting:
            return self._tokens[source : min(source + length, self._n)]
        out: list[int] = []
        while len(out) < length and source < self._n:
            written = self._renamed(source) or (int(self._tokens[source]),)
            out.extend(written[skip:][: length - len(out)])
            source, skip = source + 1, 0
        return np.array(out, dtype=np.int32)

    def _after(self, source: int, skip: int, count: int) -> tuple[int, int]:
        """Where a copy from `source` (`skip` of its rename written) stands `count` tokens on:
        the position, and the tokens of its rename written already."""
        if not self._rewriting:
            return source + count, 0
        while count:
            size = len(self._renamed(source) or (0,))
            step = min(count, size - skip)
            count, skip = count - step, skip + step
            if skip == size:
                source, skip = source + 1, 0
        return source, skip

    def _run(self, source: int) -> int:
        """How many of the sequence's last tokens (up to `_RUN`) copy the tokens before
        `source`, each as the sequence writes it (a patch's context lines, each indented one
        space more than the file's, are one run, not a run a line)."""
        t, run, at, end = self._tokens, 0, source - 1, self._n - 1
        while run < _RUN and at >= 0:
            written = self._renamed(at)
            size = len(written) if written is not None else 0
            if (
                written is not None
                and size <= end + 1
                and tuple(t[end + 1 - size : end + 1]) == written
            ):
                run, end = run + size, end - size
            elif t[at] == t[end]:
                run, end = run + 1, end - 1
            else:
                break
            at -= 1
        return min(run, _RUN)

    def _settle(self) -> None:
        """Learn from the last draft what the sequence sampled after it, and fade the record."""
        n = self._n
        fade = _FADE ** (n - self._seen)
        self._hits, self._misses, self._seen = self._hits * fade, self._misses * fade, n
        if not self._draft:
            return
        source, skip, at, drafted = self._source, self._skip, self._drafted_at, self._draft
        assert source is not None
        came = self._tokens[at:n]
        copied = self._copy(source, skip, len(came))
        same = came[: len(copied)] == copied
        accepted = int(np.argmin(same)) if not same.all() else len(copied)
        missed, part = self._after(source, skip, accepted)  # where the copy stands there
        renamed = accepted < len(copied) and part == 0 and self._renamed(missed) is not None
        if renamed and came[accepted] == self._tokens[missed]:  # a rename not made this time
            token = int(self._tokens[missed])
            if missed + 1 < n:
                self._renames.pop((token, int(self._tokens[missed + 1])), None)
            self._anywhere.pop(token, None)
            indents, shift = self._indents, self._shift
            if shift and indents is not None and indents.shifted(token, shift) is not None:
                self._shift = 0  # an indent kept as it was
        # a verified draft ends at its first miss; a shadow one is met a token a pass
        self._hits += min(accepted, drafted)
        self._misses += accepted < min(drafted, len(came))
        if (weight := self._hits + self._misses) > _RECORD:
            self._hits, self._misses = (
                self._hits * _RECORD / weight,
                self._misses * _RECORD / weight,
            )
        self._draft = 0
        # still copying its source (the draft and what followed it): go on from there
        if accepted == len(came):
            self._source, self._skip = self._after(source, skip, len(came))
            self._copied += len(came)
            return
        self._source = None
        if self._copied + accepted >= _COPY:  # a copy broke off: a word replaced, perhaps
            self._broke = (missed, at + accepted)

    def _find(self) -> int | None:
        """Where the tokens after an earlier occurrence of the last `KEY` begin: of those
        whose tokens before the key also equal the sequence's (up to `_CONTEXT`), the one
        that shares the most; of equals, the most recent. A file's functions share their
        docstrings' first words, and the one being copied shares its name as well. A token
        the sequence writes for another wherever it recurs (`_anywhere`, an indent shift)
        matches that one too: after a patch's wider indent, the line is found in the file at
        once."""
        n, t = self._n, self._tokens
        if n <= KEY:
            return None
        alike = self._sources()
        match = alike(t[: n - KEY], t[n - KEY])
        for i in range(1, KEY):
            match &= alike(t[i : n - KEY + i], t[n - KEY + i])
        found = np.flatnonzero(match)
        back = 1
        while found.size > 1 and back <= min(_CONTEXT, n - KEY - 1):
            further = found[found >= back]
            further = further[alike(t[further - back], t[n - KEY - back])]
            if not further.size:
                break
            found, back = further, back + 1
        return int(found[-1]) + KEY if found.size else None

    def _sources(self) -> Callable[[np.ndarray, int], np.ndarray]:
        """Which of some tokens of the context the sequence's `token` copies: the equal ones,
        and those it writes as that one token wherever they recur."""
        by = {w[0]: k for k, w in self._anywhere.items() if len(w) == 1}
        if self._shift and self._indents is not None:
            by = {**self._indents.sources(self._shift), **by}
        if not by:
            return lambda tokens, token: tokens == token
        return lambda tokens, token: (tokens == token) | (tokens == by.get(int(token), token))

"""Continuous batching: many sequences decoded together, one forward pass per step.

A `Batcher` owns a model context that holds `parallel` sequences (slots). Each step it feeds the
context one pass: the last sampled token of every running sequence, or one chunk of a waiting
prompt (the two take turns, so a long prompt pauses running streams one chunk at a time).
Requests join between steps and leave when they end or are cancelled. A running sequence may
offer a draft of the tokens it expects next (`oars/engines/speculation.py`): that sequence then
gets a pass of its own in the step, its token and the draft as rows, and keeps what it accepts.

A slot keeps its sequence's tokens in the context after the request ends, so the next request
goes to the free slot sharing the longest prefix with its prompt and evaluates only the rest.
Long prompts are also kept on disk (`PrefixStore`) and loaded into a slot when that beats every
slot's own prefix: a new process serves a known agent prompt without evaluating it again.

The batcher knows nothing of sampling or text: a `Work` turns logits into its next token.
Masks of constrained sequences are computed while the forward pass runs (both leave the GIL).
What works send their clients during a step goes out by `flush`, called just before each
forward pass and before the thread waits for work (see `oars/engines/handover.py`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from oars.engines.prefix_store import PrefixStore, common_prefix
from oars.errors import EngineError, RateLimited

log = logging.getLogger("oars.engine")
passes = logging.getLogger("oars.engine.passes")  # a line a forward pass, at debug level


class Place:
    """An accepted request's place, held until its generation ends (or it is dropped)."""

    def __init__(self, release: Callable[[], None]) -> None:
        self._release: Callable[[], None] | None = release

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()


class Capacity:
    """Accepted requests: `parallel` running and `queue_depth` waiting. Past that, a 429;
    nothing accepted is ever dropped to make room."""

    def __init__(self, parallel: int, queue_depth: int) -> None:
        self.parallel, self.queue_depth = parallel, queue_depth
        self.accepted = 0
        self._lock = threading.Lock()

    def take(self) -> Place:
        with self._lock:
            if self.accepted >= self.parallel + self.queue_depth:
                raise RateLimited(
                    f"This server is at capacity ({self.parallel} generations running and "
                    f"{self.queue_depth} waiting); retry shortly.",
                    retry_after=1,
                )
            self.accepted += 1
        return Place(self._leave)

    def _leave(self) -> None:
        with self._lock:
            self.accepted -= 1


@dataclass(frozen=True)
class Feed:
    """Tokens of one sequence for one step, at positions `start`…; `output`: logits of the
    last one are wanted, and of each of the `drafted` before it (a draft being verified: the
    last `drafted` tokens are the draft)."""

    seq: int
    tokens: Sequence[int]
    start: int
    output: bool
    drafted: int = 0


class Context(Protocol):
    """A model context with one KV memory per sequence."""

    n_batch: int

    def decode(self, feeds: Sequence[Feed]) -> None:
        """One forward pass; `EngineError` if it failed (the fed sequences are then unknown)."""

    def logits(self, index: int) -> np.ndarray:
        """The logits of the `index`-th output of the last pass, valid (and the caller's to
        change in place) until the next pass."""

    def forget(self, seq: int, start: int) -> bool:
        """Drop a sequence's tokens from position `start` on; False if this memory cannot cut
        a sequence there (start 0 always works)."""

    def save(self, seq: int) -> bytes:
        """The sequence's state, to `load` into any slot later."""

    def load(self, seq: int, state: memoryview) -> bool:
        """Replace a sequence's state with a saved one; False if it did not fit."""


class Work(Protocol):
    """One request's generation, as the batcher sees it."""

    prompt: tuple[int, ...]
    reuse: bool  # may start from cached tokens (a seeded run evaluates its whole prompt)

    @property
    def cancelled(self) -> bool: ...

    def start(self, cached: int) -> None:
        """Admitted: the first `cached` prompt tokens are already in the context."""

    def before_step(self) -> Callable[[], object] | None:
        """Work to overlap with the forward pass that produces this sequence's next logits
        (computing its grammar mask), or None."""

    def step(self, logits: np.ndarray) -> int | None:
        """Choose the next token from its logits; None when the generation has ended."""

    def draft(self, crowded: bool) -> Sequence[int]:
        """Tokens it expects after the one it chose last, to verify in the same pass (see
        `oars/engines/speculation.py`); () for none. `crowded`: other sequences are running."""

    def fail(self, error: BaseException) -> None: ...


@dataclass(eq=False)
class Slot:
    seq: int
    tokens: list[int] = field(default_factory=list)  # what the context holds, in order
    work: Work | None = None
    pending: int | None = None  # sampled, not yet fed
    used: int = 0  # the step it was last given, for least-recently-used choice


def _runs(seqs: set[int]) -> int:
    """Runs of consecutive numbers in `seqs`: the graphs a pass of those sequences takes."""
    return sum(1 for seq in seqs if seq - 1 not in seqs)


# llama.cpp multiplies its K-quant weights by this many rows or more with another kernel than
# by fewer, so a token's logits depend on which side of it the graph that carries it falls.
KERNEL_ROWS = 8


def graphs(feeds: Sequence[tuple[int, int]], n_ubatch: int) -> list[tuple[list[int], int]]:
    """The graphs llama.cpp cuts a pass of (sequence, tokens) feeds into, over a memory of one
    stream per sequence (`split_equal` in its `llama-batch.cpp`): each takes, in batch order,
    a run of consecutive sequences in increasing order that have tokens left, and as many
    tokens of each as the shortest of them has left (and as fit `n_ubatch`). Each graph as
    its sequences and its tokens a sequence."""
    left = [[seq, n] for seq, n in feeds]
    out: list[tuple[list[int], int]] = []
    while any(n for _, n in left):
        chosen: list[list[int]] = []
        for feed in left:
            if feed[1] and (not chosen or feed[0] == chosen[-1][0] + 1):
                chosen.append(feed)
        take = max(1, min(min(n for _, n in chosen), n_ubatch // len(chosen)))
        out.append(([seq for seq, _ in chosen], take))
        for feed in chosen:
            feed[1] -= take
    return out


class Batcher:
    """Schedules works onto the context's slots; `run()` is its thread."""

    def __init__(
        self,
        context: Context,
        parallel: int,
        *,
        prefill_chunk: int = 256,
        prefix_store: PrefixStore | None = None,
        overlap: Executor | None = None,
        flush: Callable[[], None] | None = None,
    ) -> None:
        self.context = context
        self.slots = [Slot(seq) for seq in range(parallel)]
        self.prefill_chunk = max(1, min(prefill_chunk, context.n_batch))
        self.prefix_store = prefix_store
        self._overlap = overlap
        self._flush = flush or (lambda: None)
        self._waiting: deque[Work] = deque()
        self._wake = threading.Condition()
        self._admitted: list[Slot] = []  # running slots, oldest first (prefill goes in order)
        self._clock = 0
        self._prompt_turn = True
        self._last_pass_end = time.perf_counter()
        self.drafted = self.accepted = 0  # draft tokens verified, and accepted

    # ---- what other threads see -----------------------------------------------------

    def submit(self, work: Work) -> None:
        with self._wake:
            self._waiting.append(work)
            self._wake.notify()

    @property
    def running(self) -> int:
        return len(self._admitted)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def run(self) -> None:
        while True:
            with self._wake:
                while not self._waiting and not self._admitted:
                    self._flush()
                    self._wake.wait()
            try:
                self.step()
            except Exception:  # the thread must survive anything one step does
                log.exception("batch step failed")

    # ---- one step -------------------------------------------------------------------

    def step(self) -> None:
        """Admit what fits, feed one batch, sample each sequence that got logits. A sequence
        verifying a draft takes a pass of its own after the batch's: then its logits depend
        on its own tokens only, never on what runs beside it."""
        self._clock += 1
        self._drop_cancelled()
        self._admit()
        feeds, owners = self._plan()
        if not feeds:
            self._flush()
            return
        overlapped = self._start_overlap(owners, feeds)
        plain = [i for i, feed in enumerate(feeds) if not feed.drafted]
        passes = [plain] * bool(plain) + [[i] for i, feed in enumerate(feeds) if feed.drafted]
        for rows in passes:
            group, holders = [feeds[i] for i in rows], [owners[i] for i in rows]
            self._flush()  # the loops run while the model computes
            decoded = self._decode(group, holders, overlapped)
            overlapped = []
            if decoded:
                self._sample(group, holders)

    def _decode(
        self, feeds: list[Feed], owners: list[Slot], overlapped: list[Future[object]]
    ) -> bool:
        began = time.perf_counter()
        try:
            self.context.decode(feeds)
        except EngineError as exc:
            for slot in owners:
                self._fail(slot, exc)
            return False
        finally:
            for done in overlapped:
                done.result()
            self._account(feeds, began)
        return True

    def _sample(self, feeds: list[Feed], owners: list[Slot]) -> None:
        row = 0
        for feed, slot in zip(feeds, owners, strict=True):
            slot.tokens.extend(feed.tokens)
            slot.pending = None
            if not feed.output:
                continue
            first, row = row, row + 1 + feed.drafted
            work = slot.work
            if work is None:  # failed while overlapping
                continue
            prompt_done = len(slot.tokens) == len(work.prompt)
            try:
                token, accepted = self._verify(work, feed, first)
            except Exception as exc:
                log.exception("sampling failed")
                self._fail(slot, EngineError(f"generation failed: {exc}"))
                continue
            if accepted < feed.drafted and not self._cut(slot, feed, accepted):
                continue
            if prompt_done:
                self._keep_prefix(slot)
            if token is None:
                self._release(slot)
            else:
                slot.pending = token

    def _verify(self, work: Work, feed: Feed, first: int) -> tuple[int | None, int]:
        """Sample the fed rows in order while each sample is the draft's next token: the token
        chosen last, and how many draft tokens it accepted."""
        accepted = 0
        while True:
            token = work.step(self.context.logits(first + accepted))
            if accepted == feed.drafted or token != feed.tokens[1 + accepted]:
                break
            accepted += 1
        self.drafted += feed.drafted
        self.accepted += accepted
        return token, accepted

    def _cut(self, slot: Slot, feed: Feed, accepted: int) -> bool:
        """Drop the rejected draft tokens from the memory; False (the work failed) if it could
        not."""
        keep = feed.start + 1 + accepted
        del slot.tokens[keep:]
        if self.context.forget(slot.seq, keep):
            return True
        self._fail(slot, EngineError("generation failed: a draft could not be taken back"))
        return False

    def _account(self, feeds: list[Feed], began: float) -> None:
        """One debug line a pass (`bench.lab.account` reads them): what it fed
        (sequence:start+tokens), how long it took and how long since the last pass ended."""
        ended = time.perf_counter()
        if passes.isEnabledFor(logging.DEBUG):
            passes.debug(
                "pass feeds=%s ms=%.2f gap_ms=%.2f",
                ",".join(f"{f.seq}:{f.start}+{len(f.tokens)}" for f in feeds),
                (ended - began) * 1000,
                (began - self._last_pass_end) * 1000,
            )
        self._last_pass_end = ended

    def _plan(self) -> tuple[list[Feed], list[Slot]]:
        """This step's batch: the last token of every running sequence, in sequence order, or
        a chunk of the oldest waiting prompt (with those of other waiting prompts that can
        share its pass, `_prompt_pass`). The two take turns, so a long prompt pauses running
        streams one chunk at a time; but streams that have only their first token may wait
        for the prompts that end in their next chunk, so that requests arriving together
        decode together (fewer, fuller passes, as llama-server gets by evaluating their
        prompts in one call).

        llama.cpp computes a pass as one graph per run of consecutive sequences (with one
        memory per sequence), and a graph's cost is mostly fixed on the CPU: hence the order.

        A prompt is always cut at the same places (every `prefill_chunk` tokens from where its
        cache ends) and its chunks never share a pass with token rows. Then a sequence's
        logits do not depend on the rest of the batch: llama.cpp multiplies a K-quant matrix
        by `KERNEL_ROWS` rows or more with another kernel than by fewer, so a token must meet
        the weights in a graph on the same side of that bound whatever runs beside it (a
        prompt's tail fed beside token rows moved its logits by up to 0.4), and token rows
        stay below 8 at the default 4 sequences. So a request's text does not depend on the
        load."""
        tokens: list[Slot] = []
        prompts: list[Slot] = []
        for slot in self._admitted:
            (prompts if slot.pending is None else tokens).append(slot)
        if prompts and (not tokens or self._prompt_turn or self._may_wait(tokens, prompts[0])):
            self._prompt_turn = False
            return self._prompt_pass(prompts)
        self._prompt_turn = True
        tokens.sort(key=lambda slot: slot.seq)
        crowded = len(self._admitted) > 1
        feeds = []
        for slot in tokens:
            assert slot.work is not None and slot.pending is not None
            try:
                draft = tuple(slot.work.draft(crowded))
            except Exception:  # a draft is an offer: the token goes on without one
                log.exception("drafting failed")
                draft = ()
            feeds.append(Feed(slot.seq, (slot.pending, *draft), len(slot.tokens), True, len(draft)))
        return feeds, tokens

    def _prompt_pass(self, prompts: list[Slot]) -> tuple[list[Feed], list[Slot]]:
        """The next chunk of the oldest waiting prompt, and beside it the next chunks of other
        waiting prompts while they all fit in `prefill_chunk` tokens and every graph llama.cpp
        makes of the pass keeps `KERNEL_ROWS` rows or more, as each chunk of 8 tokens or more
        has alone. Then every token meets the weights through the same kernel as alone, and
        the logits are the same to the bit (`bench.lab.graphs`); four 60-token prompts take 4 %
        less time in one pass than in four. Chunks are still cut where they are alone."""

        def chunk(slot: Slot) -> Feed:
            assert slot.work is not None
            prompt, done = slot.work.prompt, len(slot.tokens)
            tokens = prompt[done : done + self.prefill_chunk]
            return Feed(slot.seq, tokens, done, done + len(tokens) == len(prompt))

        group = [(prompts[0], chunk(prompts[0]))]
        used = len(group[0][1].tokens)
        for slot in prompts[1:] if used >= KERNEL_ROWS else ():
            feed = chunk(slot)
            n = len(feed.tokens)
            if n < KERNEL_ROWS or used + n > self.prefill_chunk:
                continue
            trial = sorted([(f.seq, len(f.tokens)) for _, f in group] + [(feed.seq, n)])
            cut = graphs(trial, self.context.n_batch)
            if all(len(seqs) * take >= KERNEL_ROWS for seqs, take in cut):
                group.append((slot, feed))
                used += n
        group.sort(key=lambda pair: pair[0].seq)
        return [feed for _, feed in group], [slot for slot, _ in group]

    def _may_wait(self, tokens: list[Slot], prompt: Slot) -> bool:
        """Every running stream has only its first token (sent already), and the prompt ends
        in its next chunk."""
        assert prompt.work is not None
        fresh = all(s.work is not None and len(s.tokens) == len(s.work.prompt) for s in tokens)
        return fresh and len(prompt.work.prompt) - len(prompt.tokens) <= self.prefill_chunk

    def _start_overlap(self, owners: list[Slot], feeds: list[Feed]) -> list[Future[object]]:
        if self._overlap is None:
            return []
        jobs = []
        for feed, slot in zip(feeds, owners, strict=True):
            if feed.output and slot.work is not None:
                job = slot.work.before_step()
                if job is not None:
                    jobs.append(self._overlap.submit(job))
        return jobs

    # ---- slots ----------------------------------------------------------------------

    def _admit(self) -> None:
        while True:
            free = [slot for slot in self.slots if slot.work is None]
            with self._wake:
                if not free or not self._waiting:
                    return
                work = self._waiting.popleft()
            if work.cancelled:
                continue
            self._place(work, free)

    def _place(self, work: Work, free: list[Slot]) -> None:
        """Put a work on the free slot whose tokens share the longest prefix with its prompt,
        or on a prefix kept on disk if that is longer. Among equals, the slot next to running
        sequences (llama.cpp runs a pass as one graph per run of consecutive sequences: two
        streams on sequences 0 and 2 took 15 % longer a pass than on 0 and 1), then the least
        recently used."""
        prompt = work.prompt
        shared = [common_prefix(s.tokens, prompt) if work.reuse else 0 for s in free]
        running = {slot.seq for slot in self._admitted}
        runs = [_runs(running | {slot.seq}) for slot in free]
        best = max(range(len(free)), key=lambda i: (shared[i], -runs[i], -free[i].used))
        slot, cached = free[best], shared[best]
        if work.reuse and self.prefix_store is not None:
            cached = self._from_disk(slot, prompt, cached)
        if not self.context.forget(slot.seq, cached):
            self.context.forget(slot.seq, 0)
            cached = 0
        del slot.tokens[cached:]
        slot.work, slot.pending, slot.used = work, None, self._clock
        self._admitted.append(slot)
        try:
            work.start(cached)
        except Exception as exc:
            log.exception("could not start a generation")
            self._fail(slot, EngineError(f"generation failed: {exc}"))

    def _from_disk(self, slot: Slot, prompt: tuple[int, ...], cached: int) -> int:
        assert self.prefix_store is not None
        found = self.prefix_store.find(prompt, better_than=cached)
        if found is None:
            return cached
        tokens, state = found
        if state is None or not self.context.load(slot.seq, state):
            log.warning("a kept prefix could not be loaded; evaluating the prompt")
            self.context.forget(slot.seq, 0)
            slot.tokens.clear()
            return 0
        slot.tokens[:] = tokens
        return common_prefix(tokens, prompt)

    def _keep_prefix(self, slot: Slot) -> None:
        """A prompt just fully evaluated: keep it on disk if it is long and new."""
        store = self.prefix_store
        if store is not None and store.wants(slot.tokens):
            self._flush()  # its first token goes out while the memory is copied
            store.put(tuple(slot.tokens), self.context.save(slot.seq))

    def _drop_cancelled(self) -> None:
        for slot in list(self._admitted):
            if slot.work is not None and slot.work.cancelled:
                self._release(slot)

    def _release(self, slot: Slot) -> None:
        """The work is over; its tokens stay in the context for the next prompt that shares
        them (a sampled token not yet fed is not among them)."""
        slot.work, slot.pending = None, None
        self._admitted.remove(slot)

    def _fail(self, slot: Slot, error: BaseException) -> None:
        work = slot.work
        if work is not None:
            self._release(slot)
            work.fail(error)
        self.context.forget(slot.seq, 0)  # what the failed pass left is unknown
        slot.tokens.clear()

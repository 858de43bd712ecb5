"""The batcher on a fake model context: slots, chunked prompts, prefix reuse, cancellation,
prompts kept on disk, and the bound on accepted requests."""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from oars.engines.batching import Batcher, Capacity, Feed, graphs
from oars.engines.prefix_store import PrefixStore, common_prefix
from oars.errors import EngineError, RateLimited

VOCAB = 50


class FakeContext:
    """A 'model' whose next token is a function of a sequence's whole history, with one KV
    memory per sequence that checks every position it is fed."""

    def __init__(self, n_seq: int, n_batch: int = 64, *, cut: bool = True) -> None:
        self.n_batch = n_batch
        self.memory: list[list[int]] = [[] for _ in range(n_seq)]
        self.passes: list[list[Feed]] = []
        self.loads = 0
        self._cut = cut
        self._outputs: list[np.ndarray] = []

    def decode(self, feeds: Sequence[Feed]) -> None:
        assert sum(len(f.tokens) for f in feeds) <= self.n_batch
        self.passes.append(list(feeds))
        self._outputs = []
        for feed in feeds:
            held = self.memory[feed.seq]
            assert feed.start == len(held), "fed at a position the memory does not follow"
            held.extend(feed.tokens)
            if feed.output:  # a row for the last token and each draft token before it
                for end in range(len(held) - feed.drafted, len(held) + 1):
                    logits = np.zeros(VOCAB, dtype=np.float32)
                    logits[(sum(held[:end]) * 7 + end) % VOCAB] = 1.0
                    self._outputs.append(logits)

    def logits(self, index: int) -> np.ndarray:
        return self._outputs[index].copy()

    def forget(self, seq: int, start: int) -> bool:
        if start and not self._cut:
            return False
        del self.memory[seq][start:]
        return True

    def save(self, seq: int) -> bytes:
        return np.asarray(self.memory[seq], dtype=np.int32).tobytes()

    def load(self, seq: int, state: memoryview) -> bool:
        self.loads += 1
        self.memory[seq] = np.frombuffer(state, dtype=np.int32).tolist()
        return True

    def fed(self, seq: int) -> list[tuple[int, int]]:
        """(start, length) of each prompt chunk (more than one token) fed to a sequence."""
        return [
            (f.start, len(f.tokens))
            for p in self.passes
            for f in p
            if f.seq == seq and len(f.tokens) > 1
        ]


@dataclass(eq=False)
class FakeWork:
    prompt: tuple[int, ...]
    length: int = 5
    reuse: bool = True
    output: list[int] = field(default_factory=list)
    cached: int | None = None
    errors: list[BaseException] = field(default_factory=list)
    cancel: threading.Event = field(default_factory=threading.Event)
    submitted: bool = False

    @property
    def cancelled(self) -> bool:
        return self.cancel.is_set()

    @property
    def done(self) -> bool:
        return len(self.output) >= self.length or bool(self.errors)

    def start(self, cached: int) -> None:
        self.cached = cached

    def before_step(self) -> Callable[[], object] | None:
        return None

    def step(self, logits: np.ndarray) -> int | None:
        self.output.append(int(np.argmax(logits)))
        return None if self.done else self.output[-1]

    def draft(self, crowded: bool) -> tuple[int, ...]:
        return ()

    def fail(self, error: BaseException) -> None:
        self.errors.append(error)


def run(batcher: Batcher, works: Sequence[FakeWork], limit: int = 500) -> None:
    """Submit the works not yet submitted, and step until all have ended."""
    for work in works:
        if not work.submitted:
            submit(batcher, work)
    for _ in range(limit):
        if all(w.done or w.cancelled for w in works):
            return
        batcher.step()
    raise AssertionError("the works did not finish")


def submit(batcher: Batcher, work: FakeWork) -> None:
    work.submitted = True
    batcher.submit(work)


def prompt(seed: int, n: int) -> tuple[int, ...]:
    return tuple(int(x) for x in np.random.default_rng(seed).integers(0, VOCAB, n))


def alone(work: FakeWork, prefill_chunk: int = 256) -> tuple[list[int], list[tuple[int, int]]]:
    context = FakeContext(4)
    run(Batcher(context, 4, prefill_chunk=prefill_chunk), [work])
    return work.output, context.fed(0)


def test_each_sequence_gets_what_it_gets_alone_and_is_cut_at_the_same_places() -> None:
    prompts = [prompt(i, 30 + 40 * i) for i in range(4)]
    lone = [alone(FakeWork(p, length=40), prefill_chunk=32) for p in prompts]
    context = FakeContext(4)
    batcher = Batcher(context, 4, prefill_chunk=32)
    works = [FakeWork(p, length=40) for p in prompts]
    for work in works:  # they arrive while the others run
        submit(batcher, work)
        batcher.step()
        batcher.step()
    run(batcher, works)
    for seq, (work, (output, chunks)) in enumerate(zip(works, lone, strict=True)):
        assert work.output == output
        assert context.fed(seq) == chunks
    # chunks go through the model alone; token rows share passes
    assert all(len(p) == 1 for p in context.passes if any(len(f.tokens) > 1 for f in p))
    assert max(len(p) for p in context.passes) == 4


def test_requests_arriving_together_decode_together_in_sequence_order() -> None:
    """Four prompts that each fit a chunk: their chunks first, each alone, then one pass of
    the four tokens, whatever slots they took; a token row waits no longer than that."""
    context = FakeContext(4)
    batcher = Batcher(context, 4, prefill_chunk=32)
    works = [FakeWork(prompt(i, n), length=6) for i, n in enumerate((20, 18, 25, 30))]
    for work in reversed(works):
        submit(batcher, work)
    for _ in range(5):
        batcher.step()
    shapes = [[(f.seq, len(f.tokens)) for f in p] for p in context.passes]
    assert shapes[:4] == [[(0, 30)], [(1, 25)], [(2, 18)], [(3, 20)]]
    assert shapes[4] == [(0, 1), (1, 1), (2, 1), (3, 1)]
    run(batcher, works)
    for work in works:
        assert work.output == alone(FakeWork(work.prompt, length=6))[0]


def _first_pass_shapes(lengths: tuple[int, ...], prefill_chunk: int) -> list[list[tuple[int, int]]]:
    """Prompts of `lengths` waiting together: the prompt passes, as (sequence, tokens) feeds."""
    context = FakeContext(4, n_batch=256)
    batcher = Batcher(context, 4, prefill_chunk=prefill_chunk)
    works = [FakeWork(prompt(i, n), length=3) for i, n in enumerate(lengths)]
    run(batcher, works)
    for work in works:
        assert work.output == alone(FakeWork(work.prompt, length=3), prefill_chunk)[0]
    return [[(f.seq, len(f.tokens)) for f in p] for p in context.passes if len(p[0].tokens) > 1]


@pytest.mark.parametrize(
    ("lengths", "chunk", "shapes"),
    [
        # one graph of 4 x 10 rows
        ((10, 10, 10, 10), 64, [[(0, 10), (1, 10), (2, 10), (3, 10)]]),
        # 2 x 10 rows, then the longer one's last 20 alone: every graph 8 rows or more
        ((10, 30), 64, [[(0, 10), (1, 30)]]),
        # 2 x 10 rows would leave a graph of 1 row: each alone
        ((10, 11), 64, [[(0, 10)], [(1, 11)]]),
        # a chunk under 8 tokens is under 8 rows alone: it stays alone
        ((5, 5), 64, [[(0, 5)], [(1, 5)]]),
        # at most `prefill_chunk` tokens a pass: the third waits
        ((20, 20, 20), 48, [[(0, 20), (1, 20)], [(2, 20)]]),
        # a chunk that fills the pass goes alone, and so does a remainder under 8 tokens
        ((70, 10), 64, [[(0, 64)], [(0, 6)], [(1, 10)]]),
    ],
)
def test_waiting_prompts_share_a_pass_where_every_graph_keeps_8_rows(
    lengths: tuple[int, ...], chunk: int, shapes: list[list[tuple[int, int]]]
) -> None:
    """Each prompt's chunks are cut where they are cut alone, each request gets what it gets
    alone, and a pass of prompts leaves llama.cpp no graph of fewer than 8 rows."""
    assert _first_pass_shapes(lengths, chunk) == shapes


def test_the_graphs_of_a_pass_are_llama_cpp_s() -> None:
    assert graphs([(0, 10), (1, 30)], 512) == [([0, 1], 10), ([1], 20)]
    assert graphs([(0, 1), (2, 1), (1, 1)], 512) == [([0, 1], 1), ([2], 1)]
    assert graphs([(0, 300), (1, 300)], 512) == [([0, 1], 256), ([0, 1], 44)]


def test_a_prompt_of_several_chunks_does_not_hold_back_first_tokens() -> None:
    context = FakeContext(2)
    batcher = Batcher(context, 2, prefill_chunk=16)
    works = [FakeWork(prompt(1, 10), length=4), FakeWork(prompt(2, 40), length=4)]
    for work in works:
        submit(batcher, work)
    for _ in range(4):
        batcher.step()
    kinds = [[(f.seq, len(f.tokens)) for f in p] for p in context.passes]
    # the short prompt, then its stream's tokens and the long prompt's chunks in turn
    assert kinds == [[(0, 10)], [(0, 1)], [(1, 16)], [(0, 1)]]


def test_a_long_prompt_pauses_running_streams_one_chunk_at_a_time() -> None:
    context = FakeContext(2)
    batcher = Batcher(context, 2, prefill_chunk=16)
    short, long = FakeWork(prompt(1, 5), length=40), FakeWork(prompt(2, 160), length=3)
    submit(batcher, short)
    batcher.step()
    submit(batcher, long)
    run(batcher, [short, long])
    assert context.fed(1) == [(i, 16) for i in range(0, 160, 16)]
    # between two chunks of the long prompt, the short one got a token
    kinds = ["chunk" if len(p[0].tokens) > 1 else "token" for p in context.passes[1:]]
    first, last = kinds.index("chunk"), len(kinds) - 1 - kinds[::-1].index("chunk")
    assert kinds[first : last + 1] == ["chunk", "token"] * 9 + ["chunk"]


def test_a_request_goes_to_the_slot_holding_its_prefix_and_cached_is_exact() -> None:
    context = FakeContext(3)
    batcher = Batcher(context, 3)
    system = prompt(3, 40)
    first = FakeWork(system + prompt(4, 10))
    other = FakeWork(prompt(5, 30))
    run(batcher, [first])
    run(batcher, [other])
    seq_of_first = next(s.seq for s in batcher.slots if s.tokens[:40] == list(system))
    again = FakeWork(system + prompt(6, 12))
    submit(batcher, again)
    batcher.step()
    assert again.cached == 40 == common_prefix(first.prompt, again.prompt)
    assert context.memory[seq_of_first][:40] == list(system)
    assert context.fed(seq_of_first)[-1] == (40, 12)  # only the new part is evaluated
    run(batcher, [again])
    assert again.output == alone(FakeWork(again.prompt, reuse=False))[0]


def test_a_new_request_takes_the_free_slot_next_to_the_running_ones() -> None:
    """Sequences 1 and 3 free, 0 and 2 running: the new one goes to 1, though 3 was used
    longer ago, so a pass runs its three sequences as one graph (0-2), not two (0, 2-3)."""
    context = FakeContext(4)
    batcher = Batcher(context, 4)
    works = [FakeWork(prompt(10 + i, 8), length=3 if i % 2 else 30) for i in range(4)]
    for work in works:
        submit(batcher, work)
    while not (works[1].done and works[3].done):
        batcher.step()
    assert sorted(s.seq for s in batcher.slots if s.work is not None) == [0, 2]
    for tail in range(2):  # the first token of the free slots' prompts decides nothing
        assert not common_prefix(batcher.slots[2 * tail + 1].tokens, prompt(21, 8))
    batcher.slots[1].used, batcher.slots[3].used = batcher.slots[3].used + 1, 0
    newcomer = FakeWork(prompt(21, 8), length=3)
    submit(batcher, newcomer)
    batcher.step()
    assert [s.seq for s in batcher.slots if s.work is newcomer] == [1]
    batcher.step()  # after its prompt, a pass of the three tokens
    assert [f.seq for f in context.passes[-1]] == [0, 1, 2]
    run(batcher, [*works, newcomer])


def test_an_identical_prompt_still_feeds_its_last_token() -> None:
    context = FakeContext(1)
    batcher = Batcher(context, 1)
    p = prompt(7, 20)
    run(batcher, [FakeWork(p)])
    work = FakeWork(p)
    run(batcher, [work])
    assert work.cached == 19


def test_seeded_work_evaluates_its_whole_prompt() -> None:
    context = FakeContext(1)
    batcher = Batcher(context, 1)
    p = prompt(8, 20)
    run(batcher, [FakeWork(p)])
    work = FakeWork(p, reuse=False)
    run(batcher, [work])
    assert work.cached == 0


def test_a_memory_that_cannot_cut_a_sequence_starts_it_over() -> None:
    context = FakeContext(1, cut=False)
    batcher = Batcher(context, 1)
    run(batcher, [FakeWork(prompt(9, 20))])
    work = FakeWork((*prompt(9, 20), 1, 2))
    run(batcher, [work])
    assert work.cached == 0
    assert work.output == alone(FakeWork(work.prompt))[0]


def test_a_cancelled_request_frees_its_slot_for_the_next() -> None:
    context = FakeContext(1)
    batcher = Batcher(context, 1)
    running, waiting = FakeWork(prompt(10, 8), length=1000), FakeWork(prompt(11, 8))
    submit(batcher, running)
    submit(batcher, waiting)
    for _ in range(5):
        batcher.step()
    assert len(running.output) > 1 and waiting.cached is None  # waiting for the only slot
    running.cancel.set()
    produced = len(running.output)
    run(batcher, [waiting])
    assert len(running.output) == produced and not running.errors
    assert batcher.running == 0 and batcher.waiting == 0


def test_a_cancelled_request_that_never_ran_is_skipped() -> None:
    batcher = Batcher(FakeContext(1), 1)
    skipped, next_one = FakeWork(prompt(12, 8)), FakeWork(prompt(13, 8))
    skipped.cancel.set()
    submit(batcher, skipped)
    submit(batcher, next_one)
    run(batcher, [next_one])
    assert skipped.cached is None and next_one.done


def test_a_failed_pass_fails_its_sequences_and_the_batcher_goes_on() -> None:
    class Failing(FakeContext):
        def decode(self, feeds: Sequence[Feed]) -> None:
            if any(f.seq == 0 and f.start > 10 for f in feeds):
                raise EngineError("boom")
            super().decode(feeds)

    context = Failing(2)
    batcher = Batcher(context, 2)
    doomed = FakeWork(prompt(14, 10), length=50)
    run(batcher, [doomed])
    assert isinstance(doomed.errors[0], EngineError)
    assert context.memory[0] == [] and batcher.running == 0
    after = FakeWork(prompt(15, 5))
    run(batcher, [after])
    assert after.done and not after.errors


def test_long_prompts_are_kept_on_disk_and_start_a_new_process(tmp_path: Path) -> None:
    instructions = prompt(16, 300)
    first = FakeWork(instructions + prompt(17, 20))
    store = PrefixStore(tmp_path, "m", max_bytes=10**6, min_tokens=100)
    run(Batcher(FakeContext(2), 2, prefix_store=store), [first])
    store.flush()
    assert len(store) == 1
    # a new process: nothing in memory, the same folder
    context = FakeContext(2)
    batcher = Batcher(
        context, 2, prefix_store=PrefixStore(tmp_path, "m", max_bytes=10**6, min_tokens=100)
    )
    second = FakeWork(instructions + prompt(18, 25))
    run(batcher, [second])
    assert context.loads == 1 and second.cached == 300
    assert context.fed(0) == [(300, 25)]
    assert second.output == alone(FakeWork(second.prompt, reuse=False))[0]


def test_a_kept_prompt_s_first_token_goes_out_before_its_memory_is_copied(
    tmp_path: Path,
) -> None:
    timeline: list[str] = []

    class Saving(FakeContext):
        def save(self, seq: int) -> bytes:
            timeline.append("save")
            return super().save(seq)

    class Emitting(FakeWork):
        def step(self, logits: np.ndarray) -> int | None:
            timeline.append("emit")
            return super().step(logits)

    store = PrefixStore(tmp_path, "m", max_bytes=10**6, min_tokens=100)
    batcher = Batcher(Saving(1), 1, prefix_store=store, flush=lambda: timeline.append("flush"))
    run(batcher, [Emitting(prompt(19, 150), length=2)])
    store.flush()
    assert len(store) == 1
    assert timeline[timeline.index("save") - 2 :][:3] == ["emit", "flush", "save"]


def test_the_disk_is_used_only_when_it_beats_a_slot(tmp_path: Path) -> None:
    store = PrefixStore(tmp_path, "m", max_bytes=10**6, min_tokens=100)
    context = FakeContext(1)
    batcher = Batcher(context, 1, prefix_store=store)
    p = prompt(19, 200)
    run(batcher, [FakeWork(p)])
    store.flush()
    work = FakeWork((*p, 3))
    run(batcher, [work])
    assert context.loads == 0 and work.cached == 200


def test_a_prompt_mostly_covered_by_a_kept_one_is_not_kept_again(tmp_path: Path) -> None:
    store = PrefixStore(tmp_path, "m", max_bytes=10**6, min_tokens=100)
    base = prompt(20, 300)
    assert store.wants(list(base))
    store.put(base, b"x")
    store.flush()
    assert not store.wants(list(base + prompt(21, 100)))
    assert store.wants(list(base + prompt(21, 400)))  # the kept part is under half
    assert not store.wants(list(prompt(22, 99)))  # too short


def test_the_store_stays_under_its_bound_least_recently_used_out(tmp_path: Path) -> None:
    store = PrefixStore(tmp_path, "m", max_bytes=2000, min_tokens=10)  # 912 bytes each
    a, b, c = prompt(23, 100), prompt(24, 100), prompt(25, 100)
    store.put(a, b"a" * 500)
    store.flush()
    store.put(b, b"b" * 500)
    store.flush()
    assert store.find((*a, 1)) is not None  # a is now the most recently used
    store.put(c, b"c" * 500)
    store.flush()
    assert store.size <= 2000 and len(store) == 2
    assert store.find((*b, 1)) is None
    found = store.find((*a, 1))
    assert (
        found is not None
        and found[0] == list(a)
        and found[1] is not None
        and bytes(found[1]) == b"a" * 500
    )


def _kept(root: Path) -> dict[str, str]:
    """What each kept state under the root holds (its filler byte), by folder."""
    return {p.read_bytes()[-1:].decode(): p.parent.name for p in root.glob("*/*.kv")}


def test_the_bound_covers_what_other_models_and_runtimes_left_under_the_root(
    tmp_path: Path,
) -> None:
    old = PrefixStore(tmp_path, "old", max_bytes=10**6, min_tokens=10)  # 912 bytes each
    for n, fill in ((28, b"o"), (29, b"p")):
        old.put(prompt(n, 100), fill * 500)
        old.flush()
    (first,) = (p for p in (tmp_path / "old").glob("*.kv") if p.read_bytes().endswith(b"o"))
    os.utime(first, (time.time() - 60, time.time() - 60))  # used a minute before the other
    # a new runtime, in a folder of its own, with room for two states under the root
    new = PrefixStore(tmp_path, "new", max_bytes=2000, min_tokens=10)
    assert _kept(tmp_path) == {"o": "old", "p": "old"}
    new.put(prompt(30, 100), b"n" * 500)
    new.flush()
    assert _kept(tmp_path) == {"p": "old", "n": "new"}  # the least recently used went
    # another process with the old runtime uses its state now: this store's own goes first
    (survivor,) = (tmp_path / "old").glob("*.kv")
    later = time.time() + 10
    os.utime(survivor, (later, later))
    new.put(prompt(31, 100), b"m" * 500)
    new.flush()
    assert _kept(tmp_path) == {"p": "old", "m": "new"} and len(new) == 1
    # a restart with a smaller bound trims at once; an emptied folder goes
    PrefixStore(tmp_path, "new", max_bytes=1000, min_tokens=10)
    assert _kept(tmp_path) == {"p": "old"}
    newer = PrefixStore(tmp_path, "newer", max_bytes=500, min_tokens=10)
    assert _kept(tmp_path) == {} and sorted(p.name for p in tmp_path.iterdir()) == ["newer"]
    # the "new" store's process still runs: its folder comes back with its next state
    new.put(prompt(35, 10), b"q")
    new.flush()
    assert _kept(tmp_path) == {"q": "new"} and len(newer) == 0


def test_a_state_another_process_deleted_no_longer_counts_against_the_bound(
    tmp_path: Path,
) -> None:
    store = PrefixStore(tmp_path, "m", max_bytes=2000, min_tokens=10)  # 912 bytes each
    for n, fill in ((32, b"a"), (33, b"b")):
        store.put(prompt(n, 100), fill * 500)
        store.flush()
    # another server sharing the folder made room: the newer state is gone
    (gone,) = (p for p in (tmp_path / "m").glob("*.kv") if p.read_bytes().endswith(b"b"))
    gone.unlink()
    store.put(prompt(34, 100), b"c" * 500)
    store.flush()
    assert _kept(tmp_path) == {"a": "m", "c": "m"} and len(store) == 2


def test_what_another_process_with_the_same_key_keeps_counts_too(tmp_path: Path) -> None:
    first = PrefixStore(tmp_path, "m", max_bytes=2000, min_tokens=10)  # 912 bytes each
    second = PrefixStore(tmp_path, "m", max_bytes=2000, min_tokens=10)  # a replica beside it
    first.put(prompt(36, 100), b"x" * 500)
    first.flush()
    for n, fill in ((37, b"y"), (38, b"z")):
        second.put(prompt(n, 100), fill * 500)
        second.flush()
    assert _kept(tmp_path) == {"y": "m", "z": "m"} and len(second) == 2


def test_unreadable_and_partial_files_are_dropped_at_start(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m/junk.kv").write_bytes(b"not a state")
    (tmp_path / "m/torn.partial").write_bytes(b"half")
    store = PrefixStore(tmp_path, "m", max_bytes=10**6)
    assert len(store) == 0 and not list((tmp_path / "m").iterdir())


def test_past_running_and_waiting_requests_a_429_with_retry_after() -> None:
    capacity = Capacity(parallel=2, queue_depth=1)
    places = [capacity.take() for _ in range(3)]
    with pytest.raises(RateLimited) as refused:
        capacity.take()
    assert refused.value.status == 429 and refused.value.headers == {"Retry-After": "1"}
    places[0].release()
    places[0].release()  # a place is given back once
    assert capacity.accepted == 2
    capacity.take()
    with pytest.raises(RateLimited):
        capacity.take()


def test_a_kept_state_is_mapped_for_the_context_and_never_written_back(tmp_path: Path) -> None:
    store = PrefixStore(tmp_path, "m", max_bytes=10**6, min_tokens=10)
    kept = prompt(26, 100)
    store.put(kept, b"s" * 400)
    store.flush()
    store.prefetch((*kept, 1))  # reads ahead; nothing to see but that it is harmless
    store.prefetch(prompt(27, 100))
    found = store.find((*kept, 1))
    assert found is not None and found[1] is not None
    state = found[1]
    view = (ctypes.c_uint8 * len(state)).from_buffer(state)  # what LlamaContext.load does
    assert bytes(view) == b"s" * 400
    view[0] = ord("X")  # a private mapping: the file keeps its bytes
    del view, state, found
    again = store.find((*kept, 1))
    assert again is not None and again[1] is not None and bytes(again[1]) == b"s" * 400


def test_what_a_step_emits_goes_out_just_before_the_next_pass_or_when_the_batcher_idles() -> None:
    """Works emit while they sample; `flush` (one wake-up of each loop) comes right before the
    next forward pass, so the loop runs while the model computes, and once more before the
    thread waits for work, so the last tokens are not held."""
    timeline: list[str] = []

    class Recording(FakeContext):
        def decode(self, feeds: Sequence[Feed]) -> None:
            timeline.append("pass")
            super().decode(feeds)

    class Emitting(FakeWork):
        def step(self, logits: np.ndarray) -> int | None:
            timeline.append("emit")
            return super().step(logits)

    batcher = Batcher(Recording(2), 2, flush=lambda: timeline.append("flush"))
    works: list[FakeWork] = [Emitting(prompt(40, 6), length=3), Emitting(prompt(41, 6), length=3)]
    run(batcher, works)
    # prompt A, prompt B (A's stream has only its first token), then A's and B's tokens twice
    assert " ".join(timeline) == (
        "flush pass emit  flush pass emit  flush pass emit emit  flush pass emit emit"
    ).replace("  ", " ")
    thread = threading.Thread(target=batcher.run, daemon=True)
    thread.start()  # nothing to do: it sends what is left and waits
    deadline = time.monotonic() + 5
    while timeline[-1] != "flush" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert timeline[-1] == "flush"

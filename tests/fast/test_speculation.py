"""Speculative decoding without a model: what a sequence drafts and when (`Drafter`, the pass-cost
curve), and the batcher verifying drafts on a fake context, where a rejected draft must leave
the memory exactly as if it had never been fed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from oars.engines.batching import Batcher, Feed
from oars.engines.speculation import _PROBE_REPS, MAX_DRAFT, Drafter, Indents, PassCost
from tests.fast.test_batching import VOCAB, FakeContext, FakeWork, prompt, run

FLAT = PassCost.flat()  # a GPU's: extra rows cost nothing
# two CPU cores' (bench.lab.speculation): 2 rows 1.70× one row, 8 rows 4.48×
CPU = PassCost((1.0, 1.70, 2.69, 2.43, 3.34, 3.02, 4.17, 4.48))
# what `oars serve` measured at startup there: the median of 20 starts, and the dearest
STARTUP = PassCost((1.0, 2.09, 3.23, 2.72, 3.69, 3.34, 4.46, 5.01))
DEAREST = PassCost((1.0, 2.07, 3.44, 3.15, 4.55, 3.54, 4.33, 6.11))
# a later start's, where no draft pays at the prior (a bench run drafted nothing)
SHUNNED = PassCost((1.0, 1.99, 2.93, 2.88, 3.61, 3.95, 4.49, 5.78))


def drafter(tokens: list[int], cost: PassCost = FLAT) -> Drafter:
    return Drafter(tokens, 1000, cost)


def test_a_draft_is_what_followed_the_most_recent_match_of_the_last_three_tokens() -> None:
    tokens = [
        60,
        50,
        51,
        1,
        2,
        3,
        4,
        5,
        6,
        9,
        60,
        50,
        51,
        1,
        2,
        3,
        7,
        8,
        9,
        40,
        60,
        50,
        51,
        1,
        2,
        3,
    ]
    assert drafter(tokens).draft(4) == (7, 8, 9, 40)
    assert drafter(tokens).draft(2) == (7, 8)
    # a match of two tokens is not one: chat drafted on nearly every pass with short keys
    assert drafter([1, 2, 3, 4, 5, 2, 3]).draft(4) == ()
    assert drafter([5, 6, 7, 8]).draft(4) == ()


def test_a_draft_is_no_longer_than_the_run_its_source_shares_with_the_end() -> None:
    # just the key: one token, even where rows are free
    assert drafter([1, 2, 3, 4, 5, 9, 1, 2, 3]).draft(MAX_DRAFT) == (4,)
    assert drafter([8, 1, 2, 3, 4, 5, 6, 9, 7, 8, 1, 2, 3]).draft(MAX_DRAFT) == (4, 5)
    # on two cores a lone token does not pay, and a run of 6 pays three
    assert drafter([1, 2, 3, 4, 5, 9, 1, 2, 3], CPU).draft(MAX_DRAFT) == ()
    copy = [*range(20, 30), 0, *range(20, 26)]
    assert drafter(copy, CPU).draft(MAX_DRAFT) == (26, 27, 28)


def test_a_match_too_short_to_draft_from_is_looked_for_again_next_token() -> None:
    d = drafter([1, 2, 3, 4, 5, 6, 7, 8, 40, 41, 3, 4, 5], CPU)
    assert d.draft(MAX_DRAFT) == ()  # (3, 4, 5) matches, but only the key: nothing pays
    for token in (6, 7, 8):  # the sequence went on copying that match
        d.add(token)
    assert d.draft(MAX_DRAFT) == (40, 41, 3)  # a run of 6 behind it: 3 tokens pay


def test_a_reply_saying_its_own_words_again_drafts_from_them_only_after_a_long_run() -> None:
    phrase = list(range(1, 10))
    # in the prompt, the key alone drafts a token where rows are free
    assert drafter([*phrase, 50, 1, 2, 3]).draft(4) == (4,)
    # in the sequence's own output, nothing until 8 tokens match
    d = drafter([50])
    for token in [*phrase, 60, 1, 2, 3]:
        d.add(token)
    assert d.draft(4) == ()
    for token in (4, 5, 6, 7):
        d.add(token)
        assert d.draft(4) == ()
    d.add(8)
    assert d.draft(4) == (9, 60, 1, 2)


def test_a_draft_follows_its_source_while_the_sequence_copies_it() -> None:
    tokens = [70, 71, 72, 1, 2, 3, 4, 5, 6, 7, 8, 20, 5, 6, 7, 30, 21, 70, 71, 72, 1, 2, 3]
    d = drafter(tokens)
    assert d.draft(3) == (4, 5, 6)
    for token in (4, 5, 6, 7):  # the draft accepted, and the token after it is the source's
        d.add(token)
    # the source goes on with 8; a fresh match of (5, 6, 7) would have said 30
    assert d.draft(3) == (8, 20, 5)
    for token in (8, 99):  # a miss: back to matching the last tokens
        d.add(token)
    assert d.draft(3) == ()  # (7, 8, 99) was never seen


def sample(d: Drafter, truth: list[int]) -> tuple[int, int, int]:
    """`truth` sampled by a sequence drafting as the batcher drafts: a draft each pass, its
    tokens kept up to the first that differs from the truth, and the truth's next token. How
    many passes it took, how many drafts were made, and how many missed."""
    passes = drafts = misses = at = 0
    while at < len(truth):
        draft = d.draft(MAX_DRAFT)
        n = 0
        while n < len(draft) and at + n < len(truth) and draft[n] == truth[at + n]:
            n += 1
        passes, drafts = passes + 1, drafts + bool(draft)
        misses += n < len(draft) and at + n < len(truth)
        for token in truth[at : at + n + 1]:
            d.add(token)
        at += n + 1
    return passes, drafts, misses


def verify(d: Drafter, truth: list[int]) -> tuple[int, int]:
    """How many drafts sampling `truth` made (`sample`), and how many missed."""
    return sample(d, truth)[1:]


def test_of_several_matches_the_one_sharing_the_most_context_is_drafted_from() -> None:
    # (1, 2, 3) twice; the sequence's end shares (10, 11, 12) before it with the first only
    tokens = [10, 11, 12, 1, 2, 3, 50, 51, 52, 20, 21, 1, 2, 3, 60, 61, 99, 10, 11, 12, 1, 2, 3]
    assert drafter(tokens).draft(4) == (50, 51, 52, 20)
    # of matches sharing as much, the most recent
    assert drafter([7, 1, 2, 3, 50, 8, 1, 2, 3, 60, 9, 1, 2, 3]).draft(1) == (60,)


def test_a_rename_breaks_a_copy_once_and_is_drafted_after() -> None:
    """A file copied with one name replaced (`load_rows` → `read_rows`): the copy breaks at the
    name's first occurrence and goes on right after it; later occurrences are drafted renamed,
    while the same token before another (`load_orders`) is copied as it was."""
    body = list(range(100, 160))
    body[40:42] = [120, 121]  # the name again, at 20 and at 40
    body[30] = 120  # the same token before another (131)
    renamed = [999 if t == 120 and body[i + 1] == 121 else t for i, t in enumerate(body)]
    d = drafter([*body, 1, *body[:10]])
    drafts, misses = verify(d, renamed[10:])
    assert misses == 1 and drafts <= len(body) / 3, (drafts, misses)  # the first, only
    d = drafter([*body, 1, *body[:10]])  # without the rename in between, no draft goes on
    drafts, misses = verify(d, [t if t != 999 else 998 for t in renamed[10:41]])
    assert misses == 1, (drafts, misses)


def test_a_token_rewritten_alike_before_two_others_is_drafted_so_wherever_it_recurs() -> None:
    """A patch's context lines are indented one space more than the file's: the indent is one
    token, and the token after it differs on every line. Rewritten alike on two lines, it is
    drafted rewritten on every later line; a line that keeps the file's indent drops that."""
    newline, indent, wider = 1, 2, 3
    lines = [[newline, indent, *(100 * k + i for k in range(1, 6))] for i in range(12)]
    file = [t for line in lines for t in line]
    patch = [wider if t == indent else t for t in file]
    start = [*file, 50, *patch[:7]]  # the file, then the patch's first line
    assert verify(drafter(start), patch[7:])[1] == 2  # the second line's break, the third's
    kept = patch[7:42] + file[42:]  # lines 6 on keep the file's indent
    assert verify(drafter(start), kept)[1] == 3
    # rewritten before one other token only, it is copied as it was before the rest
    d = drafter([*lines[0], *lines[1], *lines[2], 50, *lines[0]])
    assert verify(d, [newline, wider, *lines[1][2:], *lines[2]])[1] == 1


def test_a_copy_indented_wider_on_one_line_is_drafted_wider_at_every_depth() -> None:
    """A patch writes every context line one space further in than the file, at whatever
    depth: each width is its own token. Once the sequence widened one indent, every indent
    of the file is drafted that much wider (without the vocabulary's indents each width and
    each line broke the copy until it was seen twice); a line that keeps the file's indent
    drops that, and a fresh match after a wider indent is found in the file at once."""
    newline, four, five, eight, nine, tab, two_tabs = 1, 2, 3, 4, 5, 6, 7
    pieces = [b"x", b"\n", b" " * 4, b" " * 5, b" " * 8, b" " * 9, b"\t", b"\t\t"]
    indents = Indents(pieces)
    assert indents.shift(four, five) == 1 and indents.shift(nine, four) == -5
    assert indents.shift(tab, two_tabs) == 1
    assert indents.shift(four, tab) == 0 and indents.shifted(eight, 1) == nine
    assert indents.shifted(nine, 1) is None and indents.shifted(100, 1) is None
    wider = {four: five, eight: nine}
    lines = [
        [newline, four if i % 2 == 0 else eight, *(100 * k + i for k in range(1, 6))]
        for i in range(12)
    ]
    file = [t for line in lines for t in line]
    patch = [wider.get(t, t) for t in file]
    start = [*file, 50, *patch[:7]]  # the file, then the patch's first line

    def widened(indents: Indents | None) -> Drafter:
        return Drafter(start, 1000, FLAT, indents)

    assert verify(widened(indents), patch[7:])[1] == 1  # the second line's break only
    assert verify(widened(None), patch[7:])[1] == 4  # each width's first two lines
    kept = patch[7:42] + file[42:]  # lines 6 on keep the file's indent
    assert verify(widened(indents), kept)[1] == 2
    # a line of its own, then a line of the file: the sequence's last three tokens, a wider
    # indent and two words, are found in the file
    d = widened(indents)
    verify(d, patch[7:21])
    for token in (newline, five, 7, 8, newline, nine, 105, 205):
        d.add(token)
    assert d.draft(3) == (305, 405)  # two: the run since the line of its own is four tokens


def test_a_copy_goes_on_right_after_a_token_replaced_dropped_or_added() -> None:
    body = list(range(100, 160))

    def copying() -> Drafter:  # a sequence that has copied body[10:25], and is to go on
        d = drafter([*body, 1, *body[:10]])
        assert verify(d, body[10:25])[1] == 0
        return d

    d = copying()  # 125 replaced by 7
    d.add(7)
    assert d.draft(4) == ()  # (24, 7) appears nowhere
    d.add(126)
    assert d.draft(4) == (127, 128, 129, 130)  # without waiting for a new match of three
    d = copying()  # 125 dropped
    d.add(126)
    assert d.draft(4) == (127, 128, 129, 130)
    d = copying()  # 7 added before 125
    d.add(7)
    d.add(125)
    assert d.draft(4) == (126, 127, 128, 129)
    d = copying()  # more than a few tokens of other text: no longer the same copy
    for token in (7, 8, 9, 10, 126):
        d.add(token)
    assert d.draft(4) == ()


def test_a_listing_written_as_a_list_is_drafted_with_its_separator() -> None:
    """A call naming the paths of a listing in its order, with `", "` (two tokens) where the
    listing broke lines: after the first break the copy goes on, the separator is drafted
    with the paths, and on two cores' curve most of the call comes from drafts."""
    newline, comma, quote = 1, 2, 3
    paths = [[10, 11, 100 + i, 200 + i, 12, 13] for i in range(16)]  # src/shop/<noun>/models.py
    listing = [t for path in paths for t in (*path, newline)]
    call = [t for path in paths for t in (*path, comma, quote)]
    d = drafter([50, 51, *listing, 52, 53, quote], CPU)
    assert sample(d, call)[0] < len(call) / 2.5


def test_a_copy_drafts_on_every_curve_a_server_measured() -> None:
    """A sequence's first draft is sized by the prior alone; on a curve where none pays at the
    prior, the copy followed unverified must show that drafts pay, or nothing is ever drafted
    (two whole bench runs drafted nothing)."""
    source = list(range(100, 140))
    assert SHUNNED.best_draft(8 / 9, MAX_DRAFT) == 0
    for cost in (CPU, STARTUP, DEAREST, SHUNNED):
        d = drafter([*source, 1, *source[:8]], cost)
        passes, _, misses = sample(d, source[8:])
        assert misses == 0 and passes < len(source[8:]) / 2.5, cost


def test_drafts_stop_when_they_miss_and_come_back_when_the_copy_goes_on() -> None:
    def after_a_miss() -> Drafter:
        d = drafter([7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 7, 8, 9, 10, 11, 12], STARTUP)
        # at the prior, of the 4 its run of 6 allows, three tokens pay best on 2 cores (4 rows
        # cost less than 3)
        assert d.draft(MAX_DRAFT) == (13, 14, 15)
        d.add(50)  # the sequence sampled another token at once: a missed draft
        return d

    d = after_a_miss()
    assert verify(d, [*range(100, 110), 7, 8, 9]) == (0, 0)  # a match, but it would not pay
    # the sequence copies on (what followed the latest match): its copy, followed unverified,
    # shows that drafts pay again
    drafts, misses = verify(d, [10, 11, 12, 50, *range(100, 108)])
    assert drafts > 0 and misses == 0
    # and some 50 tokens on, with nothing copied, the miss has faded as well
    d = after_a_miss()
    assert d.draft(MAX_DRAFT) == ()
    missed = d.acceptance
    assert verify(d, list(range(200, 260))) == (0, 0)
    assert missed < d.acceptance < 8 / 9


def test_a_long_copy_that_ends_stops_drafting_within_five_misses() -> None:
    body = list(range(100, 160))
    d = drafter([*body, 1, *body[:3]], CPU)
    drafts, misses = verify(d, body[3:])  # copied whole
    assert misses == 0 and drafts < len(body) / 3
    assert d.acceptance > 0.9
    # then new text, where the last tokens always match the copy's start but nothing follows
    truth = [t for j in range(10) for t in (500 + j, 1500 + j, 2500 + j, 100, 101, 102)]
    drafts, misses = verify(d, truth)
    assert 0 < misses == drafts <= 5, drafts


def test_the_draft_length_is_what_pays_on_the_measured_curve() -> None:
    assert FLAT.best_draft(0.9, MAX_DRAFT) == MAX_DRAFT
    assert FLAT.best_draft(0.9, 3) == 3
    assert FLAT.best_draft(0.0, MAX_DRAFT) == 0
    linear = PassCost(tuple(float(k) for k in range(1, MAX_DRAFT + 2)))  # no gain from rows
    assert linear.best_draft(0.99, MAX_DRAFT) == 0
    assert CPU.best_draft(0.6, MAX_DRAFT) == 0
    assert CPU.best_draft(0.9, MAX_DRAFT) in (3, 5)  # even rows: odd ones cost more on 2 cores
    assert CPU.best_draft(0.9, 0) == 0


def test_the_curve_is_measured_on_the_context_and_leaves_it_empty() -> None:
    context = FakeContext(2)
    cost = PassCost.measure(context, 1)
    assert cost is not None and len(cost.relative) == MAX_DRAFT + 1 and cost.relative[0] == 1.0
    assert context.memory == [[], []]
    fed = [len(f.tokens) for p in context.passes for f in p if f.output]
    assert sorted(set(fed)) == list(range(1, MAX_DRAFT + 2))
    # a memory that cannot drop a suffix (a recurrent model's) gets no speculation
    assert PassCost.measure(FakeContext(2, cut=False), 0) is None


class Stalling(FakeContext):
    """A fake context whose passes take a tick a row on a clock of its own, and whose first
    `stalls` passes of one row take `delay` more (the thread descheduled on a busy machine)."""

    def __init__(self, stalls: int, delay: float = 100) -> None:
        super().__init__(1)
        self.now, self.stalls, self.delay = 0.0, stalls, delay

    def decode(self, feeds: Sequence[Feed]) -> None:
        super().decode(feeds)
        rows = sum(len(feed.tokens) for feed in feeds)
        self.now += rows
        if rows == 1 and self.stalls:
            self.now, self.stalls = self.now + self.delay, self.stalls - 1

    def clock(self) -> float:
        return self.now


def test_a_curve_measured_with_stalled_passes_is_measured_again_or_drafts_nothing() -> None:
    linear = tuple(float(k) for k in range(1, MAX_DRAFT + 2))
    # one row is timed twice a round: a round whose one-row passes were slow, by a lot or by
    # half a row, does not flatten the curve (timed once a round, in two rounds, the half row
    # left 2 rows at 1.33× one row)
    for delay in (100, 0.5):
        context = Stalling(stalls=2, delay=delay)
        cost = PassCost.measure(context, 0, context.clock)
        assert cost is not None and cost.steady and cost.relative == linear, delay
    # every one-row pass of the first try stalled: the second try's are kept
    context = Stalling(stalls=2 * _PROBE_REPS)
    cost = PassCost.measure(context, 0, context.clock)
    assert cost is not None and cost.steady and cost.relative == linear
    # stalled on every try: the rows are taken to cost what they do alone, and nothing pays
    context = Stalling(stalls=1000)
    cost = PassCost.measure(context, 0, context.clock)
    assert cost is not None and not cost.steady
    assert cost.best_draft(0.99, MAX_DRAFT) == 0
    assert context.memory == [[]]


def _next(history: list[int]) -> int:
    """The fake context's next token after `history` (see `FakeContext.decode`)."""
    return (sum(history) * 7 + len(history)) % VOCAB


@dataclass(eq=False)
class Drafting(FakeWork):
    """A work that drafts the fake model's true continuation, with every `wrong`-th draft
    token changed."""

    wrong: int = 3
    drafts: int = 0

    def draft(self, crowded: bool) -> tuple[int, ...]:
        history = [*self.prompt, *self.output]
        out = []
        for _ in range(4):
            token = _next(history)
            self.drafts += 1
            if self.drafts % self.wrong == 0:
                token = (token + 1) % VOCAB
            out.append(token)
            history.append(token)
        return tuple(out)


def test_verified_drafts_give_the_same_tokens_in_fewer_passes() -> None:
    prompts = [prompt(i, 12 + 5 * i) for i in range(3)]
    plain = [FakeWork(p, length=30) for p in prompts]
    context = FakeContext(4)
    run(Batcher(context, 4), plain)
    drafting = [Drafting(p, length=30, wrong=3 + i) for i, p in enumerate(prompts)]
    spec_context = FakeContext(4)
    batcher = Batcher(spec_context, 4)
    run(batcher, drafting)
    assert [w.output for w in drafting] == [w.output for w in plain]
    for seq in range(3):  # each sequence took fewer passes
        took = [
            sum(any(f.seq == seq for f in fed) for fed in c.passes) for c in (context, spec_context)
        ]
        assert took[1] < took[0], took
    assert 0 < batcher.accepted < batcher.drafted
    # each verifying sequence had a pass of its own; the memory holds exactly what was accepted
    for fed in spec_context.passes:
        assert all(f.drafted == 0 for f in fed) or len(fed) == 1
    for work in drafting:
        assert [*work.prompt, *work.output[:-1]] in spec_context.memory


def test_a_draft_past_the_end_of_a_generation_is_taken_back() -> None:
    work = Drafting(prompt(7, 20), length=7, wrong=1000)
    context = FakeContext(1)
    batcher = Batcher(context, 1)
    run(batcher, [work])
    plain = FakeWork(work.prompt, length=7)
    run(Batcher(FakeContext(1), 1), [plain])
    assert work.output == plain.output
    assert context.memory[0] == [*work.prompt, *work.output[:-1]]
    assert batcher.accepted < batcher.drafted  # the second draft ran on past the seventh token

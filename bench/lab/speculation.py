"""Issue 50, measure first: would drafts from the context (prompt lookup) pay on this machine?

    .venv/bin/python -m bench.lab.speculation [--reps 7] [--threads N] [--tokens 240]

1. What one sequence's pass costs at 1..64 rows, relative to one row: after a ~1,000-token
   context, a pass of k new rows of that one sequence, logits for every row (as verification
   wants them), the rows' cache entries removed again (`llama_memory_seq_rm`) so that every
   trial starts from the same state. The sizes alternate rep by rep; median ms and its ratio to
   k=1. And whether verify rows give the logits of one-row decode: a greedy continuation of 16
   tokens made one row at a time, fed again as 2, 4, 8 and 16 rows of one pass.
2. What acceptance each draft policy would get, replayed offline on greedy outputs of the
   default model (recorded here, temperature 0, a pass a token) for four workloads built below:
   an apply_patch-style edit of a ~150-line file, a whole-file rewrite of a ~60-line file with
   one rename, a tool call repeating paths from the context, and plain chat. At each step the
   draft is the policy's proposal from the tokens so far (prompt and output), the accepted
   tokens the longest prefix of it equal to the recorded ones, and one token more is always
   emitted (the verifying pass's own). The implied speedup divides the tokens emitted by the
   summed relative cost (question 1) of the passes that emitted them (1 + drafted rows each).
   The last row replays the engine's own `Drafter` (this tree's) the same way, on that curve.

The model is loaded as `oars serve` loads it (plain weights, no flash attention, one memory per
sequence, the engine's thread count: one per core unless told).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.prompts import WORKLOADS
from oars.chat_template import ChatTemplate
from oars.engines.batching import Feed
from oars.engines.llama_context import LlamaContext, LlamaLog
from oars.engines.speculation import MAX_DRAFT, Drafter, Indents, PassCost
from oars.weights import pull

SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 32, 64)  # 5, 7, 9: the rows of drafts of 4, 6, 8
CONTEXT, CHUNK, SEQ = 1000, 256, 0
KEYS, DRAFTS = (1, 2, 3, 4), (2, 4, 8)


# --- the model, as oars serve loads it -----------------------------------------------------------


class Model:
    def __init__(self, threads: int) -> None:
        import llama_cpp

        LlamaLog.install(llama_cpp)
        path = str(pull())
        self.api = llama_cpp
        self.vocab_llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        params = llama_cpp.llama_model_default_params()
        params.use_extra_bufts = False  # oars's plain weights
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.ctx = LlamaContext(
            llama_cpp, self.model, n_seq=1, n_ctx_seq=4096, n_batch=512,
            n_threads=threads, n_vocab=self.n_vocab, flash_attn=False,
        )  # fmt: skip
        meta = self.vocab_llm.metadata
        self.template = ChatTemplate(meta["tokenizer.chat_template"])
        pieces = (self.vocab_llm.detokenize([t], special=True) for t in range(self.n_vocab))
        self.indents = Indents([bytes(piece) for piece in pieces])

    def prompt(self, text: str, tools: list[dict[str, Any]], opening: str) -> list[int]:
        messages = [{"role": "system", "content": "You are a careful coding assistant."}]
        rendered = self.template.render([*messages, {"role": "user", "content": text}], tools)
        tokens = self.vocab_llm.tokenize((rendered + opening).encode(), add_bos=False, special=True)
        return [int(t) for t in tokens]

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        """A fresh sequence holding `tokens`; the logits of the last one (a copy)."""
        self.ctx.forget(SEQ, 0)
        for at in range(0, len(tokens), CHUNK):
            part = tokens[at : at + CHUNK]
            self.ctx.decode([Feed(SEQ, part, at, at + CHUNK >= len(tokens))])
        return self.ctx.logits(0).copy()

    def rows(self, tokens: Sequence[int], start: int) -> None:
        """One pass of `tokens` as rows of the one sequence from `start`, logits for each."""
        self.ctx.decode([Feed(SEQ, [t], start + i, True) for i, t in enumerate(tokens)])

    def greedy(self, prompt: list[int], limit: int) -> list[int]:
        """Temperature 0, one row a pass, to an end-of-generation token (kept) or `limit`."""
        logits, out = self.prefill(prompt), []
        while len(out) < limit:
            out.append(int(np.argmax(logits)))
            if self.api.llama_vocab_is_eog(self.vocab, out[-1]):
                break
            self.rows(out[-1:], len(prompt) + len(out) - 1)
            logits = self.ctx.logits(0)
        return out


# --- question 1: pass cost, and verify rows against one-row decode -------------------------------


def pass_costs(m: Model, context: list[int], reps: int) -> dict[int, list[float]]:
    m.prefill(context)
    filler = context[:64]  # what the rows hold does not change their cost
    ms: dict[int, list[float]] = {k: [] for k in SIZES}
    for rep in range(reps + 1):  # the first round warms up and is not kept
        turn = rep % len(SIZES)
        for k in SIZES[turn:] + SIZES[:turn]:
            began = time.perf_counter()
            m.rows(filler[:k], len(context))
            took = (time.perf_counter() - began) * 1000
            m.ctx.forget(SEQ, len(context))
            if rep:
                ms[k].append(took)
    return ms


def invariance(m: Model, context: list[int], n: int = 16) -> list[tuple[int, int, float]]:
    """(rows, argmax agreements, max |logit difference|) of verify rows against one-row decode."""
    logits = m.prefill(context)
    tokens, single = [int(np.argmax(logits))], []
    for i in range(n):
        m.rows(tokens[-1:], len(context) + i)
        single.append(m.ctx.logits(0).copy())
        tokens.append(int(np.argmax(single[-1])))
    out = []
    for width in (2, 4, 8, n):
        m.ctx.forget(SEQ, len(context))
        m.rows(tokens[:width], len(context))
        rows = [m.ctx.logits(i) for i in range(width)]
        agree = sum(
            int(np.argmax(r)) == int(np.argmax(s)) for r, s in zip(rows, single, strict=False)
        )
        diff = max(float(np.max(np.abs(r - s))) for r, s in zip(rows, single, strict=False))
        out.append((width, agree, diff))
    return out


# --- question 2: the policies, replayed ----------------------------------------------------------


class History:
    """The tokens so far, with the most recent position following each key of 1..4 tokens."""

    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens: list[int] = []
        self.after: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            end = len(self.tokens)  # the keys ending here now have a continuation: `token`
            for n in range(1, min(max(KEYS), end) + 1):
                self.after[tuple(self.tokens[end - n :])] = end
            self.tokens.append(token)

    def lookup(self, n_max: int) -> int | None:
        """Where the most recent earlier occurrence of the longest key (n_max down to 1) ends."""
        for n in range(min(n_max, len(self.tokens)), 0, -1):
            if (at := self.after.get(tuple(self.tokens[-n:]))) is not None:
                return at
        return None


@dataclass
class Replay:
    drafted: int = 0
    accepted: int = 0
    passes: int = 0
    emitted: int = 0
    cost: float = 0.0


def agreed(draft: Sequence[int], want: Sequence[int]) -> int:
    """How many of the draft's tokens the recorded ones accept: those before the first that
    differs."""
    return next(
        (i for i, (a, b) in enumerate(zip(draft, want, strict=False)) if a != b),
        min(len(draft), len(want)),
    )


def replay(
    prompt: list[int], out: list[int], n: int, d: int, follow: bool, c: Callable[[int], float]
) -> Replay:
    h, r, source = History(prompt), Replay(), None
    while r.emitted < len(out):
        at = source if follow and source is not None else h.lookup(n)
        draft = h.tokens[at : at + d] if at is not None else []
        want = out[r.emitted :]
        accepted = agreed(draft, want)
        emitted = want[: accepted + 1]
        r.drafted, r.accepted, r.passes = (
            r.drafted + len(draft),
            r.accepted + accepted,
            r.passes + 1,
        )
        r.cost += c(1 + len(draft))
        r.emitted += len(emitted)
        h.extend(emitted)
        # follow: go on from the source while the whole draft and the token after it match it
        whole = bool(draft) and accepted == len(draft) and at is not None
        source = at + len(emitted) if whole and h.tokens[at + accepted] == emitted[-1] else None
    return r


def replay_drafter(
    prompt: list[int], out: list[int], cost: PassCost, indents: Indents | None = None
) -> Replay:
    """The engine's own `Drafter` (this tree's), fed as the batcher feeds it: a draft each pass
    of at most the tokens left, its tokens kept up to the first that differs, and one more."""
    drafter, r = Drafter(prompt, len(out) + 1, cost, indents), Replay()
    while r.emitted < len(out):
        draft = drafter.draft(len(out) - r.emitted)
        want = out[r.emitted :]
        accepted = agreed(draft, want)
        for token in want[: accepted + 1]:
            drafter.add(token)
        r.drafted, r.accepted, r.passes = (
            r.drafted + len(draft),
            r.accepted + accepted,
            r.passes + 1,
        )
        r.cost += cost.relative[len(draft)]
        r.emitted += accepted + 1
    return r


# --- the run -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--tokens", type=int, default=240, help="most output tokens recorded a workload"
    )
    args = parser.parse_args()
    m = Model(args.threads)
    prompts = {name: m.prompt(*workload) for name, workload in WORKLOADS.items()}
    context = prompts["patch"][:CONTEXT]

    ms = pass_costs(m, context, args.reps)
    base = statistics.median(ms[1])
    ratio = {k: statistics.median(v) / base for k, v in ms.items()}
    print(f"\n## A pass of one sequence after {len(context)} tokens, k rows, logits for each")
    print(f"{args.threads} threads, {args.reps} reps, sizes alternating\n")
    print("| k rows | median ms | range ms | × k=1 | ms a row |\n|---|---|---|---|---|")
    for k, v in ms.items():
        med = statistics.median(v)
        print(f"| {k} | {med:.1f} | {min(v):.1f}-{max(v):.1f} | {ratio[k]:.2f} | {med / k:.1f} |")
    print("\n## Verify rows against one-row decode (a greedy continuation of 16)\n")
    print("| rows in the pass | argmax agrees | max abs logit diff |\n|---|---|---|")
    for width, agree, diff in invariance(m, context):
        print(f"| {width} | {agree}/{width} | {diff:.4f} |")

    def c(rows: int) -> float:  # measured, or between the two sizes around it
        return float(np.interp(rows, list(ratio), list(ratio.values())))

    outs = {name: m.greedy(p, args.tokens) for name, p in prompts.items()}
    names = list(outs)
    print("\n## Draft policies replayed on greedy outputs")
    print(
        "acceptance (accepted/drafted) · tokens a pass · implied speedup (tokens / summed pass cost)\n"
    )
    print(
        "| policy | " + " | ".join(f"{w} ({len(prompts[w])}+{len(outs[w])})" for w in names) + " |"
    )
    print("|---|" + "---|" * len(names))
    for follow in (False, True):
        for n in KEYS:
            for d in DRAFTS:
                cells = []
                for w in names:
                    r = replay(prompts[w], outs[w], n, d, follow, c)
                    rate = r.accepted / r.drafted if r.drafted else 0.0
                    cells.append(
                        f"{rate:.0%} · {r.emitted / r.passes:.2f} · {r.emitted / r.cost:.2f}×"
                    )
                label = f"n≤{n}, d={d}" + (", follow" if follow else "")
                print(f"| {label} | " + " | ".join(cells) + " |")
    cost = PassCost(tuple(c(k) for k in range(1, MAX_DRAFT + 2)))  # on the curve above
    cells = []
    for w in names:
        r = replay_drafter(prompts[w], outs[w], cost, m.indents)
        rate = r.accepted / r.drafted if r.drafted else 0.0
        cells.append(f"{rate:.0%} · {r.emitted / r.passes:.2f} · {r.emitted / r.cost:.2f}×")
    print("| oars's `Drafter` | " + " | ".join(cells) + " |")
    for w in names:  # what was replayed
        print(
            f"\n{w}:\n    "
            + m.vocab_llm.detokenize(outs[w]).decode(errors="replace").replace("\n", "\n    ")
        )


if __name__ == "__main__":
    main()

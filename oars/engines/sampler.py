"""Token choice and logprobs from one row of logits (numpy; no per-token Python loops)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from oars.generation import SamplingParams

Logits = npt.NDArray[np.float32]

# Nucleus sampling looks among this many best tokens, then as many more while they hold less than
# top_p of the probability, then among all (sorting all 151,936 took 20 ms a token).
_POOLS = (2048, 16384)


def log_softmax(logits: Logits) -> Logits:
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())  # type: ignore[no-any-return]


def top_indices(values: Logits, k: int) -> npt.NDArray[np.intp]:
    """Indices of the k largest values, largest first."""
    if k <= 0:
        return np.empty(0, dtype=np.intp)
    k = min(k, values.size)
    part = np.argpartition(-values, k - 1)[:k]
    return part[np.argsort(-values[part], kind="stable")]  # type: ignore[no-any-return]


def penalize(logits: Logits, recent: list[int], penalty: float) -> None:
    """The usual repetition penalty over recent tokens, in place."""
    if penalty == 1.0 or not recent:
        return
    ids = np.unique(np.asarray(recent, dtype=np.intp))
    vals = logits[ids]
    logits[ids] = np.where(vals > 0, vals / penalty, vals * penalty)


def sample(logits: Logits, params: SamplingParams, rng: np.random.Generator) -> int:
    if params.greedy:
        return int(np.argmax(logits))
    if params.top_k <= 0 and params.top_p >= 1.0:  # the whole vocabulary (OpenAI's defaults)
        # One array of the vocabulary's size, worked in place: each new one faults in its
        # pages, and three of them took 4× the time of the arithmetic (`bench.sampler`).
        weights = logits - logits.max()
        weights *= np.float32(1.0 / params.temperature)
        return draw(np.exp(weights, out=weights), rng.random())
    scaled = logits / np.float32(params.temperature)
    top = scaled.max()
    candidates = top_indices(scaled, params.top_k if params.top_k > 0 else _POOLS[0])
    probs = np.exp(scaled[candidates] - top).astype(np.float64)
    if params.top_p < 1.0:
        if params.top_k <= 0:
            rest = scaled - top
            total = np.exp(rest, out=rest).sum(dtype=np.float64)
            for pool in (*_POOLS[1:], scaled.size):
                if probs.sum() / total >= params.top_p or candidates.size == scaled.size:
                    break
                candidates = top_indices(scaled, pool)  # the pool was too narrow: widen it
                probs = np.exp(scaled[candidates] - top).astype(np.float64)
        cum = np.cumsum(probs) / probs.sum()
        keep = int(np.searchsorted(cum, params.top_p)) + 1
        candidates, probs = candidates[:keep], probs[:keep]
    cum = np.cumsum(probs)
    pick = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    return int(candidates[min(pick, candidates.size - 1)])


_BLOCK = 1024


def draw(weights: Logits, u: float) -> int:
    """The index at which `u` (in [0, 1)) times their total falls in the running sum of
    `weights` (≥ 0, not all 0): a draw from them, never of a weight of 0. In blocks, in
    float64: the blocks' sums, then the running sum of the one block it falls in. A running sum
    of the whole vocabulary took 2-4 ms a token (`bench.sampler`): numpy casts a float32 array
    to float64 an element at a time inside `cumsum`, and each new 1.2 MB array faults in its
    pages."""
    starts = np.arange(0, weights.size, _BLOCK)
    sums = np.cumsum(np.add.reduceat(weights, starts, dtype=np.float64))
    target = u * sums[-1]
    b = int(np.searchsorted(sums, target, side="right"))
    if b >= sums.size:  # rounding took the target to the total: the last block with weight
        b = int(np.flatnonzero(np.diff(sums, prepend=0.0) > 0)[-1])
    block = weights[starts[b] : starts[b] + _BLOCK].astype(np.float64)
    cum = np.cumsum(block) + (sums[b - 1] if b else 0.0)
    i = int(np.searchsorted(cum, target, side="right"))
    if i >= block.size:  # past the block's own running sum (rounding): its last weight
        i = int(np.flatnonzero(block)[-1])
    return int(starts[b]) + i

"""Token choice and logprobs from one row of logits (numpy; no per-token Python loops)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from oars.generation import SamplingParams

Logits = npt.NDArray[np.float32]

_POOL = 2048  # nucleus sampling first looks among this many best tokens; exact fallback otherwise


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
    scaled = logits / np.float32(params.temperature)
    if params.top_k > 0:
        candidates = top_indices(scaled, params.top_k)
    elif params.top_p < 1.0:
        candidates = top_indices(scaled, _POOL)
    else:
        candidates = np.arange(scaled.size)
    probs = np.exp(scaled[candidates] - scaled.max()).astype(np.float64)
    if params.top_p < 1.0:
        total = np.exp(scaled.astype(np.float64) - scaled.max()).sum()
        if params.top_k <= 0 and probs.sum() / total < params.top_p:
            candidates = top_indices(scaled, scaled.size)  # the pool was too narrow: sort all
            probs = np.exp(scaled[candidates] - scaled.max()).astype(np.float64)
        cum = np.cumsum(probs) / probs.sum()
        keep = int(np.searchsorted(cum, params.top_p)) + 1
        candidates, probs = candidates[:keep], probs[:keep]
    cum = np.cumsum(probs)
    pick = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    return int(candidates[min(pick, candidates.size - 1)])

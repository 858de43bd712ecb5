"""Forward passes read back from the logs of oars and of llama-server, for `bench.lab.account`:
how many passes a load took, how many graphs (ubatches) each pass ran, how many KV cells each
graph attended over, how long each pass took and how long the engine spent between two passes.

With a memory of one stream per sequence (both servers' setting), llama.cpp puts only sequences
of consecutive ids, in increasing order, in one ubatch, and the same number of tokens of each:
a new ubatch begins where a sequence is not the last one plus one, and a sequence with more
tokens than the others ends in ubatches of its own.

- oars (`--log-level debug`) logs a line after each pass: `pass feeds=0:120+1,1:98+1 ms=51.20
  gap_ms=0.31` (sequence:position+tokens).
- llama-server (`-v --log-timestamps`, `LLAMA_KV_CACHE_DEBUG=1`) logs `decode: n_batch
  (effective)` as a pass starts and `done yielding to queue` as it ends, each with a timestamp
  (minutes.seconds.ms.us), and in between, for every ubatch it places, one `find_slot:
  stream[s], n = N` line a sequence (N: the cells that stream held before).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

from oars.engines.batching import graphs

_SLOT = re.compile(r"find_slot: stream\[(\d+)\], n =\s*(\d+)")
_OARS_PASS = re.compile(r"pass feeds=([\d:+,]*) ms=([\d.]+) gap_ms=([\d.]+)")
_STAMP = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) ")
_PAD = 256  # llama.cpp pads the cells a graph attends over to a multiple of 256


@dataclass
class Pass:
    ubatches: list[list[tuple[int, int]]]  # each one's (stream, cells it held before)
    ms: float = 0.0
    gap_ms: float | None = None  # since the pass before, if there was one in the same log

    @property
    def sequences(self) -> int:
        return len({stream for ubatch in self.ubatches for stream, _ in ubatch})

    @property
    def attended(self) -> list[int]:
        """Cells each ubatch's attention spans: its streams' highest, padded."""
        return [max(_padded(used + 1) for _, used in ub) for ub in self.ubatches]


def split(feeds: list[tuple[int, int, int]], n_ubatch: int = 512) -> list[list[tuple[int, int]]]:
    """llama.cpp's ubatches of a pass of (sequence, position, tokens) feeds, for a memory of
    one stream per sequence (`oars.engines.batching.graphs`): each as the (sequence, position
    of its first token) it takes."""
    at = {seq: start for seq, start, _ in feeds}
    out = []
    for seqs, take in graphs([(seq, n) for seq, _, n in feeds], n_ubatch):
        out.append([(seq, at[seq]) for seq in seqs])
        for seq in seqs:
            at[seq] += take
    return out


def _padded(cells: int) -> int:
    return max(_PAD, -(-cells // _PAD) * _PAD)


def _seconds(line: str) -> float | None:
    found = _STAMP.match(line)
    if found is None:
        return None
    minutes, seconds, ms, us = (int(g) for g in found.groups())
    return minutes * 60 + seconds + ms / 1e3 + us / 1e6


def oars_passes(text: str) -> list[Pass]:
    passes: list[Pass] = []
    for line in text.splitlines():
        if found := _OARS_PASS.search(line):
            feeds = [re.split(r"[:+]", feed) for feed in found[1].split(",")]
            ubatches = split([(int(seq), int(at), int(n)) for seq, at, n in feeds])
            gap = float(found[3]) if passes else None
            passes.append(Pass(ubatches, float(found[2]), gap))
    return passes


def llama_passes(text: str) -> list[Pass]:
    passes: list[Pass] = []
    current: Pass | None = None
    began: float | None = None
    ended: float | None = None
    for line in text.splitlines():
        if "decode: n_batch (effective)" in line:
            began = _seconds(line)
            gap: float | None = (
                (began - ended) * 1000 if began is not None and ended is not None else None
            )
            current = Pass([], gap_ms=gap)
        elif current is None:
            continue
        elif slot := _SLOT.search(line):
            stream, used = int(slot[1]), int(slot[2])
            if current.ubatches and stream == current.ubatches[-1][-1][0] + 1:
                current.ubatches[-1].append((stream, used))
            else:
                current.ubatches.append([(stream, used)])
        elif "done yielding to queue" in line:
            ended = _seconds(line)
            if began is not None and ended is not None:
                current.ms = (ended - began) * 1000
            passes.append(current)
            current = None
    return passes


def summary(passes: list[Pass]) -> dict[str, float]:
    """What the table shows of a load's passes (prompt passes and token passes together)."""
    if not passes:
        return {}
    ubatches = [len(p.ubatches) for p in passes]
    rows = [p.sequences for p in passes]
    gaps = [p.gap_ms for p in passes if p.gap_ms is not None]
    return {
        "passes": len(passes),
        "ubatches a pass": statistics.mean(ubatches),
        "passes of more than one ubatch": sum(u > 1 for u in ubatches),
        "sequences a pass": statistics.mean(rows),
        "cells attended (largest ubatch, median)": statistics.median(
            max(p.attended) for p in passes if p.ubatches
        ),
        "pass ms (median)": statistics.median(p.ms for p in passes),
        **_token_passes(passes),
        "pass ms (sum)": sum(p.ms for p in passes),
        "between passes ms (median)": statistics.median(gaps) if gaps else 0.0,
        "between passes ms (sum)": sum(gaps),
    }


def _token_passes(passes: list[Pass]) -> dict[str, float]:
    """Passes of one ubatch of the most sequences seen: token rows only, at full load."""
    most = max(p.sequences for p in passes)
    full = [p.ms for p in passes if len(p.ubatches) == 1 and p.sequences == most]
    if len(full) < 4:
        return {}
    quartiles = statistics.quantiles(full, n=4)
    return {
        f"one-ubatch passes of {most} sequences": len(full),
        "  their ms, 25th percentile": quartiles[0],
        "  their ms, median": quartiles[1],
        "  their ms, 75th percentile": quartiles[2],
    }

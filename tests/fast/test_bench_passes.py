"""The pass account of `bench.vs_llama_server --account`, read from log lines as each server
writes them (llama-server's are copied from a run of the build `make llama-server` makes)."""

from __future__ import annotations

import pytest

from bench.passes import llama_passes, oars_passes, split, summary

LLAMA_LOG = """\
0.08.500.690 D srv        decode: n_batch (effective) = 2048, off = 0
0.08.500.691 D que  yield_to_que: yielding to queue
0.08.500.782 D find_slot: stream[0], n =    34, used =    34, head =    34, size = 16384, n_swa =     0
0.08.500.809 D find_slot: stream[0] min[0] =     0, max[0] =    33
0.08.500.810 D find_slot: stream[1], n =   300, used =   300, head =   300, size = 16384, n_swa =     0
0.08.500.811 D find_slot: stream[3], n =    40, used =    40, head =    40, size = 16384, n_swa =     0
0.08.531.489 D que  yield_to_que: done yielding to queue
0.08.531.820 D slot process_toke: id  0 | task 0 | n_gen = 2, n_remaining = 3, next token: 11 ','
0.08.531.862 D srv        decode: n_batch (effective) = 2048, off = 0
0.08.531.908 D find_slot: stream[0], n =    35, used =    35, head =    35, size = 16384, n_swa =     0
0.08.562.127 D que  yield_to_que: done yielding to queue
"""

OARS_LOG = """\
DEBUG oars.engine.passes: pass feeds=2:0+60 ms=350.10 gap_ms=0.00
DEBUG oars.engine.passes: pass feeds=0:34+1,1:300+1,2:60+1 ms=80.50 gap_ms=0.52
DEBUG oars.engine.passes: pass feeds=0:35+1,2:61+1 ms=95.00 gap_ms=0.48
"""


def test_llama_server_passes_are_timed_and_split_where_sequences_are_not_consecutive() -> None:
    passes = llama_passes(LLAMA_LOG)
    assert [len(p.ubatches) for p in passes] == [2, 1]  # streams 0-1, then 3
    assert passes[0].ms == pytest.approx(30.799)
    assert passes[0].gap_ms is None and passes[1].gap_ms == pytest.approx(0.373)
    assert passes[0].attended == [512, 256]  # stream 1 held 300 cells: padded to 512
    assert passes[0].sequences == 3


def test_oars_passes_split_as_llama_cpp_splits_them() -> None:
    passes = oars_passes(OARS_LOG)
    assert [len(p.ubatches) for p in passes] == [1, 1, 2]
    assert [p.ms for p in passes] == [350.10, 80.50, 95.00]
    assert passes[0].gap_ms is None
    stats = summary(passes)
    assert stats["passes of more than one ubatch"] == 1
    assert stats["between passes ms (median)"] == pytest.approx(0.50)


def test_the_split_takes_the_same_number_of_tokens_of_each_consecutive_sequence() -> None:
    # a token row each for 0 and 2, a chunk for 1: one ubatch of 0-2, then 1's rest alone
    assert split([(0, 10, 1), (1, 0, 60), (2, 5, 1)]) == [[(0, 10), (1, 0), (2, 5)], [(1, 1)]]
    # out of order: 2 cannot follow 0
    assert split([(0, 10, 1), (2, 5, 1), (1, 7, 1)]) == [[(0, 10), (1, 7)], [(2, 5)]]

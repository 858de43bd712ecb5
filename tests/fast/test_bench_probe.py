"""How `bench.probe` reads the uprobes' times back: a pass is an entry to the return on the
same thread, the time between passes is a return to that thread's next entry, and a wait of
20 ms or more between passes is idleness, not counted."""

from __future__ import annotations

import pytest

from bench.probe import held, late, occupancy, partner, read, summary, switches

SCRIPT = """\
  101 1000.000000:  oars_pass:enter:
  202 1000.001000:  llama_server_pass:enter:
  101 1000.030000: oars_pass:leave:
  101 1000.030500:  oars_pass:enter:
  202 1000.080000: llama_server_pass:leave:
  101 1000.060500: oars_pass:leave:
  101 1000.500000:  oars_pass:enter:
  101 1000.529000: oars_pass:leave:
  303 1000.600000: oars_pass:leave:
not a line of perf's
"""


def test_passes_and_gaps_by_group_and_thread() -> None:
    found = read(SCRIPT)
    assert found["oars_pass"].passes == pytest.approx([30.0, 30.0, 29.0])
    assert found["oars_pass"].gaps == pytest.approx([0.5])  # 439.5 ms idle is not a gap
    assert found["llama_server_pass"].passes == pytest.approx([79.0])
    assert found["llama_server_pass"].gaps == []


def test_summary() -> None:
    got = summary(read(SCRIPT)["oars_pass"])
    assert got["passes"] == 3
    assert got["pass ms, median"] == pytest.approx(30.0)
    assert got["pass ms (sum)"] == pytest.approx(89.0)
    assert got["between passes ms, median"] == pytest.approx(0.5)


# Two CPUs. A pass of thread 101 runs from 2000.000 to 2000.010 s; between it and the next pass
# (2000.011 s) is 1 ms. On CPU 0: the caller 101 all along, but for thread 105 of the server
# from 2000.004 to 2000.006. On CPU 1: 102 (the other compute thread), then the bench's 900 from
# 2000.008, idle from 2000.0095, and another process (777) from 2000.0105.
SWITCHES = """\
  101 [000] 1999.990000: sched:sched_switch: prev_comm=x prev_pid=50 prev_prio=120 prev_state=S ==> next_comm=python next_pid=101 next_prio=120
  101 [001] 1999.995000: sched:sched_switch: prev_comm=swapper/1 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=python next_pid=102 next_prio=120
  101 [000] 2000.000000:  oars_pass:enter: (7f00)
  101 [000] 2000.004000: sched:sched_switch: prev_comm=python prev_pid=101 prev_prio=120 prev_state=R ==> next_comm=loop next_pid=105 next_prio=120
  105 [000] 2000.006000: sched:sched_switch: prev_comm=loop prev_pid=105 prev_prio=120 prev_state=S ==> next_comm=python next_pid=101 next_prio=120
  102 [001] 2000.008000: sched:sched_switch: prev_comm=python prev_pid=102 prev_prio=120 prev_state=R ==> next_comm=bench next_pid=900 next_prio=120
  900 [001] 2000.009500: sched:sched_switch: prev_comm=bench prev_pid=900 prev_prio=120 prev_state=S ==> next_comm=swapper/1 next_pid=0 next_prio=120
  101 [000] 2000.010000: oars_pass:leave: (7f00)
    0 [001] 2000.010500: sched:sched_switch: prev_comm=swapper/1 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=cron next_pid=777 next_prio=120
  101 [000] 2000.011000:  oars_pass:enter: (7f00)
  777 [001] 2000.012000: sched:sched_switch: prev_comm=cron prev_pid=777 prev_prio=120 prev_state=S ==> next_comm=python next_pid=102 next_prio=120
  101 [000] 2000.013000: sched:sched_switch: prev_comm=python prev_pid=101 prev_prio=120 prev_state=R ==> next_comm=python next_pid=101 next_prio=120
  101 [000] 2000.013000: oars_pass:leave: (7f00)
"""


def test_who_had_the_cpus_in_a_pass_and_between() -> None:
    found = read(SWITCHES)["oars_pass"]
    assert [tid for tid, _, _ in found.windows] == [101, 101]
    assert [ms for _, *span in found.windows for ms in span] == pytest.approx(
        [2000000.0, 2000010.0, 2000011.0, 2000013.0]
    )
    cpus = switches(SWITCHES)
    server, bench = {101, 102, 105}, {900}
    passes = held(found.windows, cpus)
    other = partner(passes, server)
    assert other == 102
    first = occupancy(passes[:1], server, bench, other)
    assert first == pytest.approx(
        {
            "calling thread": 8.0,
            "llama.cpp's other thread": 8.0,
            "server's other threads": 2.0,
            "bench's clients": 1.5,
            "other processes": 0.0,
            "idle": 0.5,
        }
    )
    assert sum(first.values()) == pytest.approx(2 * 10.0)  # the pass's time × 2 CPUs
    between = occupancy(held(found.gap_windows, cpus), server, bench, other)
    assert between == pytest.approx(
        {
            "calling thread": 1.0,
            "llama.cpp's other thread": 0.0,
            "server's other threads": 0.0,
            "bench's clients": 0.0,
            "other processes": 0.5,
            "idle": 0.5,
        }
    )


def test_how_long_a_pass_ran_before_the_other_compute_thread_took_part() -> None:
    found = read(SWITCHES)["oars_pass"]
    cpus = switches(SWITCHES)
    # 102 had CPU 1 when the first pass began; in the second it waited for 777 until 2000.012
    assert late(found.windows, cpus, 102) == pytest.approx([0.0, 1.0])
    # a thread that never ran in a window waited all of it
    assert late(found.windows, cpus, 105) == pytest.approx([4.0, 2.0])
    assert late(found.windows, cpus, None) == []  # no other compute thread was found

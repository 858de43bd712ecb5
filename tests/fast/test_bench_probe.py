"""How `bench.probe` reads the uprobes' times back: a pass is an entry to the return on the
same thread, the time between passes is a return to that thread's next entry, and a wait of
20 ms or more between passes is idleness, not counted."""

from __future__ import annotations

import pytest

from bench.probe import read, summary

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

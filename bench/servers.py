"""What every bench does around its measure: a server process on a free loopback port, runs
rotated between the things compared, medians, and the markdown table they end in.

A bench compares oars with a reference run beside it (llama-server, the raw engine loop, an
upstream read directly, another checkout of oars). Machine noise on a shared box is larger
than most of the differences measured, so the reference runs in the same session, rep by rep,
each side going first as often as the other (`alternate`), and a figure is a median with the
spread of the reps' own ratios (`Row.of`). Benches import this module, never `tests/` or a
private name of `oars`: a rename inside the server cannot break a bench, nor a bench the tests.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx

T = TypeVar("T")
READY_TIMEOUT = 300.0  # a first start may page the weights in from a cold disk


def free_port() -> int:
    """A TCP port nothing listens on now (on loopback)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(
    base: str,
    proc: subprocess.Popen[bytes],
    log: Path | None = None,
    path: str | None = "/health",
    timeout: float = READY_TIMEOUT,
) -> None:
    """Until `base + path` answers 200 (with `path` None: answers at all), or raise with the
    log's tail if the process exits or the time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited ({proc.returncode}):\n{_tail(log)}")
        try:
            answer = httpx.get(f"{base}{path or '/'}", timeout=2)
            if path is None or answer.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{proc.args!r} did not become ready in {timeout:.0f} s:\n{_tail(log)}")


def _tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return "(no log)"
    return log.read_text(errors="replace")[-3000:]


def oars_serve(port: int, *args: str) -> list[str]:
    """The command line of `oars serve` on `port`, from this interpreter."""
    return [sys.executable, "-m", "oars.cli", "serve", "--port", str(port), *args]


@dataclass
class Server:
    """A server process the bench starts, restarts and stops: `command(port)` on a free
    loopback port, its output in `log` (or discarded), ready once `ready` answers 200 (or, with
    `ready` None, once anything answers). A context manager: it stops on the way out."""

    name: str
    command: Callable[[int], list[str]]
    log: Path | None = None
    env: Mapping[str, str] | None = None  # added to this process's environment
    unset: Sequence[str] = ()  # and taken out of it
    ready: str | None = "/health"
    cwd: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    base: str = ""

    def start(self) -> Server:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if k not in self.unset} | dict(self.env or {})
        if self.log is None:
            self.proc = subprocess.Popen(
                self.command(self.port),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                cwd=self.cwd,
            )
        else:
            with open(self.log, "ab") as out:
                self.proc = subprocess.Popen(
                    self.command(self.port),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=self.cwd,
                )
        self.base = f"http://127.0.0.1:{self.port}"
        try:
            wait_ready(self.base, self.proc, self.log, self.ready)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} is not running"
        return self.proc.pid

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()


def alternate(sides: Sequence[T], reps: int, run: Callable[[T, int], Any]) -> list[list[Any]]:
    """`run(side, rep)` for each rep on every side, a list of results a side. The order
    rotates rep by rep, so each side goes first as often as the others and a slow minute of
    the machine falls on all of them alike."""
    out: list[list[Any]] = [[] for _ in sides]
    for rep in range(reps):
        for i in range(len(sides)):
            k = (i + rep) % len(sides)
            out[k].append(run(sides[k], rep))
    return out


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def percentile(values: Iterable[float], q: float) -> float:
    """The `q` quantile of `values` by nearest rank (NaN for none)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def paired(ours: Sequence[float], theirs: Sequence[float]) -> list[float]:
    """Rep by rep, ours over theirs (rep i of each ran side by side); reps where theirs is 0
    are left out."""
    return [a / b for a, b in zip(ours, theirs, strict=True) if b]


def spread(ratios: Sequence[float]) -> str:
    """The range of the reps' own ratios, or nothing for a single rep."""
    return f"{min(ratios):.2f}-{max(ratios):.2f}" if len(ratios) > 1 else ""


@dataclass
class Row:
    """One measure of oars against one reference: medians of the reps, and each rep's ratio.
    `target` names the rows `bench.run` reports as the product's targets."""

    measure: str
    oars: float
    reference: float
    unit: str = ""
    digits: int = 3
    ratios: list[float] = field(default_factory=list)
    against: str = "reference"
    target: str = ""

    @property
    def ratio(self) -> float:
        return self.oars / self.reference if self.reference else float("nan")

    @classmethod
    def of(
        cls,
        measure: str,
        oars: Sequence[float],
        reference: Sequence[float],
        unit: str = "",
        digits: int = 3,
        target: str = "",
    ) -> Row:
        """Medians of the reps, and each rep's ratio (the reps alternated the two sides, so
        rep i of each ran side by side)."""
        return cls(
            measure,
            median(oars),
            median(reference),
            unit,
            digits,
            paired(oars, reference),
            target=target,
        )


def table(rows: Sequence[Row], reference: str = "reference") -> str:
    """The rows as a markdown table: oars, the reference, the ratio of the medians and the
    spread of the reps' ratios. With several references, each row names its own."""
    references = list(dict.fromkeys(row.against for row in rows))
    lines = [
        f"| measure | oars | {reference} | oars / {reference} | rep by rep |",
        "|---|---|---|---|---|",
    ]
    for row in sorted(rows, key=lambda row: references.index(row.against)):
        unit = f" {row.unit}" if row.unit else ""
        measure = row.measure if len(references) == 1 else f"{row.measure} (vs {row.against})"
        lines.append(
            f"| {measure} | {row.oars:,.{row.digits}f}{unit} | "
            f"{row.reference:,.{row.digits}f}{unit} | {row.ratio:.2f} | {spread(row.ratios)} |"
        )
    return "\n".join(lines)


def columns(heading: str, names: Sequence[str], found: Mapping[str, Mapping[str, float]]) -> str:
    """A markdown table with a column for each of `names` and a row for each measure any of
    them has (`found[name][measure]`), under `heading`."""
    out = [f"\n{heading}\n", "| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for measure in dict.fromkeys(k for values in found.values() for k in values):
        cells = (found[name].get(measure, float("nan")) for name in names)
        out.append(f"| {measure} | " + " | ".join(f"{c:,.2f}" for c in cells) + " |")
    return "\n".join(out)


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of a process, by thread id (Linux `/proc`)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # ended since the listing
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out

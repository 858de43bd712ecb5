"""llama.cpp's forward passes in oars and in llama-server, timed from outside both processes.

    sudo .venv/bin/python -m bench.probe [--reps 2] [--loads 1,4,16] [--bare]

`bench.vs_llama_server --account` reads each pass back from the servers' debug logs, and those
logs slow both servers (llama-server's most: its time between passes triples). Here nothing in
either server changes: a uprobe on the entry and on the return of `llama_context::decode` (the
function every `llama_decode` of both ends in) is placed in the wheel's `libllama.so` and in the
`llama-server` binary, and `perf record` keeps the times of both while each load runs on one
server (the loads and servers of `bench.vs_llama_server`, alternating rep by rep). A pass is an
entry to its return; the time between passes is a return to the next entry (gaps over 20 ms are
idle waits, not counted). `sched:sched_switch` is recorded with them, so the account also
says who had the two CPUs during a pass and between passes (`occupancy`): the thread that called
decode, llama.cpp's other compute thread, the server's other threads (oars's event loop,
llama-server's HTTP threads), the bench's clients, other processes, or nobody; and how long a
pass ran before llama.cpp's other compute thread got a CPU (`late`: until then the pass has one
thread, and the other CPU does what woke at its start).

`--bare` adds a load with no server on oars's side: a bare Python loop of one-token passes (the
argmax fed back) through oars's `LlamaContext`, in a process of its own, against llama-server's
one stream, so llama.cpp's passes in a Python process are seen with nothing beside them.

On oars's side, the time between passes so measured includes what Python does around the call
(the batch, sampling, the hand-over to the event loop, and anything that takes the engine
thread's core before llama.cpp starts), which `bench.overhead` cannot see.

Needs Linux with tracefs (root) and `perf`.
"""

from __future__ import annotations

import argparse
import bisect
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import vs_llama_server as vs
from oars.weights import pull

# llama_context::decode(llama_batch_ext const&), where both servers' decode calls end up
SYMBOL = "_ZN13llama_context6decodeERK15llama_batch_ext"
UPROBES = Path("/sys/kernel/tracing/uprobe_events")
GAP_LIMIT_MS = 20.0
_LINE = re.compile(r"\s*(\d+)\s+(?:\[\d+\]\s+)?([\d.]+):\s+(\w+):(enter|leave):")
_SWITCH = re.compile(
    r"\s*\d+\s+\[(\d+)\]\s+([\d.]+):\s+sched:sched_switch:.* prev_pid=(\d+) .*==> .* next_pid=(\d+) "
)


def _offset(binary: Path) -> int:
    """Where SYMBOL starts in the file. A uprobe wants a file offset; in these builds the text's
    addresses are its offsets (if not, a server's load shows no passes)."""
    dynamic = ["-D"] if binary.suffix == ".so" or ".so." in binary.name else []
    out = subprocess.run(["nm", *dynamic, str(binary)], capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == SYMBOL and parts[1] in "Tt":
            return int(parts[0], 16)
    raise SystemExit(f"{binary}: no {SYMBOL} (another llama.cpp version?)")


def _define(line: str) -> None:
    """One uprobe definition (tracefs takes one a write)."""
    fd = os.open(UPROBES, os.O_WRONLY | os.O_APPEND)  # no seek: tracefs refuses it
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


class Probes:
    """A uprobe at SYMBOL's entry and return in each binary, one event group each."""

    def __init__(self, binaries: dict[str, Path]) -> None:
        self.groups = list(binaries)
        for group, binary in binaries.items():
            where = f"{binary.resolve()}:{_offset(binary):#x}"
            _define(f"p:{group}/enter {where}")
            _define(f"r:{group}/leave {where}")

    def close(self) -> None:
        for group in self.groups:
            _define(f"-:{group}/enter")
            _define(f"-:{group}/leave")

    def record(self, out: Path) -> subprocess.Popen[bytes]:
        events = [arg for group in self.groups for arg in ("-e", f"{group}:*")]
        events += ["-e", "sched:sched_switch"]  # what each CPU runs, for `occupancy`
        perf = subprocess.Popen(["perf", "record", "-q", "-a", "-o", str(out), *events])
        time.sleep(1.0)  # perf is tracing by then
        return perf


@dataclass
class Passes:
    """The passes of one load on one server, and the times between them, each as (thread,
    from, to) in ms of perf's clock."""

    windows: list[tuple[int, float, float]] = field(default_factory=list)
    gap_windows: list[tuple[int, float, float]] = field(default_factory=list)

    @property
    def passes(self) -> list[float]:
        """Each pass's ms."""
        return [end - start for _, start, end in self.windows]

    @property
    def gaps(self) -> list[float]:
        """Each time between two passes, ms."""
        return [end - start for _, start, end in self.gap_windows]


def read(text: str) -> dict[str, Passes]:
    """`perf script -F tid[,cpu],time,event` output → the passes of each group (by thread: a pass
    starts and ends on the thread that called decode)."""
    opened: dict[tuple[str, int], float] = {}
    ended: dict[tuple[str, int], float] = {}
    out: dict[str, Passes] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        tid, at, group, edge = int(m[1]), float(m[2]) * 1000, m[3], m[4]
        key, found = (group, tid), out.setdefault(group, Passes())
        if edge == "enter":
            last = ended.get(key)
            if last is not None and at - last < GAP_LIMIT_MS:
                found.gap_windows.append((tid, last, at))
            opened[key] = at
        elif key in opened:
            found.windows.append((tid, opened.pop(key), at))
            ended[key] = at
    return out


# Who had each CPU, ms a pass: the thread that called decode, llama.cpp's other compute thread
# (the server's thread that ran longest inside passes), the server's other threads, the
# bench's clients, any other process, and nothing.
ROLES = ("calling thread", "llama.cpp's other thread", "server's other threads", "bench's clients",
         "other processes", "idle")  # fmt: skip


def switches(text: str) -> dict[int, list[tuple[int, float, float]]]:
    """`perf script -F tid,cpu,time,event,trace` lines of sched_switch → for each CPU, who ran
    on it from when to when (tid, start, end), in order; 0 is the idle task. Who a CPU last
    switched to runs until the last switch seen on any CPU."""
    since: dict[int, tuple[int, float]] = {}  # a CPU's last switch: to whom, when
    out: dict[int, list[tuple[int, float, float]]] = {}
    last = 0.0
    for line in text.splitlines():
        m = _SWITCH.match(line)
        if m is None:
            continue
        cpu, at, prev, to = int(m[1]), float(m[2]) * 1000, int(m[3]), int(m[4])
        if cpu in since:
            out.setdefault(cpu, []).append((prev, since[cpu][1], at))
        since[cpu], last = (to, at), max(last, at)
    for cpu, (tid, at) in since.items():
        if at < last:
            out.setdefault(cpu, []).append((tid, at, last))
    return out


def held(
    windows: list[tuple[int, float, float]], cpus: dict[int, list[tuple[int, float, float]]]
) -> list[dict[int, float]]:
    """For each window, the ms each thread had a CPU within it (the window's own thread as -1)."""
    ends = {cpu: [r[2] for r in runs] for cpu, runs in cpus.items()}
    out = []
    for caller, start, end in windows:
        had: dict[int, float] = {}
        for cpu, runs in cpus.items():
            i = bisect.bisect_right(ends[cpu], start)  # the first run ending after start
            while i < len(runs) and runs[i][1] < end:
                tid, a, b = runs[i]
                tid = -1 if tid == caller else tid
                had[tid] = had.get(tid, 0.0) + min(b, end) - max(a, start)
                i += 1
        out.append(had)
    return out


def partner(passes: list[dict[int, float]], server: set[int]) -> int | None:
    """llama.cpp's other compute thread: the server's thread, other than the one calling decode,
    that had the CPUs longest during the passes (`held` of them)."""
    inside: dict[int, float] = {}
    for had in passes:
        for tid, ms in had.items():
            if tid in server:
                inside[tid] = inside.get(tid, 0.0) + ms
    return max(inside, key=inside.__getitem__, default=None)


def late(
    windows: list[tuple[int, float, float]],
    cpus: dict[int, list[tuple[int, float, float]]],
    thread: int | None,
) -> list[float]:
    """For each window, the ms from its start until `thread` had a CPU: 0 if it had one at the
    start, the window's whole length if it had none in it. Of passes and llama.cpp's other
    compute thread: how long a pass ran on one thread before the other took part. None (no
    such thread was found): nothing to say."""
    if thread is None:
        return []
    runs = sorted((a, b) for on_cpu in cpus.values() for tid, a, b in on_cpu if tid == thread)
    ends = [b for _, b in runs]
    out = []
    for _, start, end in windows:
        i = bisect.bisect_right(ends, start)  # its first run ending after the window starts
        first = runs[i][0] if i < len(runs) else end
        out.append(min(max(first, start), end) - start)
    return out


def occupancy(
    windows: list[dict[int, float]], server: set[int], bench: set[int], other: int | None
) -> dict[str, float]:
    """Over `windows` (`held` of passes, or of the times between them), the CPU ms each role
    (ROLES) had, summed over all CPUs and all windows: per window they add up to its time × the
    CPUs. `other` is llama.cpp's other compute thread (`partner`)."""
    totals = dict.fromkeys(ROLES, 0.0)
    for had in windows:
        for tid, ms in had.items():
            if tid == -1:
                role = ROLES[0]
            elif tid == other:
                role = ROLES[1]
            elif tid in server:
                role = ROLES[2]
            elif tid in bench:
                role = ROLES[3]
            elif tid == 0:
                role = ROLES[5]
            else:
                role = ROLES[4]
            totals[role] += ms
    return totals


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def summary(found: Passes) -> dict[str, float]:
    p, g = found.passes, found.gaps
    quartiles = statistics.quantiles(p, n=4) if len(p) > 1 else [math.nan] * 3
    return {
        "passes": len(p),
        "pass ms, 25th percentile": quartiles[0],
        "pass ms, median": _median(p),
        "pass ms, 75th percentile": quartiles[2],
        "pass ms (sum)": sum(p),
        "between passes ms, median": _median(g),
        "between passes ms (sum)": sum(g),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--loads", default="1,4,16", help="concurrent streams of each load")
    parser.add_argument("--tokens", type=int, default=128, help="output tokens (1 and 4 streams)")
    parser.add_argument("--tokens16", type=int, default=48, help="output tokens (more streams)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--ctx", type=int, default=16384)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--llama-server", type=Path, default=vs.LLAMA_SERVER)
    parser.add_argument("--llama-args", default="", help="more arguments for llama-server")
    parser.add_argument("--bare", action="store_true", help="also a bare loop of passes")
    args = parser.parse_args()
    if not args.llama_server.exists():
        sys.exit(f"{args.llama_server} is missing: run `make llama-server` first")
    import llama_cpp

    libllama = Path(llama_cpp.__file__).parent / "lib" / "libllama.so"
    setup = argparse.Namespace(
        threads=args.threads,
        account=False,
        ctx=args.ctx,
        oars_args="",
        llama_args=[args.llama_args],
        llama_server=args.llama_server,
        parallel=args.parallel,
        oars_env=[],
    )
    probes = Probes({"oars_pass": libllama, "llama_server_pass": args.llama_server})
    with tempfile.TemporaryDirectory(prefix="oars-probe-") as tmp:
        servers = vs._servers(setup, pull(), Path(tmp))
        group = {servers[0].name: "oars_pass", servers[1].name: "llama_server_pass"}
        try:
            for server in servers:
                server.start()
                server.one(vs._chat("warm-up", 20, "Say hello."), 4)
            print(_account(args, servers, probes, group, Path(tmp)))
            if args.bare:
                print(_bare(args, servers[1], probes, Path(tmp)))
        finally:
            for server in servers:
                server.stop()
            probes.close()


def _stop(perf: subprocess.Popen[bytes], data: Path) -> str:
    """Stop a `Probes.record` and read back what it kept (`read` and `switches` take it)."""
    perf.send_signal(signal.SIGINT)
    perf.wait()
    fields = "tid,cpu,time,event,trace"
    script = ["perf", "script", "-i", str(data), "-F", fields]
    return subprocess.run(script, capture_output=True, text=True, check=True).stdout


@dataclass
class Rep:
    """One rep of a load on one server, as the probes saw it."""

    wall: float  # s
    tokens: int  # output tokens of its streams
    passes: Passes
    cpu: dict[str, dict[str, float]]  # "in a pass" / "between" → `occupancy`
    waits: list[float]  # `late` of its passes


def _account(
    args: argparse.Namespace,
    servers: vs.Servers,
    probes: Probes,
    group: dict[str, str],
    tmp: Path,
) -> str:
    """Each load `--reps` times on each server (alternating), its passes from the probes."""
    out = []
    for streams in (int(n) for n in args.loads.split(",")):
        tokens = args.tokens if streams <= 4 else args.tokens16

        def run(server: vs.Server, rep: int, streams: int = streams, tokens: int = tokens) -> Rep:
            data = tmp / "perf.data"
            perf = probes.record(data)
            began = time.perf_counter()
            done = server.many(vs._counting(f"probe {rep} {streams}", streams), tokens)
            wall = time.perf_counter() - began
            text = _stop(perf, data)
            assert server.proc is not None
            theirs = read(text).get(group[server.name], Passes())
            cpus = switches(text)
            ours, bench = set(vs._thread_cpu(server.proc.pid)), set(vs._thread_cpu(os.getpid()))
            passes, gaps = held(theirs.windows, cpus), held(theirs.gap_windows, cpus)
            other = partner(passes, ours)
            cpu = {
                where: occupancy(windows, ours, bench, other)
                for where, windows in (("in a pass", passes), ("between", gaps))
            }
            waits = late(theirs.windows, cpus, other)
            return Rep(wall, sum(s.output_tokens for s in done), theirs, cpu, waits)

        found = {}
        for server, reps in zip(servers, vs._alternate(servers, args.reps, run), strict=True):
            merged = Passes(
                [w for r in reps for w in r.passes.windows],
                [w for r in reps for w in r.passes.gap_windows],
            )
            waits = [ms for r in reps for ms in r.waits]
            counts = {"in a pass": len(merged.windows), "between": len(merged.gap_windows)}
            means = {  # the CPU ms a role had in a pass (between two), over all the reps
                f"{where}, CPU ms: {role}": sum(r.cpu[where][role] for r in reps) / (n or 1)
                for where, n in counts.items()
                for role in ROLES
            }
            found[server.name] = {
                "wall s, all reps": sum(r.wall for r in reps),
                "output tokens, all reps": sum(r.tokens for r in reps),
                **summary(merged),
                "a pass's start to llama.cpp's other thread's, ms, median": _median(waits),
                "a pass's start to llama.cpp's other thread's, ms, mean": _mean(waits),
                **means,
            }
        heading = f"{streams} stream(s) of {tokens} tokens, {args.reps} reps"
        out += vs.account_table(heading, [s.name for s in servers], found)
    return "\n".join(out)


# The bare loop's process: a prompt of 100 tokens, then `tokens` passes of one token each (the
# last pass's argmax fed back), started by a line on stdin once the model is loaded.
BARE = """
import sys
import llama_cpp
from bench.kernels import raw_context
from oars.engines.batching import Feed
path, tokens, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
context = raw_context(llama_cpp, path, repack=False, n_seq=4, n_ctx_seq=16384, threads=threads)
context.decode([Feed(0, list(range(1000, 1100)), 0, True)])
print("ready", flush=True)
sys.stdin.readline()
token = int(context.logits(0).argmax())
for pos in range(100, 100 + tokens):
    context.decode([Feed(0, [token], pos, True)])
    token = int(context.logits(0).argmax())
print("done", flush=True)
"""


def _bare(args: argparse.Namespace, server: vs.Server, probes: Probes, tmp: Path) -> str:
    """The bare loop against `server`'s single stream, `--reps` times each, alternating."""
    data, found = tmp / "perf.data", {"bare loop": Passes(), server.name: Passes()}
    for rep in range(args.reps):
        child = subprocess.Popen(
            [sys.executable, "-c", BARE, str(pull()), str(args.tokens), str(args.threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert child.stdin is not None and child.stdout is not None
        child.stdout.readline()
        for who in found:
            perf = probes.record(data)
            if who == server.name:
                server.many(vs._counting(f"bare {rep}", 1), args.tokens)
            else:
                child.stdin.write("\n")
                child.stdin.flush()
                child.stdout.readline()
            text = _stop(perf, data)
            group = "oars_pass" if who == "bare loop" else "llama_server_pass"
            got = read(text).get(group, Passes())
            found[who].windows += got.windows[1:] if who == server.name else got.windows
            found[who].gap_windows += got.gap_windows
        child.wait()
    heading = (
        f"one token a pass: a bare loop against 1 stream, {args.tokens} tokens, {args.reps} reps"
    )
    rows = {who: summary(passes) for who, passes in found.items()}
    return "\n".join(vs.account_table(heading, list(found), rows))


if __name__ == "__main__":
    main()

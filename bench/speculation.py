"""Speculative decoding from the context (issue 50): oars as it ships against llama-server as it
ships and llama-server with its own n-gram speculation on, on an agent's work.

    make llama-server     # once
    .venv/bin/python -m bench.speculation [--reps 3] [--tokens 200] [--against off,…] [--workloads chat,…]

Four servers live for the whole run, on the default model with the same threads, but only one
is driven at a time, the order rotating rep by rep: oars as it ships (`--speculation auto`), oars
`--speculation off`, llama-server as it ships (speculation off), and llama-server
`--spec-default` (its n-gram drafts). Each gets the same messages (each renders them with the
GGUF's template), greedy, streamed; oars is asked `POST /v1/responses`, llama-server `POST
/v1/chat/completions`. The workloads (`bench.prompts`):

- patch: an apply_patch edit of one function of a ~150-line file given in the prompt;
- rewrite: a ~60-line file given whole again with one function renamed;
- tool call: a call naming paths from a 36-path listing, as JSON text;
- chat: a short explanation, three a rep, one after another (its figure their median: one
  stream's chat moves ±15 % from one ask to the next on two cores, and its goal is 0.98);
- 4 edit streams: four patches of four functions of that file at once (aggregate tok/s).

Every figure is decode tok/s (output tokens after the first over the time from the first text
delta to the last; for 4 streams, all their tokens over the wall time), the median of the reps,
and the ratio oars / the reference with the range of the reps' own ratios. Each rep asks
anew (another function to edit or name, other modules, other questions; hence at most 6 reps),
so no server replays an earlier reply of its own (llama-server's n-gram drafts are shared
across requests), while each prompt shares the file with the rep before: the figures are
decode. Each server's drafts (oars's from its `/metrics`, llama-server's from its timings) are
reported per workload, summed over reps.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
from pathlib import Path

import httpx

from bench.clients import RESPONSES, Endpoint, Stream, aggregate
from bench.prompts import EXAMPLE_PATCH, NOUNS, WORKLOADS, Chat, edit
from bench.servers import Row, alternate, median, table
from bench.vs_llama_server import LLAMA_SERVER, Setup

SYSTEM = {"role": "system", "content": "You are a careful coding assistant."}
CALL = ' Reply with only the call, as JSON: {"name": "read_files", "arguments": {"paths": [...]}}'
EDITABLE = [noun for noun in NOUNS if noun not in EXAMPLE_PATCH]  # not the example's function
NAMES = ("read_rows", "fetch_rows", "csv_rows", "rows_in", "parse_rows", "table_rows")
ASKED = 3  # chats a rep: one stream's chat moves ±15 % from one ask to the next on two cores
MAX_REPS = len(NAMES)  # past it, a rep would ask what an earlier one did (`chats`)
QUESTIONS = (  # three a rep, none asked twice in `MAX_REPS`; each answered in 50-160 tokens
    "why does a Python dict lookup take constant time?",
    "what does a Python generator do that a list does not?",
    "why are Python strings immutable?",
    "what is the difference between a process and a thread?",
    "why does a hash table need a good hash function?",
    "what does a database index make faster, and what slower?",
    "why does a TCP connection start with a handshake?",
    "what does a Python decorator do?",
    "why is floating-point addition not associative?",
    "what does a lock protect in a multithreaded program?",
    "why does each Git commit record its parent commit?",
    "how does a Python closure keep the variables it uses?",
    "why does a CPU have caches?",
    "what does garbage collection do in Python?",
    "why do databases write a log before changing their tables?",
    "why would a Python program use a tuple rather than a list?",
    "why does binary search need a sorted list?",
    "what does an HTTP status code of 404 mean?",
)


# oars --speculation off, and llama-server with each of these flags
REFERENCES = {"off": "", "llama-server": "", "spec-default": "--spec-default"}


def chats(rep: int) -> dict[str, list[list[Chat]]]:
    """Each workload's asks for rep `rep` (one, or for chat `ASKED` one after another), each
    ask its chats run at once (one, or four): new each rep (another function and another change
    to make, another name, other modules to read, other questions), so that no server drafts a
    reply from its own earlier one."""
    modules = [EDITABLE[(3 * rep + i) % len(EDITABLE)] for i in (1, 2)]  # for the tool call
    # five edits a rep (the patch's and the four streams'), no function with one change twice
    edits = [(EDITABLE[k % len(EDITABLE)], k // len(EDITABLE)) for k in range(5 * rep, 5 * rep + 5)]
    one = {
        "patch": edit(*edits[0]),
        "rewrite": WORKLOADS["rewrite"][0].replace("read_rows", NAMES[rep % len(NAMES)]),
        "tool call": WORKLOADS["tool call"][0].replace(
            "of refund and ledger", f"of {modules[0]} and {modules[1]}"
        )
        + CALL,
    }
    out = {name: [[[SYSTEM, {"role": "user", "content": text}]]] for name, text in one.items()}
    questions = QUESTIONS[ASKED * rep : ASKED * (rep + 1)]
    out["chat"] = [
        [[SYSTEM, {"role": "user", "content": f"In a short paragraph: {question}"}]]
        for question in questions
    ]
    out["4 edit streams"] = [
        [[SYSTEM, {"role": "user", "content": edit(*each)}] for each in edits[1:]]
    ]
    return out


def drafts(endpoint: Endpoint) -> tuple[float, float]:
    """oars's draft tokens verified and accepted so far, from its `/metrics`."""
    text = httpx.get(f"{endpoint.server.base}/metrics", timeout=10).text
    found = dict(re.findall(r"^(oars_draft_tokens\w*)_total\{[^}]*\} (\S+)$", text, re.M))
    drafted, accepted = (found.get(f"oars_draft_tokens{k}", "0") for k in ("", "_accepted"))
    return float(drafted), float(accepted)


def figure(asks: list[list[Stream]]) -> float:
    """The median over the asks of one stream's decode tok/s, or of several streams' aggregate."""
    return median(s[0].decode_tps if len(s) == 1 else aggregate(s) for s in asks)


def main() -> None:
    every = list(chats(0))  # the workloads, in the order they run each rep
    options = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    options.add_argument("--reps", type=int, default=3, help=f"at most {MAX_REPS}")
    options.add_argument("--tokens", type=int, default=200, help="output tokens at most")
    options.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    options.add_argument(
        "--against",
        default=",".join(REFERENCES),
        help=f"the references, of {', '.join(REFERENCES)} (oars off alone: how far apart two "
        "servers of the same engine land where nothing is drafted)",
    )
    options.add_argument("--workloads", default=",".join(every), help="of " + ", ".join(every))
    args = options.parse_args()
    against = args.against.split(",")
    names = args.workloads.split(",")
    if not 1 <= args.reps <= MAX_REPS:
        raise SystemExit(f"--reps: 1 to {MAX_REPS} (past it, a rep would ask what one did before)")
    if unknown := set(against) - set(REFERENCES) or set(names) - set(every):
        raise SystemExit(f"unknown: {', '.join(sorted(unknown))}")
    if not LLAMA_SERVER.exists() and set(against) - {"off"}:
        raise SystemExit(f"{LLAMA_SERVER} is missing: run `make llama-server` first")
    from oars.weights import pull

    with tempfile.TemporaryDirectory(prefix="oars-speculation-") as tmp:
        home = Path(tmp)
        same = {"model": pull(), "ctx": 4096, "threads": args.threads}
        # (at info, the log says what a pass costs, as the server measured it at its start)
        info = "--log-level info"
        flags = tuple(REFERENCES[name] for name in REFERENCES if name != "off" and name in against)
        oars, *llama = Setup(home=home, oars_args=info, llama_args=flags, **same).endpoints()
        (home / "off").mkdir()
        off = Setup(home=home / "off", oars_args=f"--speculation off {info}", **same)
        oars_off = off.endpoints()[0]
        oars_off.server.name = "oars --speculation off"
        endpoints = (oars, *[oars_off] * ("off" in against), *llama)
        # each server's draft tokens verified and accepted, by workload: oars's from its
        # metrics, llama-server's from its timings
        counted = {e.name: {name: [0.0, 0.0] for name in names} for e in endpoints}

        def rep(endpoint: Endpoint, n: int) -> dict[str, float]:
            out, asked, ours = {}, chats(n), endpoint.dialect is RESPONSES
            for name in names:
                before = drafts(endpoint) if ours else (0.0, 0.0)
                streams = [endpoint.many(ask, args.tokens) for ask in asked[name]]
                out[name] = figure(streams)
                every = [s for ask in streams for s in ask]
                after = (
                    drafts(endpoint)
                    if ours
                    else (sum(s.drafted for s in every), sum(s.accepted for s in every))
                )
                tally = counted[endpoint.name][name]
                tally[0] += after[0] - before[0]
                tally[1] += after[1] - before[1]
            return out

        for endpoint in endpoints:
            endpoint.server.start()
        try:
            for endpoint in endpoints:  # a first request of each kind, before any is timed
                endpoint.many([[SYSTEM, {"role": "user", "content": "Say hello."}]], 4)
            results = alternate(endpoints, args.reps, rep)
        finally:
            for endpoint in endpoints:
                endpoint.server.stop()
        log = (home / "oars.log").read_text(errors="replace").splitlines()
        curve = next((line for line in log if "speculation: a pass" in line), "no curve logged")
    rows = []
    for reference, theirs in zip(endpoints[1:], results[1:], strict=True):
        for name in names:
            ours = [r[name] for r in results[0]]
            row = Row.of(f"{name}: tok/s", ours, [r[name] for r in theirs], "", 1)
            row.against = reference.name
            rows.append(row)
    print(f"oars (defaults) against each reference, median of {args.reps} alternating reps\n")
    print(table(rows, "reference"))
    print()
    for server, tallies in counted.items():
        if any(d for d, _ in tallies.values()):
            accepted = (f"{name} {int(a)}/{int(d)}" for name, (d, a) in tallies.items())
            print(f"{server}: draft tokens accepted, all reps: " + ", ".join(accepted))
    print(f"oars's {curve.split('oars.engine: ')[-1]}")


if __name__ == "__main__":
    main()

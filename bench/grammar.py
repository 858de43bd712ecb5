"""What a custom tool's grammar costs while the model writes its input: the token mask's time per
token, following a real `apply_patch` call on the default model's vocabulary (no model run).

    .venv/bin/python -m bench.grammar [--reps N] [--model]

With `--model`, also end to end: the default model writes a forced `apply_patch` call in this
process (the embedded engine, greedy, 160 tokens), with the grammar and without, alternating;
decode tokens/s after the first token, so prefill is not in it.

The call grammar is the one a forced `apply_patch` call gets (Codex's Lark grammar, as a
client sends it). The reference is the same call to a custom tool without a grammar (its input
any JSON string), measured in the same process. Each run builds a fresh matcher, as each
request does, so the first masks pay for building the lexer's states as a request would. Per
token: computing the mask of allowed next tokens, then consuming the token the text has there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from oars.engines.grammar import Grammars, limits
from oars.families import Constraint, GrammarKind
from oars.families.hermes import call_grammar
from oars.tools import parse_tools
from oars.weights import DEFAULT_MODEL, pull

GRAMMAR = Path(__file__).with_name("apply_patch.lark")  # as Codex sends it
DECODE_STEP_MS = 30.0  # one decode step of the default model on a small CPU (about 33 tok/s)

PATCH = r"""*** Begin Patch
*** Update File: src/report.py
@@ def render(rows):
     out = []
     for row in rows:
-        out.append("%s\t%s" % (row.name, row.value))
+        name = row.name.replace("\\", "\\\\").replace('"', '\\"')
+        out.append(f'"{name}"\t{row.value!r}')
     return "\n".join(out)
@@ def main():
-    print(render(load("C:\\data\\in.csv")))
+    rows = load(sys.argv[1] if len(sys.argv) > 1 else "C:\\data\\in.csv")
+    print(render(rows), file=sys.stdout)
*** Add File: tests/test_report.py
+import report
+
+
+def test_quotes_and_tabs():
+    row = report.Row(name='say "hi"', value=1)
+    assert report.render([row]) == '"say \\"hi\\""\t1'
+
+
+def test_backslashes():
+    row = report.Row(name="a\\b", value=2.5)
+    assert "\\\\" in report.render([row])
*** Delete File: src/old_report.py
*** End Patch
"""


def _tool(grammar: bool) -> dict[str, Any]:
    tool: dict[str, Any] = {"type": "custom", "name": "apply_patch"}
    if grammar:
        tool["format"] = {"type": "grammar", "syntax": "lark", "definition": GRAMMAR.read_text()}
    return tool


def _compiled(grammars: Grammars, grammar: bool) -> str:
    tools = parse_tools([_tool(grammar)])
    source = call_grammar(tools, many=False, compact=True)
    return grammars.compile(Constraint(GrammarKind.LARK, source, param="tools"))


def _follow(grammars: Grammars, grammar: str, tokens: list[int], n_vocab: int) -> list[float]:
    """Milliseconds per token: the mask, then consuming the token (one fresh matcher)."""
    from llguidance import LLMatcher
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

    matcher = LLMatcher(grammars.tokenizer, grammar, log_level=0, limits=limits())
    bitmask = allocate_token_bitmask(1, n_vocab)
    times = []
    for token in tokens:
        start = time.perf_counter()
        fill_next_token_bitmask(matcher, bitmask, 0)
        allowed = bitmask[0, token // 32] >> (token % 32) & 1
        ok = matcher.consume_token(token)
        times.append((time.perf_counter() - start) * 1000)
        assert allowed and ok, f"the grammar refused token {token}: {matcher.get_error()}"
    assert matcher.is_accepting(), "the call is complete"
    return times


def _row(name: str, times: list[float]) -> tuple[str, float]:
    cuts = statistics.quantiles(times, n=100)
    mean = statistics.fmean(times)
    print(
        f"| {name} | {mean:.3f} | {cuts[49]:.3f} | {cuts[89]:.3f} | {cuts[98]:.3f} | "
        f"{max(times):.2f} | {mean / DECODE_STEP_MS:.1%} |"
    )
    return name, mean


def _decode_rate(engine: Any, grammar: bool) -> float:
    """Tokens/s of one forced apply_patch call, after its first token."""
    from oars.normalize import normalize
    from oars.turn import Turn

    body = {
        "instructions": "You edit code by calling apply_patch.",
        "input": "In src/report.py, quote names in render() and add a test file.",
        "tools": [_tool(grammar)],
        "tool_choice": {"type": "custom", "name": "apply_patch"},
        "max_output_tokens": 160,
        "temperature": 0,
    }

    async def run() -> float:
        opened = await engine.open(Turn.of(normalize(body, served_model="m")).engine_request())
        first, tokens = None, 0
        async for chunk in engine.generate(opened):
            if first is None and chunk.num_tokens:
                first = time.perf_counter()
            elif first is not None:
                tokens += chunk.num_tokens
        assert first is not None
        return tokens / (time.perf_counter() - first)

    return asyncio.run(run())


def _end_to_end(reps: int) -> None:
    from oars.engines.llama import LlamaEngine
    from oars.settings import EngineSettings

    engine = LlamaEngine(pull(), EngineSettings(context=4096), gpu_layers=0, prefix_folder=None)
    rates: dict[bool, list[float]] = {False: [], True: []}
    _decode_rate(engine, True)  # warm: the grammar tokenizer, the first masks
    for _ in range(reps):
        for grammar in (False, True):
            rates[grammar].append(_decode_rate(engine, grammar))
    free, patch = statistics.median(rates[False]), statistics.median(rates[True])
    print()
    print(
        f"End to end, {reps} runs each, median decode tok/s: any JSON string {free:.1f}, "
        f"apply_patch grammar {patch:.1f}: **{patch / free:.3f}×**"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--model", action="store_true", help="also decode with the model")
    args = parser.parse_args()
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(pull()), vocab_only=True, verbose=False)
    n_vocab = llm.n_vocab()
    grammars = Grammars(llama_cpp.llama_model_get_vocab(llm.model), n_vocab)
    call = json.dumps({"name": "apply_patch", "arguments": {"input": PATCH}}, ensure_ascii=False)
    tokens = llm.tokenize(call.encode(), add_bos=False, special=False)
    plain, patch = _compiled(grammars, False), _compiled(grammars, True)
    runs: dict[str, list[float]] = {"free": [], "patch": []}
    for _ in range(args.reps):  # alternating, so that machine noise hits both alike
        runs["free"] += _follow(grammars, plain, tokens, n_vocab)
        runs["patch"] += _follow(grammars, patch, tokens, n_vocab)
    print(
        f"{DEFAULT_MODEL.name}: a forced apply_patch call of {len(tokens)} tokens "
        f"({len(PATCH)} characters of patch), {args.reps} runs, a fresh matcher each"
    )
    print()
    print("| input constraint | mean ms/token | p50 | p90 | p99 | max | mean / 30 ms step |")
    print("|---|---|---|---|---|---|---|")
    _, free = _row("any JSON string (reference)", runs["free"])
    _, patch_mean = _row("Codex's apply_patch Lark grammar", runs["patch"])
    implied = (DECODE_STEP_MS + free) / (DECODE_STEP_MS + patch_mean)
    print(
        f"| **implied decode speed, grammar / reference, at {DECODE_STEP_MS:.0f} ms a step** "
        f"| **{implied:.3f}** | | | | | |"
    )
    if args.model:
        _end_to_end(args.reps)


if __name__ == "__main__":
    main()

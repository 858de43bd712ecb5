"""The prompts the benches send: reproducible from a seed, new from their first token (so no
server finds them in a cache unless the bench means it to), and the same on every server
compared, which each renders with the GGUF's own chat template."""

from __future__ import annotations

import random
from typing import Any

Chat = list[dict[str, str]]
COUNT = "Count from 1 to 300, separated by commas, and nothing else."
WORDS = (
    "alpha",
    "batch",
    "cache",
    "delta",
    "engine",
    "filter",
    "gamma",
    "handler",
    "index",
    "jitter",
    "kernel",
    "lambda",
    "matrix",
    "node",
    "offset",
    "parser",
    "queue",
    "router",
    "stream",
    "tensor",
    "update",
    "vector",
    "worker",
    "buffer",
    "commit",
    "socket",
    "thread",
    "module",
    "import",
    "return",
    "value",
    "config",
    "branch",
)


def filler(rng: random.Random, num_tokens: int) -> str:
    """Lines of random words, about `num_tokens` tokens: each word is one token of the default
    model's tokenizer, a line 14 (the servers report the exact counts)."""
    lines = (" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(num_tokens // 14 or 1))
    return "\n".join(f"- {line}." for line in lines)


def chat(seed: str, num_tokens: int, user: str) -> Chat:
    """A system prompt of about `num_tokens`, unique to `seed` from its first token, and `user`."""
    notes = filler(random.Random(seed), num_tokens)
    system = f"Session {seed}. You are a helpful assistant. Notes:\n{notes}"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def counting(seed: str, num_chats: int) -> list[Chat]:
    """`num_chats` short chats, each asking for a long count (a decode of as many tokens as
    the bench asks for)."""
    return [chat(f"{seed} {i}", 20, COUNT) for i in range(num_chats)]


def conversation(seed: str) -> Chat:
    """~2,000 tokens of an agent's session: a system prompt and three earlier turns."""
    turns = chat(seed, 1100, "Read the notes and list the ones about the parser.")
    rng = random.Random(f"{seed} turns")
    for n in range(3):
        turns += [
            {"role": "assistant", "content": filler(rng, 180)},
            {"role": "user", "content": f"Turn {n + 2}: {filler(rng, 60)}"},
        ]
    return turns


# --- an agent's work: edits, a rewrite, a call repeating paths (speculation) ------------------

NOUNS = (
    "order",
    "invoice",
    "customer",
    "shipment",
    "refund",
    "coupon",
    "ledger",
    "parcel",
    "vendor",
)
FIELDS = ("amount", "note", "region", "created", "status", "weight", "currency", "owner")


RECORD = """@dataclass
class {cls}:
    {noun}_id: int
    {a}: str
    {b}: str


def parse_{noun}(row: list[str]) -> {cls}:
    \"\"\"One {noun} from a CSV row of the {noun}s export.\"\"\"
    {noun}_id = int(row[0])
    {a} = row[{ia}]
    {b} = row[{ib}].lower()
    if not {a}:
        raise ValueError(f"{noun} {{{noun}_id}} has no {a}")
    return {cls}({noun}_id, {a}, {b})
"""
LOADER = """def load_{noun}s(folder: Path) -> list[list[str]]:
    \"\"\"Every {noun} row in `folder`, from {noun}s.csv.\"\"\"
    rows = load_rows(folder / "{noun}s.csv")
    return [row for row in rows if row and row[0] != "#"]
"""


def records_module() -> str:
    """~150 lines: a dataclass and a parser for each noun."""
    parts = [
        '"""The shop\'s records, parsed from CSV exports."""\n\nfrom dataclasses import dataclass\n'
    ]
    for i, noun in enumerate(NOUNS):
        a, b = FIELDS[i % len(FIELDS)], FIELDS[(i + 3) % len(FIELDS)]
        parts.append(
            RECORD.format(cls=noun.title(), noun=noun, a=a, b=b, ia=1 + i % 2, ib=2 - i % 2)
        )
    return "\n\n".join(parts)


def loaders_module() -> str:
    """~60 lines, `load_rows` used by every loader (the name to rename)."""
    head = (
        '"""Loaders of the shop\'s CSV exports."""\n\nimport csv\nfrom pathlib import Path\n\n\n'
        "def load_rows(path: Path) -> list[list[str]]:\n"
        '    """The rows of a CSV file, its header left out."""\n'
        '    with path.open(newline="") as f:\n        return list(csv.reader(f))[1:]\n'
    )
    loaders = [LOADER.format(noun=noun) for noun in NOUNS[:7]]
    calls = "".join(f'        "{noun}": load_{noun}s(folder),\n' for noun in NOUNS[:7])
    tail = (
        f"def load_all(folder: Path) -> dict[str, list[list[str]]]:\n    return {{\n{calls}    }}\n"
    )
    return "\n\n".join([head, *loaders, tail])


def file_listing() -> str:
    paths = [f"src/shop/{n}/{part}.py" for n in NOUNS for part in ("models", "service", "views")]
    return "\n".join(paths + [f"checks/{n}/test_{n}_service.py" for n in NOUNS])


PATHS = {
    "type": "object",
    "properties": {"paths": {"type": "array", "items": {"type": "string"}}},
    "required": ["paths"],
}
READ_FILES = {"type": "function", "function": {"name": "read_files", "parameters": PATHS}}

PATCH_HEAD = "*** Begin Patch\n*** Update File: shop/records.py\n"
EXAMPLE_PATCH = (
    PATCH_HEAD + "@@ def parse_coupon(row: list[str]) -> Coupon:\n"
    '     """One coupon from a CSV row of the coupons export."""\n     coupon_id = int(row[0])\n'
    "-    weight = row[2]\n+    weight = row[2].strip()\n*** End Patch"
)


CHANGES = (
    "strip whitespace from every field it reads, and raise ValueError when {noun}_id is negative",
    "lowercase every text field it reads, and raise ValueError when a field is empty",
    "read {noun}_id with int(row[0].strip()), and return None for a row of fewer than 3 fields",
    "raise ValueError when the row is empty, before reading any field",
    "uppercase every text field it reads, and raise ValueError when {noun}_id is zero",
)


def edit(noun: str, change: int = 0) -> str:
    """An apply_patch edit (one of `CHANGES`) of the `parse_{noun}` function of
    `records_module()`. The example comes first: after the file, the default model copied the
    example's patch (of `parse_coupon`) whatever function it was asked to edit."""
    return (
        f"An example of the patch format (another change, to another function):\n\n"
        f"{EXAMPLE_PATCH}\n\nHere is shop/records.py:\n\n```python\n{records_module()}```\n\n"
        f"In parse_{noun}, {CHANGES[change % len(CHANGES)].format(noun=noun)}. Reply with only "
        f"the patch to parse_{noun}, in that format."
    )


# (the user's message, the tools offered, the reply's opening: what a grammar would force of it)
WORKLOADS: dict[str, tuple[str, list[dict[str, Any]], str]] = {
    "patch": (
        edit("refund"),
        [],
        PATCH_HEAD + "@@ def parse_refund(row: list[str]) -> Refund:\n",
    ),
    "rewrite": (
        "Here is shop/loaders.py:\n\n```python\n" + loaders_module() + "```\n\nRename the "
        "function load_rows to read_rows everywhere. Reply with the complete new file, every "
        "line of it, unchanged except for the rename.",
        [],
        "```python\n",
    ),
    "tool call": (
        "`find src tests -name '*.py'` gave:\n\n" + file_listing() + "\n\nRead the service "
        "modules of refund and ledger and their tests.",
        [READ_FILES],
        '<tool_call>\n{"name": "read_files", "arguments": {"paths": ["',
    ),
    "chat": ("In a short paragraph: why does a Python dict lookup take constant time?", [], ""),
}

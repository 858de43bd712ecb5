"""The prompts the benches send: reproducible from a seed, new from their first token (so no
server finds them in a cache unless the bench means it to), and the same on every server
compared, which each renders with the GGUF's own chat template."""

from __future__ import annotations

import random

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

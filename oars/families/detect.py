"""Which family a model is, from its GGUF: the chat template says how it writes calls and
reasoning; its size says whether it gets the small-model guards.

The guards were measured on the default model, Qwen2.5-Coder-0.5B-Instruct: they are on for
Hermes-family models of at most `SMALL` parameters (the GGUF's `general.size_label`, e.g.
`0.5B`, `494M`, or llama.cpp's count of the weights), and off for larger ones.
`--small-model-guards on|off` overrides that.
"""

from __future__ import annotations

import re

from oars.families.base import THINK_TAGS, Family
from oars.families.harmony import Harmony
from oars.families.hermes import Hermes
from oars.families.qwen3_coder import Qwen3Coder

FAMILIES: dict[str, type[Family]] = {
    "hermes": Hermes,
    "qwen3_coder": Qwen3Coder,
    "harmony": Harmony,
}
CALL_FORMATS = tuple(FAMILIES)
SMALL = 1.5e9  # parameters: up to this, a model is in the 0.5B model's class
_SIZE = re.compile(r"^(?:(\d+)x)?(\d+(?:\.\d+)?)([KMBT])$", re.IGNORECASE)
_SCALE = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


def family_of(
    chat_template: str,
    calls: str | None = None,
    *,
    guards: bool | None = None,
    size: float | None = None,
) -> Family:
    """A GGUF's family, from its chat template (`calls`: the operator's call format, over the
    guess). `guards`: the operator's choice; None: by the model's `size` in parameters."""
    calls = calls or _call_format_of(chat_template)
    think = THINK_TAGS if THINK_TAGS[0] in chat_template else None
    small = size is not None and size <= SMALL
    return make(calls, think, guards=small if guards is None else guards)


def make(
    calls: str | None, think_tags: tuple[str, str] | None = None, *, guards: bool = False
) -> Family:
    """The family of a call format (None: one that writes no calls of its own). Only the
    Hermes family has small-model guards."""
    kind = FAMILIES.get(calls or "", Family)
    return kind(think_tags, guards=guards and kind is Hermes)


def parameters(size_label: str) -> float | None:
    """`0.5B` → 5e8, `494M` → 4.94e8, `8x7B` → 5.6e10; None for a label that says no size."""
    found = _SIZE.match(size_label.strip())
    if found is None:
        return None
    experts, number, unit = found.groups()
    return float(number) * _SCALE[unit.upper()] * int(experts or 1)


def _call_format_of(chat_template: str) -> str:
    if "<|channel|>" in chat_template:
        return "harmony"
    if "<function=" in chat_template:
        return "qwen3_coder"
    return "hermes"

"""Model families, one module each: what its models write (reasoning tags, call syntax), the
parser that reads it, and how the embedded engine holds it to a grammar. `detect` picks a GGUF's
family; an upstream's comes from its configuration."""

from oars.families.base import THINK_TAGS, Constraint, Family, GrammarKind, Plan, template_switches
from oars.families.detect import CALL_FORMATS, family_of, make
from oars.families.harmony import Harmony
from oars.families.hermes import Hermes
from oars.families.qwen3_coder import Qwen3Coder

__all__ = [
    "CALL_FORMATS",
    "THINK_TAGS",
    "Constraint",
    "Family",
    "GrammarKind",
    "Harmony",
    "Hermes",
    "Plan",
    "Qwen3Coder",
    "family_of",
    "make",
    "template_switches",
]

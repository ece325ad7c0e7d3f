"""Controlled negatives (issue 38): a description with one recorded edit of one kind (emotion flip, intensity
mismatch, evidence contradiction, modality omission); the records and their files (`records`) and the deterministic
rules engine (`rules`). The LLM editor is `zero_shot.editor`. See docs/data.md, "Controlled negatives".
"""

from emoreward.data.negatives.records import KINDS, MODALITIES, Negative, negatives_text, read_negatives
from emoreward.data.negatives.rules import Generated, generate_negatives, load_lexicon, rule_negatives, rules_source


__all__ = [
    "KINDS",
    "MODALITIES",
    "Generated",
    "Negative",
    "generate_negatives",
    "load_lexicon",
    "negatives_text",
    "read_negatives",
    "rule_negatives",
    "rules_source",
]

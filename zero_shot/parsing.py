"""Reading a judge's verdict from its text (or from its answer-token logits).

The parser looks for the *final* verdict. It reads, in order of trust:

1. explicit answer markers: `Answer: 2`, `Final answer: Description 1`, `**Verdict:** tie`, `\\boxed{2}`,
   `<answer>1</answer>`, `{"answer": "2"}`; the LAST marker in the text wins;
2. concluding phrases: `Description 2 is better`, `I prefer description 1`, `both are equally accurate`;
   the LAST one wins, so a label mentioned mid-reasoning and revised later does not;
3. a bare label as the whole answer (`2`, `Description 1.`, `(tie)`).

Anything else is `Verdict.INVALID`: it is counted, never mapped to a class (DESIGN, "Core types").
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from emoreward.evaluation.verdicts import Verdict


_TIE_WORDS = r"(?:tie|tied|draw|both|equal|equally|same|neither|no preference)"
_LABEL = (
    r"(?:(?:description|option|candidate|desc\.?|answer)\s*#?\s*(?P<num>[12])\b"
    r"|\(?(?P<bare>[12])\)?(?![\d.,]\d)"
    r"|the\s+(?P<ord>first|second)\s+(?:one|description|candidate)"
    r"|(?P<tie>" + _TIE_WORDS + r"))"
)
_MARKERS = [
    re.compile(r"\\boxed\{\s*(?P<frag>[^}]*)\}", re.I),
    re.compile(r"<answer>\s*(?P<frag>.*?)\s*</answer>", re.I | re.S),
    re.compile(r"[\"']?(?:answer|verdict|preference|choice)[\"']?\s*:\s*[\"'](?P<frag>[^\"']*)[\"']", re.I),
    re.compile(
        r"(?:final\s+)?(?:answer|verdict|decision|choice|preference|prediction|conclusion)"
        r"(?:\s+is)?\s*[:：=\-]\s*(?P<frag>[^\n]*)",
        re.I,
    ),
    re.compile(r"(?:final\s+)(?:answer|verdict|decision|choice)\s+is\s+(?P<frag>[^\n]*)", re.I),
    re.compile(r"\bthe\s+(?:correct\s+|best\s+|right\s+)?answer\s+is\s+(?P<frag>[^\n]*)", re.I),
]
_BETTER = (
    r"(?:better|more\s+(?:accurate|appropriate|suitable|aligned|consistent|precise|fitting|faithful)"
    r"|preferred|superior|closer|the\s+better\s+(?:one|choice|match|description)|the\s+best)"
)
_CONCLUSIONS = [
    re.compile(
        r"(?:description|option|candidate)\s*(?P<num>[12])\b[^.\n]{0,40}?\b(?:is|seems|appears|was|remains)\s+"
        r"(?:(?:clearly|slightly|much|far|somewhat|overall|therefore|thus|the)\s+)*" + _BETTER,
        re.I,
    ),
    re.compile(
        r"\b(?:prefer|choose|pick|select|go\s+with|favou?r|recommend)\s+(?:description|option|candidate)\s*(?P<num>[12])\b",
        re.I,
    ),
    re.compile(
        r"\b(?:better|best|preferred|more\s+accurate)\s+(?:one|description|choice|option|match)\s+is\s+"
        r"(?:description\s*)?(?P<num>[12])\b",
        re.I,
    ),
    re.compile(
        r"(?P<tie>\b(?:both|the\s+two)\s+(?:descriptions\s+|candidates\s+)?(?:are|seem|appear)\s+"
        r"(?:about\s+|roughly\s+)?(?:equally|similarly|just\s+as)\b|\b(?:it'?s|it\s+is|this\s+is)\s+a\s+tie\b"
        r"|\bneither\s+(?:description\s+)?is\s+better\b)",
        re.I,
    ),
]


def _label_of(match: re.Match) -> Verdict:
    groups = match.groupdict()
    if groups.get("tie"):
        return Verdict.TIE
    number = groups.get("num") or groups.get("bare")
    if number:
        return Verdict(number)
    ordinal = groups.get("ord")
    if ordinal:
        return Verdict.FIRST if ordinal.lower() == "first" else Verdict.SECOND
    raise RuntimeError("unreachable: a label pattern matched without a label group")


def _clean(text: str) -> str:
    # markdown emphasis and code ticks hide the words the patterns read
    return re.sub(r"[*_`#]+", "", text).strip()


def classify_fragment(fragment: str) -> Verdict:
    """The label at the start of an answer fragment (`"2"`, `"Description 1 is better"`, `"tie"`), else INVALID.

    A fragment that starts with no label but says the two are equal (`"they are equally good"`) is a tie.
    """
    frag = _clean(fragment).strip(" \t.:;,!\"'()[]")
    match = re.match(_LABEL, frag, re.I)
    if match:
        return _label_of(match)
    if re.search(r"\b(?:equally|tie|same quality|no preference)\b", frag, re.I):
        return Verdict.TIE
    return Verdict.INVALID


def parse_verdict(text: str | None) -> Verdict:
    """The final verdict in a judge's output (see the module docstring for the order of trust).

    Args:
        text: the model's output; None or empty gives INVALID.

    Returns:
        `Verdict.FIRST`, `SECOND`, `TIE`, or `INVALID` when no verdict can be read.
    """
    if not text or not text.strip():
        return Verdict.INVALID
    clean = _clean(text)
    found: list[tuple[int, Verdict]] = []
    for pattern in _MARKERS:
        for match in pattern.finditer(clean):
            verdict = classify_fragment(match.group("frag"))
            if verdict is not Verdict.INVALID:
                found.append((match.start("frag"), verdict))
    if found:
        return max(found, key=lambda item: item[0])[1]
    for pattern in _CONCLUSIONS:
        for match in pattern.finditer(clean):
            found.append((match.end(), _label_of(match)))
    if found:
        return max(found, key=lambda item: item[0])[1]
    bare = clean.strip(" \t\n.:;,!\"'()[]")
    if len(bare) <= 20:
        match = re.fullmatch(_LABEL + r"\.?", bare, re.I)
        if match:
            return _label_of(match)
    return Verdict.INVALID


def verdict_from_logits(
    logits: Sequence[float] | Mapping[str, float], labels: Sequence[str] = ("1", "2", "tie")
) -> tuple[Verdict, dict[str, float]]:
    """Verdict and probabilities from the logits of the answer tokens (softmax over those tokens only).

    Args:
        logits: one logit per label (same order as `labels`), or a mapping label -> logit.
        labels: the labels the logits belong to; a subset of `"1"`, `"2"`, `"tie"`.

    Returns:
        (`verdict`, `{"1": p1, "2": p2, "tie": p_tie}`), probabilities summing to 1 over the given labels;
        ties between the top logits give `Verdict.TIE` (an argmax must not depend on label order).

    Raises:
        ValueError: unknown labels, non-finite logits, or a length mismatch.
    """
    if isinstance(logits, Mapping):
        labels, values = list(logits), [float(v) for v in logits.values()]
    else:
        values = [float(v) for v in logits]
    if len(values) != len(labels) or not values:
        raise ValueError(f"{len(values)} logits for labels {list(labels)}")
    if set(labels) - {"1", "2", "tie"}:
        raise ValueError(f"labels must be among '1', '2', 'tie'; got {list(labels)}")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"non-finite answer logits {values}")
    top = max(values)
    exp = [math.exp(v - top) for v in values]
    total = sum(exp)
    probs = {label: e / total for label, e in zip(labels, exp)}
    winners = [label for label, v in zip(labels, values) if v == top]
    verdict = Verdict(winners[0]) if len(winners) == 1 else Verdict.TIE
    return verdict, probs

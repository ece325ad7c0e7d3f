"""The rules engine of controlled negatives: deterministic, no model. Emotion words and their opposites, intensity
modifiers, cue phrases per modality and modality markers come from the curated table `files/negatives/lexicon.json`
(source and licence in it and in docs/data.md); case and word form are kept. See docs/data.md, "Controlled negatives".
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources

from emoreward.data.context import MediaRef
from emoreward.data.negatives.records import KINDS, MODALITIES, Negative, canonical_negatives, make_negative, one_span
from emoreward.data.pairs import PreferencePair, description_content
from emoreward.data.text import normal_text


# why a description has no negative of a kind (the counts `generate_negatives` reports)
NO_EMOTION = "no emotion word of the lexicon"
NO_INTENSITY = "no intensity word of the lexicon"
NO_CUE = "no cue phrase of the lexicon"
NO_OMISSION = "no sentence carries one modality's evidence alone (or dropping it would leave nothing)"
REASONS = {"emotion_flip": NO_EMOTION, "intensity_mismatch": NO_INTENSITY, "evidence_contradiction": NO_CUE,
           "modality_omission": NO_OMISSION}  # fmt: skip
_SENTENCE = re.compile(r"[^.!?]*(?:[.!?]+[\"'\u201d)]*|$)\s*")


@dataclass(frozen=True)
class Lexicon:
    """The tables of the rules engine: `emotion` (word -> opposite), `low` / `high` intensity modifiers, `adverbs`
    (the modifiers that are adverbs), `cues` (modality -> phrase -> reversed phrase), `markers` (modality -> words
    that mark a sentence as carrying that modality's evidence), `source` (where the table comes from)."""

    emotion: dict[str, str]
    low: tuple[str, ...]
    high: tuple[str, ...]
    adverbs: frozenset[str]
    cues: dict[str, dict[str, str]]
    markers: dict[str, tuple[str, ...]]
    source: str = ""
    patterns: dict[str, re.Pattern] = field(default_factory=dict, compare=False, repr=False)


def _opposites(pairs: Iterable[Iterable[str]]) -> dict[str, str]:
    """`[a, b, ...]` pairs -> a -> b and b -> a, unless the word already has an opposite (the first pair wins)."""
    out: dict[str, str] = {}
    for a, b, *_ in pairs:
        out.setdefault(a.lower(), b.lower())
        out.setdefault(b.lower(), a.lower())
    return out


def _pattern(phrases: Iterable[str]) -> re.Pattern:
    """Whole-word matches of any phrase (longest first; words inside hyphenated words do not match), any case."""
    alts = sorted({p.lower() for p in phrases}, key=lambda p: (-len(p), p))
    body = "|".join(r"\s+".join(map(re.escape, p.split())) for p in alts)
    return re.compile(rf"(?<![\w-])(?:{body})(?![\w-])", re.IGNORECASE)


@functools.cache
def load_lexicon() -> Lexicon:
    """The bundled lexicon (`emoreward/data/files/negatives/lexicon.json`), parsed once."""
    path = resources.files("emoreward.data") / "files" / "negatives" / "lexicon.json"
    raw = json.loads(path.read_text(encoding="utf-8"))
    intensity = raw["intensity"]
    lex = Lexicon(
        emotion=_opposites(raw["emotion"]),
        low=tuple(intensity["low"]),
        high=tuple(intensity["high"]),
        adverbs=frozenset(intensity["adverbs"]),
        cues={m: _opposites(raw["cues"][m]) for m in MODALITIES},
        markers={m: tuple(raw["modality_markers"][m]) for m in MODALITIES},
        source=raw["source"],
    )
    lex.patterns.update(emotion=_pattern(lex.emotion), intensity=_pattern(lex.low + lex.high))
    lex.patterns.update({f"cue:{m}": _pattern(lex.cues[m]) for m in MODALITIES})
    lex.patterns.update({f"marker:{m}": _pattern(lex.markers[m]) for m in MODALITIES})
    return lex


def match_case(word: str, like: str) -> str:
    """`word` in the case of `like`: ALL CAPS, Capitalised or as written (lower)."""
    if len(like) > 1 and like.isupper():
        return word.upper()
    if like[:1].isupper():
        return word[:1].upper() + word[1:]
    return word


def _closest(word: str, candidates: Iterable[str]) -> str:
    """The candidate closest in length to `word` (ties: alphabetical): length-matched replacements."""
    return min(candidates, key=lambda c: (abs(len(c) - len(word)), c))


def emotion_flip(text: str, lex: Lexicon) -> tuple[int, int, str] | None:
    """The last named emotion (descriptions conclude with it) -> its opposite: `(start, end, replacement)` or None."""
    found = list(lex.patterns["emotion"].finditer(text))
    if not found:
        return None
    m = found[-1]
    return m.start(), m.end(), match_case(lex.emotion[" ".join(m.group().lower().split())], m.group())


def intensity_mismatch(text: str, lex: Lexicon) -> tuple[int, int, str] | None:
    """The first intensity modifier -> the other end of the scale, same part of speech, closest in length."""
    m = lex.patterns["intensity"].search(text)
    if m is None:
        return None
    word = " ".join(m.group().lower().split())
    other = lex.high if word in lex.low else lex.low
    same_pos = [w for w in other if (w in lex.adverbs) == (word in lex.adverbs)]
    return m.start(), m.end(), match_case(_closest(word, same_pos), m.group())


def evidence_contradiction(text: str, lex: Lexicon) -> tuple[int, int, str, str] | None:
    """The first cue phrase of any modality -> its reversal: `(start, end, replacement, modality)` or None."""
    best = None
    for modality in MODALITIES:
        m = lex.patterns[f"cue:{modality}"].search(text)
        if m is not None and (best is None or m.start() < best[0].start()):
            best = (m, modality)
    if best is None:
        return None
    m, modality = best
    return m.start(), m.end(), match_case(lex.cues[modality][" ".join(m.group().lower().split())], m.group()), modality


def sentences(text: str) -> list[tuple[int, int]]:
    """`(start, end)` of each sentence of `text` (ends at ., ! or ?, closing quotes and the spaces after it)."""
    return [(m.start(), m.end()) for m in _SENTENCE.finditer(text) if m.group().strip()]


def sentence_modalities(sentence: str, lex: Lexicon) -> set[str]:
    """The modalities whose markers (`lexicon.json` modality_markers) appear in `sentence`."""
    return {m for m in MODALITIES if lex.patterns[f"marker:{m}"].search(sentence)}


def modality_omission(text: str, lex: Lexicon) -> tuple[int, int, str, str] | None:
    """Drop every sentence whose only evidence is one modality (the first of face, voice, posture, words that has
    such a sentence and leaves another): `(start, end, replacement, modality)`, the span running from the first
    dropped sentence to the last, the replacement the kept text between them."""
    spans = sentences(text)
    tags = [sentence_modalities(text[s:e], lex) for s, e in spans]
    for modality in MODALITIES:
        drop = {i for i, t in enumerate(tags) if t == {modality}}
        if not drop or len(drop) == len(spans):
            continue
        negative = "".join(text[s:e] for i, (s, e) in enumerate(spans) if i not in drop)
        if text == text.rstrip():
            negative = negative.rstrip()
        start, end, replacement = one_span(text, negative)
        return start, end, replacement, modality
    return None


def rule_negatives(sample_id: str, description: str, media: MediaRef | None = None,
                   kinds: Iterable[str] = KINDS) -> tuple[list[Negative], list[tuple[str, str]]]:  # fmt: skip
    """The rules engine on one description: at most one negative per kind, and `(kind, reason)` for each kind it
    could not write (`REASONS`).

    Args:
        description: the original; edited in its normal form (`data.text.normal_text`), offsets refer to that form.
        kinds: which of `records.KINDS` to write.
    """
    lex = load_lexicon()
    text = normal_text(description)
    out, missed = [], []
    for kind in kinds:
        found = {"emotion_flip": emotion_flip, "intensity_mismatch": intensity_mismatch,
                 "evidence_contradiction": evidence_contradiction, "modality_omission": modality_omission}[kind](text, lex)  # fmt: skip
        if found is None:
            missed.append((kind, REASONS[kind]))
            continue
        start, end, replacement, *modality = found
        out.append(make_negative(sample_id, text, kind, start, end, replacement,
                                 modality=modality[0] if modality else None, media=media))  # fmt: skip
    return out, missed


Source = str  # "preferred" | "all"
SOURCES = ("preferred", "all")


def source_descriptions(pairs: Iterable[PreferencePair], source: Source = "preferred", *,
                        media_by_id: bool = False) -> tuple[list, Counter]:  # fmt: skip
    """The descriptions negatives are written from: `(sample_id, description, media)`, each description once by the
    pair loader's identity (`data.pairs.description_content`: the text in its context; the sample id only with
    ``media_by_id``), under its first sample id in sorted order, and the count of pairs left out with the reason.
    ``"preferred"``: the description humans preferred (a tie or unlabelled pair gives none); ``"all"``: both
    descriptions of every pair.

    Raises:
        ValueError: an unknown `source`."""
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; available: {list(SOURCES)}")
    out: dict[tuple, tuple] = {}
    left_out: Counter = Counter()
    for p in pairs:
        if source == "all":
            texts = [p.description_1, p.description_2]
        elif p.label in ("1", "2"):
            texts = [p.description_1 if p.label == "1" else p.description_2]
        else:
            left_out["pair without a preferred description (tie or no label)"] += 1
            continue
        for text in texts:
            key = description_content(p, text, media_by_id=media_by_id)
            if key in out:
                left_out["description already taken from another pair"] += 1
            found = (p.sample_id, text, p.media)
            out[key] = min(out.get(key, found), found, key=_order)  # the rows' order picks no sample id
    return sorted(out.values(), key=_order), left_out


def _order(found: tuple) -> tuple:
    sample_id, text, media = found
    return (sample_id, normal_text(text).strip(), str(media))


@dataclass
class Generated:
    """What `generate_negatives` wrote: `negatives` (content order), `per_kind` (count written per kind),
    `excluded` (reason -> count: kinds a description had no edit for, duplicates, left-out pairs),
    `n_descriptions` (descriptions edited), `engine`; the LLM editor's `steps` (planned, edited, accepted, call
    failed) and `rejected` (verifier reason -> count)."""

    negatives: list[Negative]
    per_kind: dict[str, int]
    excluded: dict[str, int]
    n_descriptions: int
    engine: str = "rules"
    steps: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict:
        """The counts as a JSON-safe dict (printed by `emoreward augment`, written beside its output)."""
        out = {"engine": self.engine, "n_descriptions": self.n_descriptions, "n_negatives": len(self.negatives),
               "per_kind": self.per_kind, "excluded": self.excluded}  # fmt: skip
        if self.engine == "llm":
            out.update(steps=self.steps, rejected=self.rejected)
        return out


def rules_source(pairs_name: str) -> str:
    """The words naming negatives `generate_negatives` made from the preferred descriptions of `pairs_name` (a file,
    or "the evaluated pairs"): the `source` of every controlled-error section of generated negatives."""
    return f"rules engine on the preferred descriptions of {pairs_name}"


def generate_negatives(
    pairs: Iterable[PreferencePair], *, source: Source = "preferred", kinds: Iterable[str] = KINDS,
    media_by_id: bool = False,
) -> Generated:  # fmt: skip
    """Controlled negatives of `pairs` with the rules engine: for each source description (`source_descriptions`),
    at most one negative per kind (`rule_negatives`), each pair once (`records.canonical_negatives`); ``media_by_id``
    as the pairs were read (`data.pairs.load_pairs`). Deterministic: the same pairs in any order give the same list.

    Raises:
        ValueError: an unknown source or kind."""
    kinds = list(kinds)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown kind {unknown[0]!r}; available: {list(KINDS)}")
    descriptions, left_out = source_descriptions(pairs, source, media_by_id=media_by_id)
    negatives, excluded = [], Counter(left_out)
    for sample_id, text, media in descriptions:
        written, missed = rule_negatives(sample_id, text, media, kinds)
        negatives += written
        excluded.update(f"{kind}: {reason}" for kind, reason in missed)
    kept, duplicates = canonical_negatives(negatives, media_by_id=media_by_id)
    if duplicates:
        excluded["the same negative written twice"] += duplicates
    per_kind = {k: sum(n.kind == k for n in kept) for k in kinds}
    return Generated(kept, per_kind, dict(sorted(excluded.items())), len(descriptions))


__all__ = [
    "REASONS",
    "SOURCES",
    "Generated",
    "Lexicon",
    "evidence_contradiction",
    "emotion_flip",
    "generate_negatives",
    "intensity_mismatch",
    "load_lexicon",
    "match_case",
    "modality_omission",
    "rules_source",
    "rule_negatives",
    "sentence_modalities",
    "sentences",
    "source_descriptions",
]

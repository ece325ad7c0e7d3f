"""The LLM editor of controlled negatives (issue 38, `emoreward augment --engine llm`): an edit plan (kind, span and
instruction, placed by the rules engine's lexicon), the edit by a text LLM through a zero-shot judge's backend
(transformers, an OpenAI-compatible server), and a diff-based verifier that rejects an edit that changed more than
asked; every step counted. See docs/data.md, "Controlled negatives".
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from emoreward.data.negatives.records import KINDS, Negative, canonical_negatives, make_negative, one_span
from emoreward.data.negatives.rules import (
    Generated,
    load_lexicon,
    rule_negatives,
    sentence_modalities,
    sentences,
    source_descriptions,
)
from emoreward.data.pairs import PreferencePair, content_order_key
from zero_shot.backends.base import Backend, ChatRequest, SamplingConfig


OUTSIDE_BOUND = 3  # characters an edit may change outside its planned span (an article, a space, punctuation)
SYSTEM = "You edit emotion descriptions. You change exactly what you are asked to change and nothing else."
INSTRUCTIONS = {
    "emotion_flip": 'Replace "{span}" with a word naming the opposite emotion (for example "{example}").',
    "intensity_mismatch": 'Replace "{span}" with a word of the opposite intensity (for example "{example}").',
    "evidence_contradiction": 'Replace "{span}" with a phrase describing the opposite {modality} cue (for example '
    '"{example}").',
    "modality_omission": "Delete the sentences that describe only the {modality} evidence.",
}
PROMPT = "{instruction} Change nothing else. Answer with the full edited description only.\n\nDescription:\n{text}"


@dataclass(frozen=True)
class EditPlan:
    """One planned edit: the description, the kind, the span to change (`start`, `end`), the modality, the rules
    engine's own edit of that span (`example`, shown to the editor and used by no check) and the prompt."""

    sample_id: str
    original: str
    kind: str
    start: int
    end: int
    modality: str | None
    example: Negative
    media: object

    def prompt(self) -> str:
        instruction = INSTRUCTIONS[self.kind].format(span=self.original[self.start : self.end],
                                                     example=self.example.replacement, modality=self.modality)  # fmt: skip
        return PROMPT.format(instruction=instruction, text=self.original)


def plan_edits(pairs: Iterable[PreferencePair], *, source: str = "preferred", kinds: Iterable[str] = KINDS,
               media_by_id: bool = False) -> tuple[list[EditPlan], Counter]:  # fmt: skip
    """The edit plans of the source descriptions (`rules.source_descriptions`): where the rules engine finds a span
    of the kind, one plan; else the reason, counted."""
    descriptions, excluded = source_descriptions(pairs, source, media_by_id=media_by_id)
    plans = []
    for sample_id, text, media in descriptions:
        written, missed = rule_negatives(sample_id, text, media, kinds)
        excluded.update(f"{kind}: {reason}" for kind, reason in missed)
        plans += [
            EditPlan(sample_id, n.original, n.kind, n.span_start, n.span_end, n.modality, n, media) for n in written
        ]
    return plans, excluded


def _answer_text(text: str) -> str:
    """The edited description out of an answer: outer whitespace, a `Description:` label and outer quotes removed."""
    text = re.sub(r"^\s*(?:edited\s+)?description\s*:\s*", "", text.strip(), flags=re.IGNORECASE).strip()
    if len(text) > 1 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    return text


def verify_edit(plan: EditPlan, answer: str) -> tuple[Negative | None, str]:
    """Check an edit against its plan: `(negative, "accepted")` or `(None, reason)`.

    Rejected: an empty or unchanged answer; a change more than `OUTSIDE_BOUND` characters outside the planned span
    (the one enclosing span of every change, `records.one_span`); an edit that fails its kind's check (emotion flip:
    the span's new text names the lexicon's opposite of the planned word or a word whose opposite it is; intensity:
    a modifier of the other end of the scale; evidence: the cue table's reversal; omission: no sentence carrying only
    that modality's evidence is left)."""
    edited = _answer_text(answer)
    original = plan.original
    if not edited:
        return None, "empty answer"
    if edited == original:
        return None, "unchanged"
    start, end, replacement = one_span(original, edited)
    outside = max(0, plan.start - start) + max(0, end - plan.end)
    if outside > OUTSIDE_BOUND:
        return None, f"changed more than {OUTSIDE_BOUND} characters outside the planned span"
    # the planned span and the change together, in whole words as planned: (start, end) of the original
    start, end = min(start, plan.start), max(end, plan.end)
    replacement = edited[start : end + len(edited) - len(original)]
    lex = load_lexicon()
    word = " ".join(original[plan.start : plan.end].lower().split())
    new = replacement.lower()
    if plan.kind == "emotion_flip":
        opposite = {lex.emotion[word], *(w for w, o in lex.emotion.items() if o == word)}
        ok = any(re.search(rf"(?<![\w-]){re.escape(w)}(?![\w-])", new) for w in opposite)
    elif plan.kind == "intensity_mismatch":
        other = lex.high if word in lex.low else lex.low
        ok = any(re.search(rf"(?<![\w-]){re.escape(w)}(?![\w-])", new) for w in other)
    elif plan.kind == "evidence_contradiction":
        ok = lex.cues[plan.modality][word] in new  # type: ignore[index]
    else:
        left = [edited[s:e] for s, e in sentences(edited)]
        ok = bool(left) and not any(sentence_modalities(s, lex) == {plan.modality} for s in left)
    if not ok:
        return None, f"{plan.kind}: the kind's check failed"
    neg = make_negative(plan.sample_id, original, plan.kind, start, end, replacement, modality=plan.modality,
                        engine="llm", media=plan.media)  # type: ignore[arg-type]  # fmt: skip
    return neg, "accepted"


def run_editor(plans: Sequence[EditPlan], backend: Backend, *, max_new_tokens: int | None = None
               ) -> tuple[list[Negative], Counter, Counter]:  # fmt: skip
    """Ask `backend` for each planned edit (greedy decoding: the same plans give the same edits) and verify each:
    `(accepted negatives, steps, rejected)`, steps counting `planned`, `edited` (an answer came back), `accepted`,
    `call failed`; rejected counting each reason of `verify_edit`."""
    steps, rejected = Counter(planned=len(plans)), Counter()
    if not plans:
        return [], steps, rejected
    # room for the whole description again (about 3 characters a token) and a little more
    budget = max_new_tokens or max(len(p.original) for p in plans) // 3 + 32
    sampling = SamplingConfig(do_sample=False, max_new_tokens=budget)
    answers = backend.generate([ChatRequest(p.prompt(), system=SYSTEM) for p in plans], sampling)
    accepted = []
    for plan, answer in zip(plans, answers):
        if answer.error is not None:
            steps["call failed"] += 1
            continue
        steps["edited"] += 1
        neg, reason = verify_edit(plan, answer.text)
        if neg is None:
            rejected[reason] += 1
        else:
            steps["accepted"] += 1
            accepted.append(neg)
    return accepted, steps, rejected


def edit_negatives(pairs: Iterable[PreferencePair], editor: str = "smollm2-135m-text", *, source: str = "preferred",
                   kinds: Iterable[str] = KINDS, limit: int | None = None, backend: Backend | None = None,
                   media_by_id: bool = False) -> Generated:  # fmt: skip
    """Controlled negatives written by an LLM editor: plans (`plan_edits`; the first `limit` in their pairs' content
    order, `data.pairs.content_order_key`, as every ``--limit``), edits through the text backend of judge `editor`
    (its `llm`, else its `mllm`; `zero_shot.config`), verified (`verify_edit`). The counts (`Generated.steps`,
    `.rejected`) are the honest outcome: a small model's edits are mostly rejected.

    Raises:
        ValueError: an unknown judge, source or kind (naming what is available)."""
    from zero_shot.config import LazyBackend, load_judge_config

    kinds = list(kinds)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown kind {unknown[0]!r}; available: {list(KINDS)}")
    if backend is None:
        config = load_judge_config(editor)
        backend = LazyBackend(config.llm or config.mllm)
    plans, excluded = plan_edits(pairs, source=source, kinds=kinds, media_by_id=media_by_id)
    n_descriptions = len({(p.sample_id, p.original) for p in plans})
    # renamed samples or shuffled rows: the same first `limit` plans
    plans = sorted(plans, key=lambda p: (content_order_key(p.example.pair()), p.example.sort_key()))
    if limit is not None and len(plans) > limit:
        excluded["planned edits beyond --limit"] += len(plans) - limit
        plans = plans[:limit]
    accepted, steps, rejected = run_editor(plans, backend)
    kept, duplicates = canonical_negatives(accepted, media_by_id=media_by_id)
    if duplicates:
        excluded["the same negative written twice"] += duplicates
    per_kind = {k: sum(n.kind == k for n in kept) for k in kinds}
    return Generated(kept, per_kind, dict(sorted(excluded.items())), n_descriptions, engine="llm",
                     steps=dict(steps), rejected=dict(sorted(rejected.items())))  # fmt: skip


__all__ = ["OUTSIDE_BOUND", "EditPlan", "edit_negatives", "plan_edits", "run_editor", "verify_edit"]

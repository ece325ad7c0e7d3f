"""Reading a judge's verdict from its text (or from its answer-token logits).

A wrong class costs more than an INVALID one (INVALID is counted; a wrong class silently moves WAF, swap
consistency and rankings), so the parser says INVALID whenever the text does not commit to one verdict.
`parse_verdict` reads the text in three passes, most trusted first (marked answers, then concluding statements,
then a bare label; its docstring gives the rules, in English, Chinese and a few other languages);
`verdict_from_logits` reads p(1), p(2), p(tie) of the answer tokens. Anything else is `Verdict.INVALID`: it is
counted, never mapped to a class. The labelled corpus `tests/zero_shot/verdict_corpus.jsonl` measures the rules
(zero wrong classes is asserted). See docs/judges.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from emoreward.data.verdicts import Verdict


# A clause reads as a verdict, as nothing (`None`), or as an attempt that cannot be read (AMBIGUOUS).
AMBIGUOUS = "ambiguous"

# ------------------------------------------------------------------------------------------ normalisation
_NUM = {"1": "1", "2": "2", "one": "1", "two": "2", "一": "1", "二": "2", "两": "2", "i": "1", "ii": "2"}
_REFERENCES = [
    # Description 1 / option #2 / candidate two / response 1 (and Spanish, French, German, Italian)
    (
        r"\b(?:description|desc\.?|option|candidate|response|descripci[oó]n|beschreibung|descrizione)"
        r"\s*(?:#|no\.?|number)?\s*(?P<n>[12]|one|two|ii|i)(?![\w.]*\d)\b",
        None,
    ),
    (r"(?:描述|选项|候选)\s*(?P<n>[12一二两])(?!样|致|些)", None),
    (r"第\s*(?P<n>[12一二两])\s*(?:个|条|项)?\s*(?:描述|选项|答案)?", None),
    # the first description / the second one / the first
    (
        r"\bthe\s+(?P<o>first|second)(?:\s+(?:description|one|candidate|option|response))?\b",
        None,
    ),
    (r"\b(?P<o>first|second)\s+(?:description|one|candidate|option|response)\b", None),
    (r"\bthe\s+(?P<fl>former|latter)\b", None),
]
_REFERENCE_RES = [re.compile(p, re.I) for p, _ in _REFERENCES]

# comparatives that name a quality (not "more detailed", which says nothing about which is right)
_QUALITY = (
    r"accurate|appropriate|suitable|aligned|consistent|precise|fitting|faithful|plausible|convincing|correct|"
    r"reasonable|apt|relevant|complete|comprehensive"
)
_POSITIVE = (
    rf"\bbetter\b|\bmore\s+(?:{_QUALITY})\b|\bsuperior\b|\bcloser\b|\bpreferable\b|\bpreferred\b|\bstronger\b"
    r"|\bthe\s+best\b|\bmejor\b|\bbesser\b|\bmeilleure?\b|\bmigliore\b|\bmieux\b"
    r"|更好|更准确|更准|更贴切|更符合|更恰当|更合适|更佳|更精确|更到位|较好|更胜一筹|胜出|获胜"
)
_NEGATIVE = (
    rf"\bworse\b|\bless\s+(?:{_QUALITY})\b|\binferior\b|\bweaker\b|\bfurther\s+from\b|\bpeor\b|\bschlechter\b"
    r"|不如|较差|更差|逊色"
)
_CHOICE = (
    r"\b(?:prefer|choose|chose|pick|picked|select|selected|go\s+with|opt\s+for|favou?r|recommend|vote\s+for"
    r"|elijo|prefiero|w[äa]hle|choisis|pr[ée]f[èe]re|scelgo)\s+(?:the\s+)?(?=d[12]\b)"
    r"|(?:我)?(?:选择|选|倾向于|更倾向于|更喜欢|推荐)\s*(?=d[12])"
)
_WINNER = r"(?<=\bd[12])\s+(?:wins|is\s+the\s+winner)\b|(?<=d[12])\s*(?:胜出|获胜|更胜一筹)"
_TIE = (
    r"\bequally\b|\bequal\b|\bties?\b|\btied\b|\ba\s+draw\b|\bno\s+(?:clear\s+)?preference\b"
    r"|\bneither\s+(?:one\s+|description\s+|of\s+them\s+)?is\s+better\b|\bsame\s+(?:quality|level)\b"
    r"|\bas\s+(?:good|accurate|appropriate|well)\s+as\b|\bcomparable\b|\bon\s+par\b|\bindistinguishable\b"
    r"|\bno\s+(?:clear\s+)?winner\b|\bempate\b|\b[ée]galit[ée]\b|\bgleich\s+gut\b|\bex\s+aequo\b"
    r"|平局|相当|一样好|同样好|同样准确|一样准确|不分上下|难分高下|难分伯仲|打平|平手"
)
# negations; phrases that contain a negation word but are themselves a claim are removed before the search
_NEGATION = (
    r"\bnot\b|n't\b|\bnever\b|\bno\b|\bcannot\b|\bhardly\b|\bneither\b|\bnor\b|\bnicht\b|\bpas\b|\bnon\b"
    r"|不(?!如|分上下|错)|没有?|未必|并非|(?<!非)非(?!常)"
)
_NOT_NEGATION = r"d[12]\s*没有\s*d[12]|\bno\s+(?:clear\s+)?winner\b|\bneither\s+(?:one\s+|description\s+|of\s+them\s+)?is\s+better\b|\bno\s+(?:clear\s+)?preference\b"

_POSITIVE_RE = re.compile(_POSITIVE, re.I)
_NEGATIVE_RE = re.compile(_NEGATIVE, re.I)
_CHOICE_RE = re.compile(_CHOICE, re.I)
_WINNER_RE = re.compile(_WINNER, re.I)
_TIE_RE = re.compile(_TIE, re.I)
_NEGATION_RE = re.compile(_NEGATION, re.I)
_NOT_NEGATION_RE = re.compile(_NOT_NEGATION, re.I)
_LABEL_RE = re.compile(r"\bd([12])\b")
# "the better one is description 2", "the winner is d1", "更好的是描述2"
_PREDICATE_FIRST = re.compile(
    r"\b(?:the\s+)?(?:better|best|preferred|more\s+(?:" + _QUALITY + r")|winning|stronger|superior)\s+"
    r"(?:one|description|choice|option|match|fit|candidate)?\s*(?:here\s+|overall\s+)?(?:is|would\s+be|=|:)\s*d([12])\b"
    r"|\bthe\s+winner\s+is\s+d([12])\b"
    r"|(?:更好|更准确|更贴切|更符合|更恰当|更合适|更佳)的(?:是|为)\s*d([12])",
    re.I,
)
# X 比 Y 更好 (X is better than Y): the comparative binds to X, not to the nearer Y
_BI_RE = re.compile(r"d([12])\s*(?:的描述)?\s*比\s*d[12]\s*(?:还|要)?\s*(" + _POSITIVE + "|" + _NEGATIVE + ")", re.I)
# X 没有 Y 准确 (X is not as accurate as Y): names Y
_NOT_AS_RE = re.compile(r"d[12]\s*没有\s*d([12])\s*(?:那么|这么|那样)?\s*(?:准确|好|贴切|恰当|合适|符合|到位|精确)")

# clause boundaries and what the clause after them does
_REVISE = (
    r"but|however|yet|so|therefore|thus|hence|overall|ultimately|actually|wait|in\s+conclusion|in\s+summary"
    r"|to\s+conclude|all\s+in\s+all|on\s+reflection|on\s+balance|then"
)
_CONCEDE = r"although|though|even\s+though|while|whereas|despite|granted"
_JUSTIFY = r"because|since|given\s+that|as\s+it|as\s+they|for\s+it"
_BOUNDARY = re.compile(
    r"(?P<sent>(?<!\d)[.!?](?=\s|$)|[。！？\n]|\s+-{1,2}\s+)|(?P<semi>[;；])"
    rf"|(?P<kw>(?:,\s*|\s+|^)(?:(?P<revise>{_REVISE})|(?P<concede>{_CONCEDE})|(?P<justify>{_JUSTIFY}|,\s*as))\b)"
    r"|(?P<zh_revise>但是|但|不过|然而|所以|因此|因而|总之|综上所述|综上|总的来说|总体而言|总体来看)"
    r"|(?P<zh_concede>虽然|尽管|即使|虽说)"
    r"|(?P<zh_justify>因为|由于)",
    re.I,
)


def _normalise(text: str) -> str:
    """Lowercase text with every reference to a description replaced by `d1` / `d2`."""
    out = text.lower()
    out = re.sub(r"[*_`#]+(?=\w|$)|(?<=\w)[*_`]+", "", out)  # markdown emphasis around words
    out = out.replace("’", "'")
    for pattern in _REFERENCE_RES:

        def repl(m: re.Match) -> str:
            g = m.groupdict()
            if g.get("n"):
                return f" d{_NUM[g['n'].lower()]} "
            if g.get("o"):
                return " d1 " if g["o"].lower() == "first" else " d2 "
            return " d1 " if g["fl"].lower() == "former" else " d2 "

        out = pattern.sub(repl, out)
    return re.sub(r"[ \t]+", " ", out)


# ------------------------------------------------------------------------------------------ clauses
def _clauses(text: str) -> list[tuple[str, str]]:
    """Split normalised text into (kind, clause): kind is `main`, `revise`, `concede` or `justify`; a new
    sentence starts a `main` clause."""
    out: list[tuple[str, str]] = []
    kind, start = "main", 0
    for m in _BOUNDARY.finditer(text):
        out.append((kind, text[start : m.start()]))
        if m.group("sent"):
            kind = "main"
        elif m.group("semi"):
            kind = "justify"  # "X; Y": Y elaborates X
        elif m.group("revise") or m.group("zh_revise"):
            kind = "revise"
        elif m.group("concede") or m.group("zh_concede"):
            kind = "concede"
        else:
            kind = "justify"
        start = m.end()
    out.append((kind, text[start:]))
    split: list[tuple[str, str]] = []
    for k, c in out:
        if k == "concede" and "," in c:  # "although X, Y": the concession ends at the comma
            head, tail = c.split(",", 1)
            split += [("concede", head), ("main", tail)]
        else:
            split.append((k, c))
    return [(k, c.strip(" ,:")) for k, c in split if c.strip(" ,:")]


def _claims(clause: str) -> tuple[set[str], int | None]:
    """The verdicts a clause claims (`"1"`, `"2"`, `"tie"`) and the position of the first claim's trigger."""
    claims: set[str] = set()
    first: int | None = None

    def add(label: str, pos: int) -> None:
        nonlocal first
        claims.add(label)
        first = pos if first is None else min(first, pos)

    consumed: list[tuple[int, int]] = []
    for m in _PREDICATE_FIRST.finditer(clause):
        add(next(g for g in m.groups() if g), m.start())
        consumed.append(m.span())
    for m in _BI_RE.finditer(clause):
        positive = _POSITIVE_RE.fullmatch(m.group(2)) is not None
        add(m.group(1) if positive else {"1": "2", "2": "1"}[m.group(1)], m.start(2))
        consumed.append(m.span())

    for m in _NOT_AS_RE.finditer(clause):
        add(m.group(1), m.start())
        consumed.append(m.span())

    def free(span: tuple[int, int]) -> bool:
        return not any(a <= span[0] < b for a, b in consumed)

    for regex, flip in ((_POSITIVE_RE, False), (_NEGATIVE_RE, True)):
        for m in regex.finditer(clause):
            if not free(m.span()):
                continue
            labels = [x for x in _LABEL_RE.finditer(clause, 0, m.start())]
            if not labels:
                continue
            label = labels[-1].group(1)
            add({"1": "2", "2": "1"}[label] if flip else label, m.start())
    for regex in (_CHOICE_RE, _WINNER_RE):
        for m in regex.finditer(clause):
            label = _LABEL_RE.match(clause, m.end()) if regex is _CHOICE_RE else None
            if regex is _CHOICE_RE and label is None:
                continue
            number = label.group(1) if label is not None else re.search(r"d([12])\s*$", clause[: m.start()]).group(1)
            add(number, m.start())
    for m in _TIE_RE.finditer(clause):
        add("tie", m.start())
    return claims, first


def _negated(clause: str, before: int) -> bool:
    masked = _NOT_NEGATION_RE.sub(lambda m: " " * len(m.group()), clause)
    return any(m.start() < before for m in _NEGATION_RE.finditer(masked))


def _read_clause(clause: str) -> str | None:
    """A clause's claim: `"1"`, `"2"`, `"tie"`, AMBIGUOUS (negated or conflicting claims) or None (no claim)."""
    claims, first = _claims(clause)
    if not claims:
        return None
    if len(claims) > 1 or (first is not None and _negated(clause, first)):
        return AMBIGUOUS
    return next(iter(claims))


def _read_statement(text: str) -> str | None:
    """The claim of normalised free text (rules: `parse_verdict`), or None when it claims nothing."""
    current: str | None = None
    for kind, clause in _clauses(text):
        claim = _read_clause(clause)
        if claim is None or kind == "concede":
            continue
        if kind == "justify" and current is not None:
            if claim != current:
                return AMBIGUOUS  # a reason that argues for the other verdict
            continue
        current = claim
    return current


# ------------------------------------------------------------------------------------------ marker answers
_LEADING_LABEL = re.compile(
    r"^\s*[\[(\"'“]*\s*(?:(?:the|la|el|le|die|der|das|il)\s+)?(?:(?P<d>d[12])|(?P<bare>[12])(?![\d.,/]\d)(?!\s*(?:/|or|and|-|to|,\s*[12]\b))|(?P<tie>tie|平局))"
    r"\s*[\])\"'”]*\s*(?P<rest>.*)$",
    re.I | re.S,
)
# what may follow a leading label without turning it into the subject of a sentence
_AFTER_LABEL = re.compile(
    r"^(?:$|[.,;:!。，；：!)\]}\-–—(（]|because\b|since\b|as\b|given\b|for\b|due\b|因为|由于)", re.I
)


def _verdict(claim: str | None) -> Verdict:
    return Verdict(claim) if claim in ("1", "2", "tie") else Verdict.INVALID


def _read_fragment(fragment: str) -> str | None:
    """A marker's answer (normalised): a claim, AMBIGUOUS, or None when it holds no verdict attempt at all."""
    frag = fragment.strip().strip("*_`").strip()
    if not frag:
        return None
    m = _LEADING_LABEL.match(frag)
    if m:
        label = m.group("d")[1] if m.group("d") else (m.group("bare") or "tie")
        if label != "tie" and m.group("tie"):
            label = "tie"
        rest = m.group("rest").strip()
        if _AFTER_LABEL.match(rest):
            reason = _read_statement(rest.lstrip(".,;:!。，；：)]-–—(（ "))
            if reason is not None and reason != label:
                return AMBIGUOUS  # "Answer: 1, since Description 2 is better"
            return label
        if m.group("bare") and not re.match(r"(?:is|was|seems|would|wins|better)\b", rest, re.I):
            return AMBIGUOUS  # "Answer: 1 or 2", "Answer: 2 out of 3"
    claim = _read_statement(frag)
    if claim is not None:
        return claim
    # a marker that names labels or numbers without a readable verdict is an unreadable attempt
    if re.search(r"\bd[12]\b|\d|\btie\b|\bboth\b|\bneither\b|\bnone\b|两者|都", frag, re.I):
        return AMBIGUOUS
    return None


_ANSWER_WORDS = (
    r"final\s+answer|answer|final\s+verdict|verdict|decision|choice|preference|prediction|conclusion|judg(?:e)?ment"
    r"|respuesta|r[ée]ponse|antwort|risposta|resposta"
)
_MARKERS = [
    re.compile(r"\\boxed\{\s*(?P<frag>[^}]*)\}", re.I),
    re.compile(r"<answer>\s*(?P<frag>.*?)\s*</answer>", re.I | re.S),
    re.compile(r"\[\[\s*(?P<frag>[^\]\n]{1,40})\s*\]\]"),
    re.compile(
        rf"(?:^|(?<=[\s>(\[{{,\"'*]))[\"']?(?:{_ANSWER_WORDS})[\"']?(?:\s+is)?\s*[:：=]\s*(?P<frag>[^\n]*)", re.I
    ),
    re.compile(rf"(?:^|(?<=\s))(?:{_ANSWER_WORDS})\s+-\s+(?P<frag>[^\n]*)", re.I),
    re.compile(r"\b(?:my\s+|the\s+)?final\s+(?:answer|verdict|decision|choice)\s+is\s+(?P<frag>[^\n]*)", re.I),
    re.compile(r"\bthe\s+(?:correct\s+|best\s+|right\s+)?answer\s+(?:is|would\s+be)\s+(?P<frag>[^\n]*)", re.I),
    re.compile(r"(?:最终答案|最终结论|最终判断|答案|结论|判断|裁决)\s*(?:是|为)?\s*[:：]?\s*(?P<frag>[^\n]*)"),
]
_JSON_KEYS = ("answer", "final_answer", "verdict", "preference", "choice", "winner", "better", "label", "prediction")
_JSON_FIELD = re.compile(
    r"[\"'](?P<key>" + "|".join(_JSON_KEYS) + r")[\"']\s*:\s*(?P<value>\"[^\"\n]*\"?|'[^'\n]*'?|-?[\w.]+)", re.I
)


def _json_markers(text: str) -> list[tuple[int, str | None]]:
    """(position, claim) of every answer-like field in JSON objects (whole, fenced, or cut short)."""
    found = []
    for m in _JSON_FIELD.finditer(text):
        raw = m.group("value").strip("\"'")
        if re.fullmatch(r"-?\d+(?:\.\d+)?", raw):
            claim = raw if raw in ("1", "2") else AMBIGUOUS
        else:
            claim = _read_fragment(_normalise(raw)) or AMBIGUOUS
        found.append((m.start(), claim))
    return found


def classify_fragment(fragment: str) -> Verdict:
    """The verdict in an answer fragment (`"2"`, `"Description 1 is better"`, `"tie"`,
    `"Both capture sadness, but Description 1 is more accurate"`), else INVALID.

    A leading label counts only when nothing after it turns it into the subject of a sentence
    (`"Description 1 is worse than Description 2"` is read as a whole, and gives 2)."""
    return _verdict(_read_fragment(_normalise(fragment)))


def _strip_thinking(text: str) -> str:
    text = re.sub(r"<think>.*?</think>", " ", text, flags=re.S | re.I)
    cut = re.search(r"<think>", text, re.I)  # an unclosed thinking block: everything after it is tentative
    return text[: cut.start()] if cut else text


def parse_verdict(text: str | None) -> Verdict:
    """The final verdict in a judge's output.

    The text is read in three passes, most trusted first:

    1. answers the model marks as such: `Answer: 2`, `Final answer: Description 1`, `**Verdict:** tie`,
       `\\boxed{2}`, `<answer>1</answer>`, `[[2]]`, JSON (`{"answer": 2, "reason": "..."}`, also inside a ```json
       fence), the same markers in Chinese (`答案：描述2`) and a few other languages, and a last line that is
       nothing but a label. The LAST marker that says something decides; a marker whose answer is unreadable
       (`Answer: 12`, `Answer: 1 or 2`, `Answer: Description 1 is not better`) makes the verdict INVALID rather
       than falling back to an earlier one;
    2. without markers, concluding statements: `Description 2 is better`, `I prefer the first description`,
       `Description 1 is worse than Description 2`, `both are equally accurate`; the last one decides, so a label
       preferred mid-reasoning and revised later does not;
    3. a bare label as the whole answer (`2`, `Description 1.`, `(tie)`).

    How a statement is read (`classify_fragment` for marker answers, the same rules for free text):

    - references to the descriptions are normalised first (`Description 2`, `the second one`, `the latter`,
      `描述二`, `第一个描述`, `Beschreibung 1`, ...);
    - a comparative binds to the nearest description named before it (`Description 2 captures the voice better
      than Description 1` -> 2; `X 比 Y 更好` -> X); a negative comparative (`worse`, `less accurate`, `不如`) names
      the other one; choice verbs (`I choose Description 2`) name their object; equality phrases (`equally good`,
      `no preference`, `平局`) are a tie. Words that name no quality (`more detailed`, `both capture sadness`) say
      nothing;
    - a negation before the claim in the same clause (`I would not say Description 1 is better`) makes the claim
      unreadable, never its opposite;
    - clauses are read in order: a claim after `but` / `however` / `so` or in a later sentence revises an earlier
      one; a claim in a concessive clause (`although Description 1 is better in tone, ...`) is ignored; a claim in
      a justification (`because` / `since`) must agree with the claim it supports, else the statement is
      unreadable; two different claims in one clause are unreadable.

    Args:
        text: the model's output; None or empty gives INVALID.

    Returns:
        `Verdict.FIRST`, `SECOND`, `TIE`, or `INVALID` when no single verdict can be read.
    """
    if not text or not text.strip():
        return Verdict.INVALID
    text = _strip_thinking(text)
    if not text.strip():
        return Verdict.INVALID
    found: list[tuple[int, str | None]] = _json_markers(text)
    for pattern in _MARKERS:
        for m in pattern.finditer(text):
            frag = m.group("frag")
            if not frag.strip():  # "Answer:" with the answer on the next line
                nxt = re.match(r"\s*\n\s*([^\n]+)", text[m.end() :])
                frag = nxt.group(1) if nxt else ""
            found.append((m.start("frag"), _read_fragment(_normalise(frag))))
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if len(lines) > 1:  # a last line that is nothing but a label is the model's answer line
        last = _normalise(lines[-1]).strip(" .!*()[]\"'")
        if re.fullmatch(r"d[12]|[12]|tie", last):
            found.append((len(text), last[-1] if last != "tie" else "tie"))
    decided = [(pos, claim) for pos, claim in found if claim is not None]
    if decided:
        return _verdict(max(decided, key=lambda item: item[0])[1])
    if re.match(r"\s*(?:```(?:json)?\s*)?\{", text):
        return Verdict.INVALID  # a JSON answer without an answer field: its "reason" is reasoning, not a verdict
    claim = _read_statement(_normalise(text))
    if claim is not None:
        return _verdict(claim)
    bare = _normalise(text).strip(" \t\n.:;,!\"'()[]")
    if re.fullmatch(r"d[12]|[12]|tie", bare):
        return _verdict(bare[-1] if bare != "tie" else "tie")
    return Verdict.INVALID


class NonFiniteLogitsError(ValueError):
    """A model's answer logits hold a NaN or an infinity: its weights are broken (a diverged training run), not the
    call; every call of it would fail alike (`Generation.failed` marks the call `broken_model`)."""


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
        ValueError: unknown labels or a length mismatch; `NonFiniteLogitsError`: a NaN or infinite logit.
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
        raise NonFiniteLogitsError(f"non-finite answer logits {values}")
    top = max(values)
    exp = [math.exp(v - top) for v in values]
    total = sum(exp)
    probs = {label: e / total for label, e in zip(labels, exp)}
    winners = [label for label, v in zip(labels, values) if v == top]
    verdict = Verdict(winners[0]) if len(winners) == 1 else Verdict.TIE
    return verdict, probs


__all__ = ["AMBIGUOUS", "NonFiniteLogitsError", "classify_fragment", "parse_verdict", "verdict_from_logits"]

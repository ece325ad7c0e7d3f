import collections
import json
import math
from pathlib import Path

import pytest

from emoreward.data.verdicts import Verdict
from emoreward.evaluation import metrics
from zero_shot.parsing import parse_verdict, verdict_from_logits


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # the final verdict wins over labels mentioned while reasoning
        (
            "Description 1 is more detailed and mentions anger. However, Description 2 captures the sadness in the "
            "voice, so Description 2 is better.\nAnswer: 2",
            "2",
        ),
        ("At first I thought Description 1 is better, but on reflection Description 2 is more accurate.", "2"),
        ("Answer: 1 would be wrong here since the second is closer.\nFinal answer: 2", "2"),
        ("Answer: 2\nDescription 2 names the cues; Description 1 is better written but wrong.", "2"),
        ("**Final Answer:** Description 2", "2"),
        ("### Verdict: Description 1", "1"),
        ("The answer is \\boxed{1}.", "1"),
        ('{"reasoning": "d1 lists cues", "answer": "1"}', "1"),
        ("<think>Description 2 is better? no.</think><answer>1</answer>", "1"),
        ("I would choose Description 1 because it matches the reference.", "1"),
        ("Answer: The first description", "1"),
        ("2", "2"),
        ("Description 1.", "1"),
        ("(2)", "2"),
        # ties
        ("Answer: tie", "tie"),
        ("Answer: Both are equally good.", "tie"),
        ("Both descriptions are equally accurate.", "tie"),
        ("Description 1 is better in tone. Description 2 is better in cues. It's a tie.", "tie"),
        # unparseable -> INVALID, never a class
        ("", "invalid"),
        ("I cannot determine this from the text.", "invalid"),
        ("Description 1 mentions happiness. Description 2 mentions sadness.", "invalid"),
        ("Answer: 2.5", "invalid"),
        ("Answer: 3", "invalid"),
    ],
)
def test_parse_verdict_reads_the_final_verdict(text, expected):
    assert parse_verdict(text).value == expected


@pytest.mark.parametrize(
    ("text", "allowed"),
    [
        # a marker's answer is read as a whole, not by its first word
        ("Answer: Both capture sadness, but Description 1 is more accurate.", {"1", "invalid"}),
        ("Verdict: Both are plausible; Description 2 is better.", {"2", "invalid"}),
        ("Final answer: Description 1 and Description 2 are equally good.", {"tie", "invalid"}),
        ("Answer: Description 1 is worse than Description 2.", {"2", "invalid"}),
        ("Final answer: Description 1 is less accurate, so I choose Description 2", {"2", "invalid"}),
        # negation never flips a claim into its opposite
        ("I would not say Description 1 is better.", {"invalid"}),
        ("I don't think Description 2 is better. Description 1 fits the anger.", {"invalid", "1"}),
        # numbers that merely start with a label
        ("Answer: 12", {"invalid"}),
        ("Answer: 10", {"invalid"}),
        # JSON answers
        ('{"answer": 2, "reason": "..."}', {"2"}),
        ('{"answer": 1}', {"1"}),
        ('{"verdict": 2}', {"2"}),
        ('```json\n{"answer": 1}\n```', {"1"}),
    ],
)
def test_reported_misreadings(text, allowed):
    assert parse_verdict(text).value in allowed


CORPUS = Path(__file__).with_name("verdict_corpus.jsonl")


def test_labelled_corpus_no_wrong_class():
    """The parser on `verdict_corpus.jsonl` (realistic judge outputs, each labelled with its verdict or INVALID).

    A wrong class is worse than INVALID: zero are allowed. Agreement is printed per kind (`pytest -s`)."""
    rows = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(rows) >= 60 and {r["verdict"] for r in rows} == {"1", "2", "tie", "invalid"}
    assert {"chinese", "json", "negation", "truncated", "tie", "comparative"} <= {r["kind"] for r in rows}
    per_kind = collections.defaultdict(lambda: [0, 0])
    wrong, missed = [], []
    for row in rows:
        got = parse_verdict(row["text"]).value
        per_kind[row["kind"]][0] += got == row["verdict"]
        per_kind[row["kind"]][1] += 1
        if got != row["verdict"]:
            (missed if got == "invalid" else wrong).append((row["text"], row["verdict"], got))
    agreement = sum(a for a, _ in per_kind.values()) / len(rows)
    print(f"verdict corpus: {agreement:.1%} agreement on {len(rows)} outputs; " + ", ".join(
        f"{k} {a}/{n}" for k, (a, n) in sorted(per_kind.items())))  # fmt: skip
    assert wrong == [], f"wrong classes (worse than INVALID): {wrong}"
    assert agreement >= 0.95, f"unread verdicts: {missed}"


def test_invalid_answers_are_counted_not_mapped():
    outputs = ["Answer: 1", "no idea", "Answer: 2", "", "Answer: tie"]
    pred = [parse_verdict(t).value for t in outputs]
    assert pred == ["1", "invalid", "2", "invalid", "tie"]
    rec = metrics.recognition(["1", "1", "2", "2", "tie"], pred, "three-class")
    assert rec["n_invalid"] == 2
    assert rec["acc"] == pytest.approx(60.0)  # the two invalid answers are errors, not ties or firsts


def test_verdict_from_logits_probabilities_and_ties():
    verdict, probs = verdict_from_logits([2.0, 0.0, 0.0])
    assert verdict is Verdict.FIRST
    assert sum(probs.values()) == pytest.approx(1.0)
    assert probs["1"] == pytest.approx(1 / (1 + 2 * pytest.importorskip("math").exp(-2.0)))
    assert verdict_from_logits({"1": 1.0, "2": 1.0})[0] is Verdict.TIE
    # the rule is an argmax, not a threshold on p(tie): equal top logits are a TIE however unlikely "tie" is, and
    # the smallest difference decides (a diverged judge's p(1) = p(2) = 0.4993, p(tie) = 0.0013)
    verdict, probs = verdict_from_logits([0.0, 0.0, -math.log(0.4993 / 0.0013)])
    assert verdict is Verdict.TIE and probs["tie"] == pytest.approx(0.0013, abs=1e-4)
    assert verdict_from_logits([1e-6, 0.0, -6.0])[0] is Verdict.FIRST
    with pytest.raises(ValueError, match="labels"):
        verdict_from_logits([1.0], labels=("yes",))

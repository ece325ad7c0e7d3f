import pytest

from emoreward.evaluation import metrics
from emoreward.evaluation.verdicts import Verdict
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
    with pytest.raises(ValueError, match="labels"):
        verdict_from_logits([1.0], labels=("yes",))

"""One evaluation harness for reward models and zero-shot judges: verdicts, metrics, reports."""

from emoreward.evaluation.harness import JudgementSet, evaluate_judgements, run_judge
from emoreward.evaluation.judge import Judge, RewardModelJudge, verdict_from_difference
from emoreward.evaluation.verdicts import Judgement, Verdict


__all__ = [
    "Judge",
    "Judgement",
    "JudgementSet",
    "RewardModelJudge",
    "Verdict",
    "evaluate_judgements",
    "run_judge",
    "verdict_from_difference",
]

"""One evaluation harness for reward models and zero-shot judges: judges, metrics, reports (the verdicts themselves
are `emoreward.data.verdicts`)."""

from emoreward.evaluation.harness import JudgementSet, evaluate_judgements, evaluate_model, run_judge
from emoreward.evaluation.judge import Judge, RewardModelJudge


__all__ = ["Judge", "JudgementSet", "RewardModelJudge", "evaluate_judgements", "evaluate_model", "run_judge"]

"""Zero-shot judges S1-S4 (EmoPrefer / EMER-Ranker baselines) on the shared evaluation harness.

A multimodal LLM (alone, or with an external text LLM) decides which of two emotion descriptions better matches
the person in a video. Judges are YAML files in `configs/judges/`; prompts are versioned YAML in
`configs/prompts/`. See `zero_shot.runner.run_zero_shot` and the `emoreward judge` command; `load_judge` gives one
judge and strategy as an `emoreward` `Judge` for any harness caller (`emoreward rank`). This package builds on
`emoreward`; `emoreward` imports it only inside `emoreward.judges.load_judge`.
"""

from zero_shot.cache import CallCache, CallKey
from zero_shot.config import (
    JudgeConfig,
    LazyBackend,
    ModelConfig,
    available_judges,
    backend_identity,
    build_backend,
    load_judge_config,
)
from zero_shot.crowd import combine_normal_swapped, crowd_member, crowdsource, majority_vote, per_run_summary
from zero_shot.loading import judge_cache_path, load_judge
from zero_shot.parsing import parse_verdict, verdict_from_logits
from zero_shot.prompts import PromptSet, load_prompts
from zero_shot.runner import run_zero_shot, table2_markdown
from zero_shot.strategies import STRATEGIES, MissingReferenceError, ZeroShotJudge, load_references


__all__ = [
    "STRATEGIES",
    "CallCache",
    "CallKey",
    "JudgeConfig",
    "LazyBackend",
    "MissingReferenceError",
    "ModelConfig",
    "PromptSet",
    "ZeroShotJudge",
    "available_judges",
    "backend_identity",
    "build_backend",
    "combine_normal_swapped",
    "crowd_member",
    "crowdsource",
    "judge_cache_path",
    "load_judge",
    "load_judge_config",
    "load_prompts",
    "load_references",
    "majority_vote",
    "parse_verdict",
    "per_run_summary",
    "run_zero_shot",
    "table2_markdown",
    "verdict_from_logits",
]

"""Hand a trained reward model to RL pipelines: a GRPO reward function (TRL), a merged `transformers` export, an HTTP
reward server (OpenRLHF `--remote_rm_url`, any client) and verl custom reward functions."""

from emoreward.export.grpo import EmotionReward, completion_text
from emoreward.export.hf import ExportMismatchError, ExportReport, export_hf
from emoreward.export.serve.http import RewardServer
from emoreward.export.serve.protocol import ServerLimits
from emoreward.export.serve.service import RewardService
from emoreward.export.verl import compute_score, compute_score_batch


__all__ = [
    "EmotionReward",
    "ExportMismatchError",
    "ExportReport",
    "RewardServer",
    "RewardService",
    "ServerLimits",
    "completion_text",
    "compute_score",
    "compute_score_batch",
    "export_hf",
]

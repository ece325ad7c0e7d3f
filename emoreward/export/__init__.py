"""Hand a trained reward model to RL pipelines: a GRPO reward function (TRL), a merged `transformers` export
(verl, OpenRLHF) and an HTTP reward server (OpenRLHF `--remote_rm_url`)."""

from emoreward.export.grpo import EmotionReward, completion_text
from emoreward.export.hf import ExportMismatchError, ExportReport, export_hf
from emoreward.export.server import RewardServer, RewardService, ServerLimits


__all__ = [
    "EmotionReward",
    "ExportMismatchError",
    "ExportReport",
    "RewardServer",
    "RewardService",
    "ServerLimits",
    "completion_text",
    "export_hf",
]

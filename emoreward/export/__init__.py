"""Hand a trained reward model to RL pipelines: a GRPO reward function (TRL), a merged `transformers` export, an HTTP
reward server (OpenRLHF `--remote_rm_url`, any client) and verl custom reward functions.

The names below are imported on first use (PEP 562), so that a process that needs one part (the reward server's
HTTP process, which loads no model) does not import torch for another (the merged export).
"""

import importlib

# the served engines of `emoreward.models.loading.open_reward_model` ("vllm", "server") register here
import emoreward.export.engines  # noqa: F401


_WHERE = {
    "EmotionReward": "emoreward.export.grpo",
    "completion_text": "emoreward.export.grpo",
    "ExportMismatchError": "emoreward.export.hf",
    "ExportReport": "emoreward.export.hf",
    "export_hf": "emoreward.export.hf",
    "RewardServer": "emoreward.export.serve.http",
    "ServerLimits": "emoreward.export.serve.protocol",
    "RewardService": "emoreward.export.serve.service",
    "compute_score": "emoreward.export.verl",
    "compute_score_batch": "emoreward.export.verl",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'emoreward.export' has no attribute {name!r}")


__all__ = sorted(_WHERE)

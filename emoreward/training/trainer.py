"""`EmoRewardTrainer`: TRL's RewardTrainer with a tie-aware Bradley-Terry likelihood.

With `ties="drop"` it is TRL's trainer unchanged. With `"rao-kupper"` or `"davidson"`, tie pairs stay in the
data (flag `tie`) and the loss is the negative log-likelihood of each pair's outcome (see `losses.py`); TRL's
own metrics (reward accuracy, margin, mean reward) are kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from trl import RewardTrainer
from trl.trainer.reward_trainer import DataCollatorForPreference

from emoreward.training.losses import pairwise_nll


@dataclass
class TieAwarePreferenceCollator(DataCollatorForPreference):
    """TRL's preference collator plus a `tie` tensor of shape `(batch,)` (1.0 for a tie pair)."""

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        output = super().torch_call(examples)
        output["tie"] = torch.tensor([float(e.get("tie", 0.0)) for e in examples], dtype=torch.float)
        return output


class EmoRewardTrainer(RewardTrainer):
    """RewardTrainer whose loss follows `args.ties` (an `EmoRewardConfig`)."""

    def __init__(self, *args, **kwargs):
        config = kwargs.get("args")
        if kwargs.get("data_collator") is None and config is not None and config.ties != "drop":
            processing_class = kwargs["processing_class"]
            kwargs["data_collator"] = TieAwarePreferenceCollator(
                pad_token_id=processing_class.pad_token_id, pad_to_multiple_of=config.pad_to_multiple_of
            )
        super().__init__(*args, **kwargs)

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = ["chosen_ids", "rejected_ids", "margin", "tie", self.args.length_column_name]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        tie = inputs.pop("tie", None)
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        if self.args.ties != "drop":
            chosen, rejected = torch.chunk(outputs.logits.squeeze(-1), chunks=2)
            loss = pairwise_nll(chosen - rejected, tie, self.args.ties, self.args.tie_parameter).mean()
            if self.args.center_rewards_coefficient is not None:
                loss = loss + self.args.center_rewards_coefficient * torch.mean((chosen + rejected) ** 2)
        return (loss, outputs) if return_outputs else loss

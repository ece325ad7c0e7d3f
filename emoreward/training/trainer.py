"""`EmoRewardTrainer`: TRL's RewardTrainer with tie-aware and length-controlled losses.

With `ties: drop` and `length_debias: none` (or `penalty`, which acts after training) it is TRL's trainer and
loss unchanged. Otherwise `compute_loss` is replaced, keeping TRL's metrics (reward accuracy, margin, min /
mean / max reward, tokens):

- `ties: rao-kupper | davidson`: tie pairs stay in the data and the loss is the negative log-likelihood of each
  pair's outcome (`losses.py`);
- `length_debias: reweight`: each pair's loss is weighted so that length-aligned and length-counter pairs weigh
  equally (`preprocess.length_balance_weights`);
- `length_debias: disentangled` (ODIN, Chen et al. 2024, "Disentangled Reward Mitigates Hacking in RLHF",
  section 3): two heads, quality q and length l; the preference likelihood uses q + l, and
  `odin_length_weight * (|corr(q, L)| - corr(l, L))` over the batch's sequences plus
  `odin_orthogonal_weight * |cos(w_q, w_l)|` push length into l and out of q. Only q is the reward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from trl import RewardTrainer
from trl.trainer.reward_trainer import DataCollatorForPreference

from emoreward.training.losses import reward_model_loss


EXTRA_COLUMNS = ("tie", "weight", "length_chosen", "length_rejected")


@dataclass
class EmoPreferenceCollator(DataCollatorForPreference):
    """TRL's preference collator plus per-pair float tensors of shape `(batch,)`: `tie`, `weight`,
    `length_chosen`, `length_rejected` (those present in the examples)."""

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        output = super().torch_call(examples)
        for key in EXTRA_COLUMNS:
            if key in examples[0]:
                output[key] = torch.tensor([float(e[key]) for e in examples], dtype=torch.float)
        return output


def value_head_weight(model: torch.nn.Module) -> torch.Tensor:
    """The trainable weight matrix of the value head (`score` or `classifier`), shape `(num_heads, hidden)`."""
    candidates = [
        p
        for n, p in model.named_parameters()
        if p.requires_grad and n.endswith("weight") and ("score" in n or "classifier" in n) and "lora_" not in n
    ]
    if len(candidates) != 1:
        raise ValueError(f"expected one trainable value-head weight, found {len(candidates)}")
    return candidates[0]


class EmoRewardTrainer(RewardTrainer):
    """RewardTrainer whose loss follows `args.ties` and `args.length_debias` (an `EmoRewardConfig`)."""

    def __init__(self, *args, **kwargs):
        config = kwargs.get("args")
        if kwargs.get("data_collator") is None and config is not None:
            processing_class = kwargs["processing_class"]
            kwargs["data_collator"] = EmoPreferenceCollator(
                pad_token_id=processing_class.pad_token_id, pad_to_multiple_of=config.pad_to_multiple_of
            )
        model = kwargs.get("model")
        heads = getattr(getattr(model, "config", None), "num_labels", 1)
        if heads > 1:
            # TRL accepts only one-output models; the disentangled reward has two heads and its own loss
            model.config.num_labels = 1
        try:
            super().__init__(*args, **kwargs)
        finally:
            if heads > 1:
                model.config.num_labels = heads

    @property
    def _custom_loss(self) -> bool:
        return self.args.ties != "drop" or self.args.length_debias in ("reweight", "disentangled")

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = [
                "chosen_ids",
                "rejected_ids",
                "margin",
                self.args.length_column_name,
                *EXTRA_COLUMNS,
            ]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        extras = {key: inputs.pop(key) for key in EXTRA_COLUMNS if key in inputs}
        if not self._custom_loss:
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        mode = "train" if self.model.training else "eval"
        inputs["use_cache"] = False
        outputs = model(**inputs)
        logits = outputs.logits  # (2 * batch, num_heads): chosen rows first, then rejected
        quality = logits[:, 0]
        disentangled = self.args.length_debias == "disentangled"
        out = reward_model_loss(
            logits,
            tie=extras.get("tie"),
            ties=self.args.ties,
            tie_parameter=self.args.tie_parameter,
            weights=extras.get("weight") if self.args.length_debias == "reweight" else None,
            lengths=torch.cat([extras["length_chosen"], extras["length_rejected"]]) if disentangled else None,
            head_weight=value_head_weight(model) if disentangled else None,
            odin_length_weight=self.args.odin_length_weight,
            odin_orthogonal_weight=self.args.odin_orthogonal_weight,
        )
        loss = out.loss
        if disentangled:
            self._metrics[mode]["corr_quality_length"].append(out.corr_quality_length.item())
            self._metrics[mode]["corr_lengthhead_length"].append(out.corr_lengthhead_length.item())
        q_chosen, q_rejected = torch.chunk(quality, chunks=2)
        if self.args.center_rewards_coefficient is not None:
            loss = loss + self.args.center_rewards_coefficient * torch.mean((q_chosen + q_rejected) ** 2)
        self._log_reward_metrics(mode, inputs, quality, q_chosen, q_rejected)
        return (loss, outputs) if return_outputs else loss

    def _log_reward_metrics(self, mode, inputs, rewards, chosen, rejected) -> None:
        """TRL's reward metrics (as in `RewardTrainer.compute_loss`), for the reward head."""
        if mode == "train":
            tokens = self.accelerator.gather_for_metrics(inputs["attention_mask"].sum()).sum().item()
            self._total_train_tokens += tokens // self._tp_size
        self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
        with torch.no_grad():
            all_rewards = self.accelerator.gather(rewards.detach())
            self._metrics[mode]["min_reward"].append(all_rewards.min().item())
            self._metrics[mode]["mean_reward"].append(all_rewards.mean().item())
            self._metrics[mode]["max_reward"].append(all_rewards.max().item())
            accuracy = self.accelerator.gather_for_metrics((chosen > rejected).float().mean()).mean().item()
            self._metrics[mode]["accuracy"].append(accuracy)
            margin = self.accelerator.gather_for_metrics((chosen - rejected).mean()).mean().item()
            self._metrics[mode]["margin"].append(margin)

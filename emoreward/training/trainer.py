"""`EmoRewardTrainer`: TRL's RewardTrainer for every reward model emoreward trains, text or multimodal; the adapter
gives value-head outputs and the objective registry the loss. See docs/training.md.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers.trainer_callback import PrinterCallback, ProgressCallback, TrainerCallback
from transformers.trainer_pt_utils import LengthGroupedSampler, get_length_grouped_indices
from trl import RewardTrainer

from emoreward.training.objectives import get_objective
from emoreward.training.preprocess import EXTRA_COLUMNS
from emoreward.training.step_plan import gather_reward_metrics


if TYPE_CHECKING:
    from emoreward.training.adapters import BackboneAdapter


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


def divergence_error(
    args, step: int, what: str, value: float, *, name: str | None = None, rate_field: str = "learning_rate"
) -> ValueError:
    """The one line of a diverged training run (reward model or judge, any stage): `what` (``loss``,
    ``grad_norm``) was `value` (non-finite) at `step` (1-based) of the run `name` (default ``args.run_name``);
    `rate_field` names the recipe field that set ``args.learning_rate`` (the judge's DPO stage: ``dpo_learning_rate``).

    Returns:
        a `emoreward.models.base.NonFiniteError` to raise (the CLI prints it, exit 2)."""
    from emoreward.models.base import NonFiniteError

    quantity = "the loss" if what in ("loss", "train_loss") else f"the {what}"
    return NonFiniteError(
        f"{name or args.run_name or 'training'}: {quantity} is {float(value)} at step {step} (the run diverged; "
        f"{rate_field} {args.learning_rate:g}): stopped, nothing saved as the final model; lower {rate_field} or "
        "check the backbone's weights"
    )


class DivergenceGuard(TrainerCallback):
    """Stops any emoreward training (the reward trainer, the judge's SFT and DPO stages) at the first logged
    non-finite ``loss``, ``train_loss`` or ``grad_norm``, raising `divergence_error` (`name`, `rate_field` as
    there). It turns off transformers' `logging_nan_inf_filter` at the start of training (that filter hides a NaN
    step loss from the log), so a NaN loss of any step reaches the next log, at the latest the end-of-training
    one, before `train` returns."""

    def __init__(self, name: str | None = None, rate_field: str = "learning_rate"):
        self.name, self.rate_field = name, rate_field

    def on_train_begin(self, args, state, control, **kwargs):
        args.logging_nan_inf_filter = False

    def on_log(self, args, state, control, logs=None, **kwargs):
        for key in ("loss", "train_loss", "grad_norm"):
            value = (logs or {}).get(key)
            if isinstance(value, (int, float)) and not math.isfinite(value):
                raise divergence_error(args, state.global_step, key, value, name=self.name, rate_field=self.rate_field)


def set_up_callbacks(trainer, name: str | None = None, rate_field: str = "learning_rate") -> None:
    """The callbacks of every emoreward trainer (the reward trainer, the judge's SFT and DPO stages), set on
    `trainer` (a `transformers.Trainer`) in place: no dict printed per logging step (transformers' `PrinterCallback`
    removed: the values reach ``report_to`` and the report), one progress bar named after the run
    (`RewardProgressCallback`, none with ``disable_tqdm``) and the `DivergenceGuard` (`name`, `rate_field` as
    there)."""
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    if not trainer.args.disable_tqdm:
        trainer.add_callback(RewardProgressCallback())
    trainer.add_callback(DivergenceGuard(name, rate_field))


class EmoRewardTrainer(RewardTrainer):
    """RewardTrainer whose batches come from a backbone adapter and whose loss follows `args.ties` and
    `args.length_debias` (an `EmoRewardConfig`). Batches of an epoch depend on (seed, epoch) alone
    (`EpochSeededLengthGroupedSampler`), so a resumed run trains on the same batches; progress is a tqdm bar
    (`RewardProgressCallback`); CPU speed-ups are `train`'s.

    Args:
        adapter: the backbone adapter of the reward model's kind (collator, signature columns, value-head outputs).
        model: the network to train (`reward_model.model`).
        args: the `EmoRewardConfig`.
        **kwargs: `train_dataset`, `eval_dataset`, `processing_class`, ... as for `trl.RewardTrainer`."""

    def __init__(self, *args, adapter: BackboneAdapter, **kwargs):
        self.adapter = adapter
        self.objective = get_objective(kwargs["args"].length_debias)
        model = kwargs.get("model")
        heads = getattr(getattr(model, "config", None), "num_labels", 1)
        if heads > 1:  # TRL accepts only one-output models; the disentangled reward has two heads
            model.config.num_labels = 1
        try:
            super().__init__(*args, **kwargs)
        finally:
            if heads > 1:
                model.config.num_labels = heads
        set_up_callbacks(self)

    run_identity: dict | None = None  # written into every step checkpoint (emoreward.training.run_identity)

    def train(self, *args, **kwargs):
        """`Trainer.train`; on a CPU (no DeepSpeed) LoRA linear layers run as one autograd function each
        (`emoreward.training.fused_lora`), and a bf16 run trains in `emoreward.training.cpu_bf16.cpu_bf16_training`
        (frozen modules in bf16, float32 attention, no per-pass casts); both undo themselves when training ends."""
        from emoreward.training.cpu_bf16 import cpu_bf16_training
        from emoreward.training.fused_lora import fused_lora_linears

        cpu = self.args.device.type == "cpu" and not self.is_deepspeed_enabled
        try:
            with (
                fused_lora_linears(self.model, enabled=cpu),
                cpu_bf16_training(self.model, enabled=cpu and bool(self.args.bf16)),
            ):
                return super().train(*args, **kwargs)
        finally:
            drop_mixed_precision_forward(self.model)

    def _save_checkpoint(self, model, trial):
        """The Trainer's checkpoint, with the run's identity written into the folder first: a checkpoint complete
        enough to resume from (its `trainer_state.json` is written last) always names its run."""
        from emoreward.models.base import check_finite_weights

        # a step that left NaN / infinite weights (its loss was still finite) is never kept to resume from
        check_finite_weights(model, f"{self.args.run_name or 'training'} at step {self.state.global_step}")
        if self.run_identity is not None and self.args.should_save:
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            from emoreward.training.run_identity import write_identity

            write_identity(
                Path(self._get_output_dir(trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}",
                self.run_identity,
            )
        return super()._save_checkpoint(model, trial)

    def _get_train_sampler(self, train_dataset=None):
        sampler = super()._get_train_sampler(train_dataset)
        if type(sampler) is LengthGroupedSampler:
            seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
            return EpochSeededLengthGroupedSampler(sampler.batch_size, sampler.lengths, seed=seed)
        return sampler

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = list(self.adapter.signature_columns(self.args))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        mode = "train" if self.model.training else "eval"
        extras = {key: inputs.pop(key) for key in EXTRA_COLUMNS if key in inputs}
        logits = self.adapter.logits(model, inputs)  # (2 * batch, num_heads): chosen rows first, then rejected
        objective = self.objective
        out = objective.loss(
            logits,
            tie=extras.get("tie"),
            ties=self.args.ties,
            tie_parameter=self.args.tie_parameter,
            weight=extras.get("weight"),
            lengths=torch.cat([extras["length_chosen"], extras["length_rejected"]])
            if objective.disentangled
            else None,
            head_weight=value_head_weight(model) if objective.disentangled else None,
            odin_length_weight=self.args.odin_length_weight,
            odin_orthogonal_weight=self.args.odin_orthogonal_weight,
            margin=extras.get("margin"),
        )
        loss = out.loss
        quality = logits[:, 0]
        chosen, rejected = torch.chunk(quality, chunks=2)
        if self.args.center_rewards_coefficient is not None:
            loss = loss + self.args.center_rewards_coefficient * torch.mean((chosen + rejected) ** 2)
        if objective.disentangled:
            self._metrics[mode]["corr_quality_length"].append(out.corr_quality_length.item())
            self._metrics[mode]["corr_lengthhead_length"].append(out.corr_lengthhead_length.item())
        if mode == "train" and not bool(torch.isfinite(loss.detach()).all()):
            # stop at the step itself (`DivergenceGuard` sees a loss only when it is logged)
            raise divergence_error(self.args, self.state.global_step + 1, "loss", loss.detach().float().mean())
        self._log_reward_metrics(mode, inputs, quality, chosen, rejected, extras.get("tie"))
        if return_outputs:
            return loss, {"rewards_chosen": chosen, "rewards_rejected": rejected}
        return loss

    def _log_reward_metrics(self, mode, inputs, rewards, chosen, rejected, tie) -> None:
        """TRL's reward metrics (as in `RewardTrainer.compute_loss`), on the reward head; accuracy and margin over
        the decided (non-tie) pairs of every process (`emoreward.training.step_plan.gather_reward_metrics`)."""
        if mode == "train":
            tokens = self.accelerator.gather_for_metrics(inputs["attention_mask"].sum()).sum().item()
            self._total_train_tokens += tokens // self._tp_size
        self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
        metrics = gather_reward_metrics(self.accelerator, chosen, rejected, tie)  # the same gathers on every rank
        for key, value in metrics.items():
            if value is not None:
                self._metrics[mode][key].append(value)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Under DeepSpeed ZeRO-3 + LoRA, gather the adapter and the whole value head (its frozen bias too, which
        transformers' trainable-only gather leaves out and peft needs) from their shards and write them from the main
        process."""
        from emoreward.training.distributed import gather_adapter_state_dict, zero3_enabled

        if not (self.is_deepspeed_enabled and zero3_enabled() and hasattr(self.model, "peft_config")):
            return super().save_model(output_dir, _internal_call)
        state_dict = gather_adapter_state_dict(self.model)
        if self.args.should_save:
            self._save(output_dir or self.args.output_dir, state_dict=state_dict)


def drop_mixed_precision_forward(model: torch.nn.Module) -> None:
    """Give `model` its own forward again after a mixed-precision run (accelerate leaves `model.forward` wrapped in
    autocast, so a bf16-trained network would score in bf16)."""
    original = model.__dict__.pop("_original_forward", None)
    if original is None:
        return
    if getattr(original, "__func__", None) is getattr(type(model), "forward", None):
        model.__dict__.pop("forward", None)  # the class's own forward
    else:
        model.forward = original


class EpochSeededLengthGroupedSampler(LengthGroupedSampler):
    """transformers' `LengthGroupedSampler` drawn from a generator seeded with `seed + epoch` (`set_epoch` is called
    before every epoch, also on resume): the order of an epoch depends on the seed and the epoch alone.

    Args:
        batch_size: pairs per optimizer step (`train_batch_size * gradient_accumulation_steps`), the mega-batch unit.
        lengths: per-example lengths (the dataset's `length_column_name`).
        seed: `data_seed`, else `seed`."""

    def __init__(self, batch_size: int, lengths: list[int], *, seed: int):
        super().__init__(batch_size, lengths=list(lengths))
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self):
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return iter(get_length_grouped_indices(self.lengths, self.batch_size, generator=generator))


class RewardProgressCallback(ProgressCallback):
    """The training progress bar (main process), named after the run, with the latest loss and reward accuracy as
    its postfix instead of a printed dict per logging step."""

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        if self.training_bar is not None and args.run_name:
            self.training_bar.set_description(args.run_name)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not (state.is_world_process_zero and self.training_bar is not None and logs):
            return
        shown = {k: f"{logs[k]:.3g}" for k in ("loss", "accuracy", "eval_accuracy") if isinstance(logs.get(k), float)}
        if shown:
            self.training_bar.set_postfix(shown, refresh=False)


__all__ = [
    "EmoRewardTrainer",
    "EpochSeededLengthGroupedSampler",
    "drop_mixed_precision_forward",
    "RewardProgressCallback",
    "set_up_callbacks",
    "value_head_weight",
]

"""Training multimodal reward models: config, pair encoding, collator, trainer, judge, run.

- `MultimodalRewardConfig` extends `EmoRewardConfig` with the media fields (backbone family, media root, fps,
  frame cap, the `use_audio_in_video` flag, projector training, what to do with bad media).
- `build_multimodal_dataset` encodes each labelled pair as chosen / rejected token ids sharing ONE media prefix;
  a pair whose media prefix does not fit `max_length` is dropped and counted (a media span is never cut), as are
  pairs with missing or unreadable media when `media_errors: skip`.
- `MultimodalPreferenceCollator` decodes the media of a batch and lays out `[chosen..., rejected...]` with the
  media tensors duplicated for the two halves.
- `MultimodalRewardTrainer` is emoreward's `EmoRewardTrainer` (TRL's `RewardTrainer`) with a loss that takes
  these inputs: Bradley-Terry, or Rao-Kupper / Davidson with ties; TRL's metrics (accuracy, margin, mean reward)
  go to every `report_to` logger (W&B included).
- `MultimodalRewardJudge` is the reward model as a `Judge` for the shared evaluation harness; it scores both
  descriptions of a sample against one cached media prefix.
- `run_multimodal_training` is `emoreward train` for a multimodal recipe: the text path's stages and fold
  machinery (`emoreward.training.run`: stratified k-fold CV with `finished.json` resume, final fit, rank-0
  saving, mean ± std report) around `fit_multimodal_model` and `evaluate_multimodal`.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from datasets import Dataset
from transformers import set_seed

from emoreward.data import PreferencePair, load_pairs
from emoreward.data.media import MediaError, MediaOptions, load_sample_media
from emoreward.data.pairs import MediaRef
from emoreward.evaluation.judge import verdict_from_difference
from emoreward.evaluation.verdicts import Judgement, Verdict
from emoreward.models.multimodal import (
    MULTIMODAL_BACKBONES,
    MultimodalEmoRewardModel,
    collate_media,
    default_model_card,
    get_multimodal_backbone,
    pad_sequences,
)
from emoreward.training.config import EmoRewardConfig, load_config
from emoreward.training.losses import pairwise_nll
from emoreward.training.preprocess import EXCLUSION_REASONS, ExclusionReport
from emoreward.training.run import FitResult
from emoreward.training.trainer import EmoRewardTrainer


logger = logging.getLogger(__name__)

MediaErrorPolicy = Literal["raise", "skip"]

MULTIMODAL_EXCLUSION_REASONS = {
    **EXCLUSION_REASONS,
    "media_error": "pairs whose media is missing or unreadable (media_errors='skip')",
    "media_span_too_long": "pairs whose media prefix alone does not fit max_length (a media span is never cut)",
}


# ---------------------------------------------------------------------------------------------- config
@dataclass
class MultimodalRewardConfig(EmoRewardConfig):
    """A multimodal reward-model recipe: every `EmoRewardConfig` field, plus:"""

    # ------------------------------------------------------------------ model
    backbone: str = field(
        default="qwen2.5-vl",
        metadata={"help": f"Backbone family: one of {sorted(MULTIMODAL_BACKBONES)} (or the alias qwen2.5-omni)."},
    )
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Checkpoint path or hub id; None = the family's 7B hub id."}
    )
    train_projector: bool = field(
        default=False, metadata={"help": "Also train the encoder-to-LM projector(s); the encoders stay frozen."}
    )
    video_min_pixels: int | None = field(default=None, metadata={"help": "Min pixels per frame after resizing."})
    video_max_pixels: int | None = field(default=None, metadata={"help": "Max pixels per frame after resizing."})

    # ------------------------------------------------------------------ data
    media_root: str | None = field(
        default=None, metadata={"help": "Folder in the MER2025 layout: video/<id>.mp4, audio/<id>.wav."}
    )
    fps: float = field(default=2.0, metadata={"help": "Video frames sampled per second (loader and positions)."})
    max_frames: int = field(default=16, metadata={"help": "Cap on frames per video (evenly spread)."})
    use_audio_in_video: bool = field(
        default=False, metadata={"help": "Take the audio from the video's own track instead of audio/<id>.wav."}
    )
    media_errors: MediaErrorPolicy = field(
        default="raise",
        metadata={"help": "Missing / unreadable media: 'raise' (names sample and file) or 'skip' (counted)."},
    )
    cv_folds: int = field(
        default=0,
        metadata={"help": "Stratified k-fold cross-validation folds before the final fit (0 or 1: none; k fits)."},
    )

    def __post_init__(self):
        spec = get_multimodal_backbone(self.backbone)  # ValueError listing the available ones
        if self.media_errors not in get_args(MediaErrorPolicy):
            raise ValueError(f"media_errors={self.media_errors!r} is not one of {list(get_args(MediaErrorPolicy))}")
        if self.model_name_or_path is None:  # the family's 7B checkpoint, written into the report
            if spec.default_model is None:
                raise ValueError(f"backbone {self.backbone!r} needs model_name_or_path (a text LM path or hub id)")
            self.model_name_or_path = spec.default_model
        self.media_options()  # checks fps and max_frames
        if self.use_audio_in_video and not spec.hears_audio:
            raise ValueError(f"use_audio_in_video=True but backbone {self.backbone!r} cannot hear audio")
        super().__post_init__()

    def media_options(self) -> MediaOptions:
        return MediaOptions(self.media_root, self.fps, self.max_frames, self.use_audio_in_video)


def load_multimodal_config(path: str | Path, overrides: dict[str, Any] | None = None) -> MultimodalRewardConfig:
    """Parse a multimodal recipe YAML (flat keys) into a `MultimodalRewardConfig`.

    Raises:
        ValueError: an unknown key (named, with the file) or a value a field rejects.
        FileNotFoundError: the recipe does not exist.
    """
    return load_config(path, overrides, config_class=MultimodalRewardConfig)


def is_multimodal_recipe(path: str | Path) -> bool:
    """True when a recipe YAML names a multimodal `backbone` (the dispatch rule for `emoreward train`)."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    return isinstance(data, dict) and "backbone" in data


def build_model(config: MultimodalRewardConfig) -> MultimodalEmoRewardModel:
    """The reward model a recipe describes (LoRA when `use_peft`)."""
    lora = None
    if config.use_peft:
        from peft import LoraConfig

        lora = LoraConfig(
            r=config.lora_r,
            lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout,
            target_modules=config.lora_target_modules,
        )
    return MultimodalEmoRewardModel.from_backbone(
        config.backbone,
        config.model_name_or_path,
        lora_config=lora,
        train_projector=config.train_projector,
        media_options=config.media_options(),
        instruction=config.instruction,
        max_length=config.max_length,
        video_min_pixels=config.video_min_pixels,
        video_max_pixels=config.video_max_pixels,
        model_kwargs=config.model_init_kwargs if isinstance(config.model_init_kwargs, dict) else None,
    )


# ---------------------------------------------------------------------------------------------- data
@dataclass
class MultimodalExclusionReport(ExclusionReport):
    """`ExclusionReport` with the media reasons (`MULTIMODAL_EXCLUSION_REASONS`) and the media error messages."""

    errors: dict[str, str] = field(default_factory=dict)

    REASONS = MULTIMODAL_EXCLUSION_REASONS

    def to_dict(self) -> dict:
        return {**super().to_dict(), "media_errors": self.errors}


def build_multimodal_dataset(
    pairs: list[PreferencePair],
    model: MultimodalEmoRewardModel,
    options: MediaOptions,
    *,
    ties: str = "drop",
    truncation: str = "drop",
    media_errors: MediaErrorPolicy = "raise",
) -> tuple[Dataset, MultimodalExclusionReport]:
    """Encode labelled pairs as rows `chosen_ids`, `rejected_ids` (full sequences, media tokens included, the
    same prefix in both), `tie`, `length`, `sample_id`, `video`, `audio`, `subtitle`.

    Every sample's media is decoded once here, so bad media surfaces before training starts.

    Raises:
        MediaError: missing / unreadable media with `media_errors="raise"` (names the sample and the file).
        ValueError: an unlabelled pair, or no pair left.
    """
    builder = model.builder
    report = MultimodalExclusionReport(n_input=len(pairs))
    rows: dict[str, list] = defaultdict(list)
    for pair in pairs:
        if pair.label is None:
            raise ValueError(f"pair {pair.sample_id!r} (row {pair.row}) has no label; training needs labels")
        if pair.label == "tie" and ties == "drop":
            report.add("tie_dropped", pair.sample_id)
            continue
        media = None
        if builder.needs_video or builder.needs_audio:
            try:
                media = load_sample_media(
                    pair.sample_id, pair.media, options, need_video=builder.needs_video, need_audio=builder.needs_audio
                )
            except MediaError as err:
                if media_errors == "raise":
                    raise
                report.add("media_error", pair.sample_id)
                report.errors[pair.sample_id] = str(err)
                continue
        try:
            prefix = builder.encode_prefix(media, pair.media.subtitle)
        except ValueError as err:
            raise ValueError(f"pair {pair.sample_id!r} (row {pair.row}): {err}") from err
        n = len(prefix.input_ids)
        try:
            first, cut1 = builder.encode_suffix(pair.description_1, n, truncate=truncation == "truncate")
            second, cut2 = builder.encode_suffix(pair.description_2, n, truncate=truncation == "truncate")
        except ValueError:
            report.add("media_span_too_long", pair.sample_id)
            continue
        if truncation == "drop" and (cut1 or cut2):
            report.add("too_long", pair.sample_id)
            continue
        if first == second:
            report.add("identical_after_truncation" if (cut1 or cut2) else "identical_descriptions", pair.sample_id)
            continue
        chosen, rejected = (second, first) if pair.label == "2" else (first, second)
        rows["chosen_ids"].append(prefix.input_ids + chosen)
        rows["rejected_ids"].append(prefix.input_ids + rejected)
        rows["prefix_length"].append(n)
        rows["tie"].append(1.0 if pair.label == "tie" else 0.0)
        rows["length"].append(n + max(len(chosen), len(rejected)))
        rows["sample_id"].append(pair.sample_id)
        rows["video"].append(pair.media.video or "")
        rows["audio"].append(pair.media.audio or "")
        rows["subtitle"].append(pair.media.subtitle or "")
    report.n_kept = len(rows["tie"])
    if report.n_kept == 0:
        raise ValueError(f"no pair is left for training: {report.summary()}")
    return Dataset.from_dict(dict(rows)), report


@dataclass
class MultimodalPreferenceCollator:
    """Batch of pairs -> `input_ids`, `attention_mask` of shape `(2 * batch, longest)` (chosen rows first, then
    rejected), the media tensors of the `2 * batch` sequences in that order, and `tie` of shape `(batch,)`.

    Raises:
        MediaError: a file became unreadable since the dataset was built.
        ValueError: the re-encoded media prefix differs from the one in the dataset.
    """

    model: MultimodalEmoRewardModel
    options: MediaOptions
    pad_token_id: int
    cache_size: int = 64  # decoded media prefixes kept (LRU): a sample seen again skips decoding and features
    _cache: OrderedDict = field(default_factory=OrderedDict, repr=False)

    def _prefix(self, ex: dict[str, Any]):
        key = (ex["sample_id"], ex["video"], ex["audio"], ex["subtitle"])
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        builder = self.model.builder
        media = None
        if builder.needs_video or builder.needs_audio:
            ref = MediaRef(ex["video"] or None, ex["audio"] or None, ex["subtitle"] or None)
            media = load_sample_media(
                ex["sample_id"], ref, self.options, need_video=builder.needs_video, need_audio=builder.needs_audio
            )
        prefix = builder.encode_prefix(media, ex["subtitle"] or None)
        if self.cache_size > 0:
            self._cache[key] = prefix
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return prefix

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        media_items = []
        for ex in examples:
            prefix = self._prefix(ex)
            if prefix.input_ids != list(ex["chosen_ids"][: ex["prefix_length"]]):
                raise ValueError(f"sample {ex['sample_id']!r}: the media prefix changed since the dataset was built")
            media_items.append(prefix.media)
        sequences = [list(e["chosen_ids"]) for e in examples] + [list(e["rejected_ids"]) for e in examples]
        input_ids, attention_mask = pad_sequences(sequences, self.pad_token_id)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "tie": torch.tensor([float(e.get("tie", 0.0)) for e in examples]),
            **collate_media(media_items + media_items),
        }


# ---------------------------------------------------------------------------------------------- trainer
class MultimodalRewardTrainer(EmoRewardTrainer):
    """`EmoRewardTrainer` (TRL `RewardTrainer`) for media inputs.

    Args:
        model: the `MultimodalEmoRewardModel` (its `.model` is trained; LoRA already applied).
        args: a `MultimodalRewardConfig`.
        train_dataset: rows from `build_multimodal_dataset`.
    """

    def __init__(self, model: MultimodalEmoRewardModel, args: MultimodalRewardConfig, train_dataset, **kwargs):
        self.reward_model = model
        collator = MultimodalPreferenceCollator(model, args.media_options(), model.tokenizer.pad_token_id)
        super().__init__(
            model=model.model,
            args=args,
            train_dataset=train_dataset,
            processing_class=model.tokenizer,
            data_collator=collator,
            **kwargs,
        )

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = [
                "chosen_ids", "rejected_ids", "prefix_length", "tie", "sample_id", "video", "audio", "subtitle",
                self.args.length_column_name,
            ]  # fmt: skip

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        mode = "train" if self.model.training else "eval"
        tie = inputs.pop("tie")
        rewards = model(**inputs)
        chosen, rejected = torch.chunk(rewards, chunks=2)
        if self.args.ties == "drop":
            loss = -F.logsigmoid(chosen - rejected).mean()
        else:
            loss = pairwise_nll(chosen - rejected, tie, self.args.ties, self.args.tie_parameter).mean()
        if self.args.center_rewards_coefficient is not None:
            loss = loss + self.args.center_rewards_coefficient * torch.mean((chosen + rejected) ** 2)
        with torch.no_grad():
            decided = tie < 0.5
            all_rewards = self.accelerator.gather_for_metrics(rewards.detach())
            self._metrics[mode]["mean_reward"].append(all_rewards.mean().item())
            self._metrics[mode]["min_reward"].append(all_rewards.min().item())
            self._metrics[mode]["max_reward"].append(all_rewards.max().item())
            if decided.any():
                correct = (chosen > rejected)[decided].float().mean()
                margin = (chosen - rejected)[decided].mean()
                self._metrics[mode]["accuracy"].append(self.accelerator.gather_for_metrics(correct).mean().item())
                self._metrics[mode]["margin"].append(self.accelerator.gather_for_metrics(margin).mean().item())
        if return_outputs:
            return loss, {"rewards_chosen": chosen, "rewards_rejected": rejected}
        return loss


# ---------------------------------------------------------------------------------------------- judge
class MultimodalRewardJudge:
    """A multimodal reward model as a `Judge`: verdict from r(media, d1) - r(media, d2) and the tie threshold.

    Both descriptions of a sample are scored against one media prefix (`score_descriptions`), and rewards are
    cached by (sample, description), so the swapped run costs nothing.

    Args:
        model: the reward model.
        options: media options (media root, fps, frames, audio flag).
        tie_threshold: |r1 - r2| below it is a TIE (default: the model's calibrated one).
        media_errors: `"raise"`, or `"skip"`: a pair with bad media gets an INVALID verdict carrying the error.
    """

    def __init__(
        self,
        model: MultimodalEmoRewardModel,
        options: MediaOptions,
        *,
        tie_threshold: float | None = None,
        media_errors: MediaErrorPolicy = "raise",
        shared_prefix: bool = True,
    ):
        self.model, self.options, self.media_errors, self.shared_prefix = model, options, media_errors, shared_prefix
        self.name = f"reward-model:{model.settings.backbone}"
        self.config = {"backbone": model.settings.backbone, "shared_prefix": shared_prefix}
        self.tie_threshold = model.settings.tie_threshold if tie_threshold is None else tie_threshold
        self._cache: dict[tuple[str, str], float] = {}
        self.errors: dict[str, str] = {}
        self.n_scored = 0

    def _score_sample(self, pair: PreferencePair) -> tuple[float, float] | None:
        keys = [(pair.sample_id, pair.description_1), (pair.sample_id, pair.description_2)]
        todo = [d for (_, d) in keys if (pair.sample_id, d) not in self._cache]
        if todo:
            builder = self.model.builder
            media = None
            if builder.needs_video or builder.needs_audio:
                try:
                    media = load_sample_media(
                        pair.sample_id, pair.media, self.options,
                        need_video=builder.needs_video, need_audio=builder.needs_audio,
                    )  # fmt: skip
                except MediaError as err:
                    if self.media_errors == "raise":
                        raise
                    self.errors[pair.sample_id] = str(err)
                    return None
            scores = self.model.score_descriptions(media, pair.media.subtitle, todo, shared_prefix=self.shared_prefix)
            self.n_scored += len(todo)
            self._cache.update({(pair.sample_id, d): float(s) for d, s in zip(todo, scores)})
        return self._cache[keys[0]], self._cache[keys[1]]

    def pair_rewards(self, pairs: list[PreferencePair]) -> tuple[np.ndarray, np.ndarray]:
        """(r1, r2), each of shape `(len(pairs),)`; NaN where the media could not be read (skip policy)."""
        out = [self._score_sample(p) or (float("nan"), float("nan")) for p in pairs]
        return np.array([a for a, _ in out]), np.array([b for _, b in out])

    def judge(self, pairs, *, run: int = 0) -> list[Judgement]:
        r1, r2 = self.pair_rewards(list(pairs))
        out = []
        for pair, a, b in zip(pairs, r1, r2):
            if np.isnan(a):
                out.append(Judgement(pair.sample_id, Verdict.INVALID, run=run, raw=self.errors.get(pair.sample_id)))
            else:
                verdict = verdict_from_difference(a - b, self.tie_threshold)
                out.append(Judgement(pair.sample_id, verdict, run=run, reward_1=float(a), reward_2=float(b)))
        return out


# ---------------------------------------------------------------------------------------------- run
def fit_multimodal_model(
    config: MultimodalRewardConfig,
    pairs: list[PreferencePair],
    *,
    output_dir: str | Path,
    run_name: str,
    save: bool,
) -> FitResult:
    """Train one multimodal reward model on `pairs` (`MultimodalRewardTrainer`), then calibrate its tie
    threshold on the same pairs. With `save`, the trainer's checkpoints (if `save_strategy` asks for any) go to
    `output_dir` and an interrupted run resumes from the last one; without, nothing is written (a CV fold).

    Returns:
        a `emoreward.training.run.FitResult` whose `model` is the `MultimodalEmoRewardModel`.

    Raises:
        MediaError: bad media with `media_errors: raise`.
        ValueError: no pair left after exclusions.
    """
    from emoreward.evaluation.metrics import calibrate_tie_threshold
    from emoreward.training.run import _last_checkpoint, _replace

    set_seed(config.seed)
    model = build_model(config)
    options = config.media_options()
    dataset, exclusions = build_multimodal_dataset(
        pairs, model, options, ties=config.ties, truncation=config.truncation, media_errors=config.media_errors
    )
    logger.info("%s: %s", run_name, exclusions.summary())
    changes = {"output_dir": str(output_dir), "run_name": run_name}
    if not save:
        changes.update(save_strategy="no", load_best_model_at_end=False)
    trainer = MultimodalRewardTrainer(model, _replace(config, **changes), dataset)
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=_last_checkpoint(output_dir) if save else None)
    seconds = time.perf_counter() - start
    model.model = trainer.model
    model.model.eval()
    threshold = 0.0
    if config.calibrate_tie_threshold:
        kept = {*dataset["sample_id"]}
        train_pairs = [p for p in pairs if p.sample_id in kept or p.label == "tie"]
        r1, r2 = MultimodalRewardJudge(model, options, tie_threshold=0.0, media_errors="skip").pair_rewards(
            train_pairs
        )
        ok = ~np.isnan(r1)
        threshold = calibrate_tie_threshold((r1 - r2)[ok], [p.label for p, k in zip(train_pairs, ok) if k])
    model.settings.tie_threshold = threshold
    return FitResult(model, exclusions, seconds, list(trainer.state.log_history), threshold)


def evaluate_multimodal(
    model: MultimodalEmoRewardModel,
    pairs: list[PreferencePair],
    options: MediaOptions,
    *,
    tie_policy: str = "wrong",
    media_errors: MediaErrorPolicy = "raise",
) -> dict:
    """Judge labelled pairs with a multimodal reward model in normal and swapped order (the shared harness) and
    compute every metric; the dict also holds the per-pair rewards in the normal order (`pair_rewards`) and the
    media errors of skipped samples (`media_errors`).

    Raises:
        MediaError: bad media with `media_errors="raise"`.
    """
    from emoreward.evaluation.harness import evaluate_judgements, run_judge

    judge = MultimodalRewardJudge(model, options, media_errors=media_errors)
    start = time.perf_counter()
    result = run_judge(judge, pairs, swap=True)
    seconds = time.perf_counter() - start
    evaluation = evaluate_judgements(result, tie_policy=tie_policy)
    first = result.normal[0]
    evaluation.update(
        tie_threshold=judge.tie_threshold,
        n_descriptions_scored=judge.n_scored,
        scoring_seconds=seconds,
        media_errors=dict(judge.errors),
        pair_rewards={
            "sample_id": [p.sample_id for p in pairs],
            "reward_1": [j.reward_1 for j in first],
            "reward_2": [j.reward_2 for j in first],
        },
    )
    return evaluation


def run_multimodal_training(config: MultimodalRewardConfig, *, log=print) -> dict:
    """The main job for a multimodal recipe, laid out as the text path's (`emoreward.training.run.run_training`)
    and sharing its fold machinery (stratified folds, `finished.json` resume, mean ± std over folds):

    1. with `cv_folds > 1`, stratified k-fold cross-validation: per fold, fit on k-1 folds (nothing saved),
       calibrate the tie threshold on them, judge the held-out fold with the shared harness, write
       `cv/fold<k>/finished.json` (a rerun of the same recipe and data reuses it);
    2. with `final_fit`, fit on all pairs and save adapter + head + processor config + model card to
       `<output_dir>/model` (main process only; whole tensors under ZeRO-3);
    3. evaluate on `config.eval_file`;
    4. write `report.json` / `report.md` (and `confusion.png` after CV).

    Under `accelerate launch` every process runs this; only the main one logs and writes files.

    Returns:
        the report dict.
    """
    from emoreward.evaluation.report import headline, markdown_table, write_json
    from emoreward.training.run import (
        FINISHED_FILE,
        _finish_wandb,
        _fold_fingerprint,
        _load_finished,
        _log_to_wandb,
        _save_final_model,
        _wait_for_everyone,
        run_cross_validation,
        start_job,
        wandb_enabled,
    )

    out, is_main, log, pairs, report = start_job(config, log)
    options = config.media_options()
    if config.cv_folds > 1:
        report["cross_validation"], report["markdown"] = run_cross_validation(
            config,
            pairs,
            fit=lambda train, fold_dir, name: fit_multimodal_model(
                config, train, output_dir=fold_dir, run_name=name, save=False
            ),
            evaluate=lambda model, test: evaluate_multimodal(
                model, test, options, tie_policy=config.two_class_tie_policy, media_errors=config.media_errors
            ),
            log=log,
        )
    if config.final_fit:
        model_dir = out / "model"
        fingerprint = _fold_fingerprint(config, pairs, list(range(len(pairs))), [])
        final = _load_finished(model_dir, fingerprint)
        if final is not None:
            log(f"final model: finished earlier, reusing {model_dir}")
            model = MultimodalEmoRewardModel.from_pretrained(model_dir, media_root=config.media_root)
            report["final"] = final
        else:
            fit = fit_multimodal_model(
                config, pairs, output_dir=out / "checkpoints", run_name=config.run_name or "emoreward-final", save=True
            )
            model = fit.model
            cv = report.get("cross_validation")
            card = default_model_card(
                model.settings,
                data=f"`{config.train_file}` ({len(pairs)} pairs; {fit.exclusions.summary()}); ties: `{config.ties}`",
                metrics=cv and markdown_table(cv["summary"], f"{cv['k']}-fold cross-validation (held-out folds)"),
            )
            _save_final_model(model, model_dir, config, card)
            report["final"] = {
                "model_dir": str(model_dir),
                "train_seconds": fit.train_seconds,
                "tie_threshold": fit.tie_threshold,
                "exclusions": fit.exclusions.to_dict(),
                "train_log": fit.log_history,
            }
            if is_main:  # written last: its presence means the model directory is complete
                write_json({"fingerprint": fingerprint, "evaluation": report["final"]}, model_dir / FINISHED_FILE)
            log(f"final model (all {len(pairs)} pairs) saved to {model_dir}; {fit.exclusions.summary()}")
        if config.eval_file:
            evaluation = evaluate_multimodal(
                model, load_pairs(config.eval_file), options,
                tie_policy=config.two_class_tie_policy, media_errors=config.media_errors,
            )  # fmt: skip
            report["eval_file"] = {"path": str(config.eval_file), "evaluation": evaluation}
            table = markdown_table(headline(evaluation), f"held-out file {config.eval_file}")
            report["markdown"] = (report.get("markdown", "") + "\n" + table).lstrip("\n")
            if wandb_enabled(config):
                _log_to_wandb(evaluation, prefix="eval_file", config=config, kind="final-fit", title=config.eval_file)
        if wandb_enabled(config):
            _finish_wandb()
    if is_main:
        write_json(report, out / "report.json")
        (out / "report.md").write_text(report.get("markdown", ""))
        log(f"report {out / 'report.json'}")
    _wait_for_everyone(config)
    return report


def evaluate_multimodal_model(
    model_dir: str | Path, pairs: list[PreferencePair], *, media_root: str | None = None, tie_policy: str = "wrong"
) -> dict:
    """Load a saved multimodal reward model and evaluate it on labelled pairs with the shared harness (the
    `emoreward evaluate` path for multimodal model directories)."""
    model = MultimodalEmoRewardModel.from_pretrained(model_dir, media_root=media_root)
    return evaluate_multimodal(model, pairs, model.builder.options, tie_policy=tie_policy)

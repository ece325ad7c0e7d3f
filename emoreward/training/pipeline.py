"""The main job, one pipeline for text and multimodal reward models: cross-validate, fit, calibrate, evaluate.

`run_training(config)` is the single code path behind `emoreward train` and `scripts/train_reward.py`:

1. check that the backbone has positions for `max_length`, load and validate the pairs (`config.train_file`, and
   `config.eval_file` before any training);
2. stratified k-fold cross-validation: per fold, fit on k-1 folds, calibrate the tie threshold on them, judge
   the held-out fold in normal and swapped order, compute the metrics beside the length and random baselines;
   `cv/fold<k>/finished.json` is written last, so a rerun reuses finished folds;
3. fit on all pairs, calibrate, save the adapter + value head (and a model card);
4. optionally evaluate on `config.eval_file`;
5. write `report.json`, `report.md` and `confusion.png` to the output directory and return the report.

What differs between backbone kinds (model, dataset, collator, forward) is the adapter's
(`emoreward.training.adapters`); the objective (`length_debias`) is the registry's
(`emoreward.training.objectives`). Under `accelerate launch` every process runs the job; only the main one logs
and writes files.
"""

from __future__ import annotations

import copy
import gc
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.model_selection import StratifiedKFold
from transformers import set_seed

from emoreward.data import PreferencePair, load_pairs
from emoreward.evaluation.harness import evaluate_model
from emoreward.evaluation.judge import RewardModelJudge
from emoreward.evaluation.metrics import calibrate_tie_threshold
from emoreward.evaluation.report import aggregate, headline, markdown_table, plot_confusion
from emoreward.models.base import RewardModel, load_reward_model
from emoreward.training.adapters import adapter_for
from emoreward.training.config import EmoRewardConfig, public_config
from emoreward.training.distributed import distributed_setup, save_final_model, wait_for_everyone
from emoreward.training.objectives import get_objective
from emoreward.training.preprocess import ExclusionReport
from emoreward.training.provenance import write_training_data
from emoreward.training.run_identity import check_checkpoint, check_resumable, run_identity, work_fingerprint
from emoreward.training.tracking import (
    configure_wandb,
    finish_wandb,
    log_evaluation,
    log_model_artifact,
    start_wandb_run,
    wandb_enabled,
)
from emoreward.training.trainer import EmoRewardTrainer
from emoreward.utils.io import atomic_write_json, atomic_write_text, read_json_or_none


logger = logging.getLogger(__name__)

# written last into a fold or model directory: the work there is complete (an interrupted run skips it)
FINISHED_FILE = "finished.json"


@dataclass
class FitResult:
    """One fitted reward model and what happened while fitting it."""

    model: RewardModel
    exclusions: ExclusionReport | None
    train_seconds: float
    log_history: list[dict]
    tie_threshold: float


def fit_reward_model(
    config: EmoRewardConfig,
    pairs: list[PreferencePair],
    *,
    output_dir: str | Path,
    run_name: str,
    save: bool,
    eval_pairs: list[PreferencePair] | None = None,
    log=None,
) -> FitResult:
    """Train one reward model (any backbone kind) on `pairs` with `EmoRewardTrainer`, run the objective's
    after-fit step (the `penalty` transform), then calibrate the tie threshold on the same pairs.

    Pairs are encoded once per run (`emoreward.training.dataset_cache`): cross-validation folds and the final fit
    select rows. Text batches run in length groups (`LengthSplitAdapter`: about 10% padding instead of 30%). A text
    model then scores (after-fit step, calibration, the caller's evaluation) on an inference
    copy in the precision `"auto"` picks (`emoreward.models.precision`: bfloat16 on bf16 matrix units, float32
    elsewhere; the master weights stay float32); a saved model (`save`) scored in bfloat16 records its bf16
    verdict agreement with float32 on the training pairs (`settings.extra["bf16_agreement"]`), and keeps float32
    below 99.5%, before the tie threshold is calibrated.

    With `save`, the trainer's checkpoints go to `output_dir`, each with the run's identity
    (`emoreward.training.run_identity`), and an interrupted run resumes from the last one when it is the same run
    (else `RunIdentityError`). With
    `eval_pairs` and `eval_strategy` set, the trainer evaluates on them (eval reward accuracy) and
    `load_best_model_at_end` keeps the best checkpoint; without `eval_pairs` evaluation during training is off.

    Raises:
        MediaError: unreadable media with `media_errors: raise`; ValueError: no pair left after exclusions.
    """
    import torch

    from emoreward.models.precision import record_bf16_agreement
    from emoreward.training.dataset_cache import encoded_dataset
    from emoreward.training.preprocess import LengthSplitAdapter

    set_seed(config.seed)
    adapter = adapter_for(config)
    if adapter.kind == "text":  # forward passes in length groups: little padding (see LengthSplitAdapter)
        adapter = LengthSplitAdapter(adapter, multiple=config.pad_to_multiple_of)
    model = adapter.build_model(config)
    dataset, exclusions = encoded_dataset(pairs, model, config)
    logger.info("%s: %s", run_name, exclusions.summary())
    changes = {"output_dir": str(output_dir), "run_name": run_name, "save_strategy": config.save_strategy}
    if not save:
        changes.update(save_strategy="no", load_best_model_at_end=False)
    eval_dataset = None
    if eval_pairs and config.eval_strategy != "no":
        eval_dataset, _ = encoded_dataset(eval_pairs, model, config)
    else:  # no held-out pairs (e.g. a cross-validation fold: its test fold must not pick the checkpoint)
        changes.update(eval_strategy="no", load_best_model_at_end=False)
    args = _replace(config, **changes)
    trainer = EmoRewardTrainer(
        adapter=adapter,
        model=model.model,
        args=args,
        train_dataset=dataset,
        eval_dataset=eval_dataset,
        processing_class=model.tokenizer,
        data_collator=adapter.collator(model, args),
    )
    checkpoint = None
    if save:
        identity = run_identity(config, pairs)
        trainer.run_identity = identity
        checkpoint = _last_checkpoint(output_dir)
        if checkpoint is not None:
            check_checkpoint(checkpoint, identity)
            (log or logger.info)(f"{run_name}: resuming the same run from {checkpoint}")
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=checkpoint)
    seconds = time.perf_counter() - start
    model.model = trainer.model
    model.model.eval()
    trainer_log = list(trainer.state.log_history)
    del trainer  # free the optimizer state before scoring
    model.settings.objective = config.length_debias
    if model.kind == "text":
        model.scoring_dtype = "auto"
        if save and model.scoring_precision != torch.float32:
            record_bf16_agreement(model, pairs, batch_size=config.score_batch_size)
    objective = get_objective(config.length_debias)
    if objective.after_fit is not None:
        model.settings.score_transform = objective.after_fit(model, pairs, config.score_batch_size)
    threshold = 0.0
    if config.calibrate_tie_threshold:
        judge = RewardModelJudge(model, tie_threshold=0.0, batch_size=config.score_batch_size, media_errors="skip")
        r1, r2 = judge.pair_rewards(pairs)
        ok = ~np.isnan(r1 - r2)
        threshold = calibrate_tie_threshold((r1 - r2)[ok], [p.label for p, k in zip(pairs, ok) if k])
    model.settings.tie_threshold = threshold
    return FitResult(model, exclusions, seconds, trainer_log, threshold)


def _replace(config: EmoRewardConfig, **changes) -> EmoRewardConfig:
    new = copy.deepcopy(config)
    for key, value in changes.items():
        setattr(new, key, value)
    return new


def _last_checkpoint(output_dir: str | Path) -> str | None:
    """The newest complete `checkpoint-<step>` in `output_dir`: one whose `trainer_state.json` (the Trainer writes
    it after the weights, optimizer and RNG states) reads back and names that step. A checkpoint that a kill cut
    short is skipped with a warning, and the run resumes from the one before it."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    if not Path(output_dir).is_dir():
        return None
    steps = {}
    for path in Path(output_dir).glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
        suffix = path.name.rsplit("-", 1)[1]
        if path.is_dir() and suffix.isdigit():
            steps[int(suffix)] = path
    for step in sorted(steps, reverse=True):
        state = read_json_or_none(steps[step] / "trainer_state.json", what="trainer state")
        if isinstance(state, dict) and state.get("global_step") == step:
            return str(steps[step])
        logger.warning(
            "checkpoint %s is incomplete (interrupted while saving): resuming from an earlier one", steps[step]
        )
    return None


def stratified_folds(pairs: list[PreferencePair], k: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """Stratified k-fold split of pair indices by label (scikit-learn `StratifiedKFold`, shuffled, seeded)."""
    labels = [p.label for p in pairs]
    if k > len(labels):
        raise ValueError(f"cv_folds={k} is more folds than the {len(labels)} pairs to split")
    splitter = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)
    return [(list(tr), list(te)) for tr, te in splitter.split(np.zeros(len(labels)), labels)]


def _num(value: float | None) -> str:
    """A metric for a log line: two decimals, or "n/a" when undefined (e.g. no length-counter pair)."""
    return "n/a" if value is None else f"{value:.2f}"


def run_cross_validation(
    config: EmoRewardConfig,
    pairs: list[PreferencePair],
    *,
    fit: Callable[[list[PreferencePair], Path, str], FitResult] | None = None,
    evaluate: Callable[[RewardModel, list[PreferencePair]], dict] | None = None,
    log=print,
) -> tuple[dict, str]:
    """Stratified k-fold cross-validation (`config.cv_folds` folds, `config.seed`) of a reward model.

    Per fold: `fit(train_pairs, fold_dir, run_name)` trains on k-1 folds (nothing saved) and calibrates the tie
    threshold on them (default: `fit_reward_model`); `evaluate(model, test_pairs)` judges the held-out fold with the
    shared harness (default: `evaluate_model`); `<output_dir>/cv/fold<k>/finished.json` is written last, so a rerun
    of the same recipe and data reuses a finished fold and redoes an interrupted one. Only the main process writes
    files; every process trains.

    Returns:
        (`{"k", "seed", "summary": mean ± std over folds, "folds": [evaluation, ...]}`, Markdown table). Also
        writes `<output_dir>/confusion.png` (three-class confusion summed over the held-out folds).
    """
    fit = fit or (
        lambda train, fold_dir, name: fit_reward_model(config, train, output_dir=fold_dir, run_name=name, save=False)
    )
    evaluate = evaluate or (
        lambda model, test: evaluate_model(
            model,
            test,
            tie_policy=config.two_class_tie_policy,
            batch_size=config.score_batch_size,
            media_errors=config.media_errors,
        )
    )
    out = Path(config.output_dir)
    is_main = config.process_index == 0
    identity = run_identity(config, pairs)
    group = wandb_group(config, pairs)
    fold_reports = []
    for k, (train_idx, test_idx) in enumerate(stratified_folds(pairs, config.cv_folds, config.seed)):
        fold_dir = out / "cv" / f"fold{k}"
        fingerprint = work_fingerprint(identity, list(map(int, train_idx)), list(map(int, test_idx)))
        evaluation = _load_finished(fold_dir, fingerprint)
        if evaluation is not None:
            log(f"fold {k + 1}/{config.cv_folds}: finished earlier, reusing {fold_dir / FINISHED_FILE}")
            fold_reports.append(evaluation)
            continue
        train = [pairs[i] for i in train_idx]
        test = [pairs[i] for i in test_idx]
        run_name = f"{config.run_name or 'emoreward'}-fold{k}"
        if wandb_enabled(config):
            start_wandb_run(config, name=run_name, job_type="fold", group=group, kind="cv-fold")
        result = fit(train, fold_dir, run_name)
        evaluation = evaluate(result.model, test)
        evaluation.update(
            fold=k, train_seconds=result.train_seconds, exclusions=result.exclusions.to_dict(), n_train=len(train)
        )
        if wandb_enabled(config):
            log_evaluation(evaluation, config=config, kind="cv-fold", title=f"fold {k}, held-out pairs")
            finish_wandb()
        if is_main:  # written last and atomically: a rerun reuses the fold only when this file is whole
            atomic_write_json(fold_dir / FINISHED_FILE, {"fingerprint": fingerprint, "evaluation": evaluation})
        fold_reports.append(evaluation)
        train_seconds, summary = result.train_seconds, result.exclusions.summary()
        del result  # free this fold's model and optimizer before the next fold builds its own
        gc.collect()
        h = headline(evaluation)
        log(
            f"fold {k + 1}/{config.cv_folds}: 2-class WAF {_num(h['judge'].get('two_class_waf'))} "
            f"(length baseline {_num(h['length_baseline'].get('two_class_waf'))}), "
            f"length-debiased ACC {_num(h['judge'].get('length_debiased_acc'))}, trained {train_seconds:.0f}s; "
            f"{summary}"
        )
    summary = aggregate(fold_reports)
    cross_validation = {"k": config.cv_folds, "seed": config.seed, "summary": summary, "folds": fold_reports}
    if is_main:
        cm = np.sum([f["judge"]["three_class"]["confusion"] for f in fold_reports], axis=0)
        plot_confusion(
            cm,
            ["1", "2", "tie"],
            fold_reports[0]["judge"]["three_class"]["pred_labels"],
            out / "confusion.png",
            title=f"{config.cv_folds}-fold CV, held-out pairs",
        )
    markdown = markdown_table(
        summary,
        f"{config.cv_folds}-fold cross-validation on {len(pairs)} pairs (mean ± std over folds, held-out folds)",
    )
    return cross_validation, markdown


def run_training(config: EmoRewardConfig, *, log=print) -> dict:
    """Run the main job (cross-validation, final fit, evaluation, reports) for any backbone kind; see the module
    docstring.

    Returns:
        the report dict also written to `<output_dir>/report.json`.

    Raises:
        DataError / ValueError: bad training or evaluation data (both are read before any training starts).
    """
    config.check_max_length()  # a recipe the backbone cannot run fails here, not on the first long pair
    pairs = load_pairs(config.train_file)
    eval_pairs = load_pairs(config.eval_file) if config.eval_file else None  # fail before any fold trains
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    is_main = config.process_index == 0
    if not is_main:
        log = _silent
    # resume only the same run: another run's checkpoints or finished work here are refused (or, with
    # overwrite_output_dir, removed)
    check_resumable(config, run_identity(config, pairs), is_main=is_main)
    wait_for_everyone(config)
    wandb_mode = configure_wandb(config)
    # the first line of output: everything that can refuse the job without training has run (nothing on stdout
    # before an error)
    log(
        f"emoreward train: {config.kind} backbone {config.backbone or config.model_name_or_path}, "
        f"data {config.train_file}, output {config.output_dir}"
    )
    log(f"loaded {len(pairs)} pairs from {config.train_file}")
    if wandb_mode is not None:
        log(
            f"W&B ({wandb_mode}): project {os.environ.get('WANDB_PROJECT')}, group {wandb_group(config, pairs)}, "
            f"files under {os.environ.get('WANDB_DIR')}"
            + (" (upload later with `wandb sync`)" if wandb_mode == "offline" else "")
        )
    report: dict = {
        "recipe": public_config(config),
        "kind": config.kind,
        "train_file": str(config.train_file),
        "n_pairs": len(pairs),
        "wandb_mode": wandb_mode,
        "distributed": distributed_setup(config),
    }
    if config.cv_folds > 1:
        report["cross_validation"], report["markdown"] = run_cross_validation(config, pairs, log=log)
    if config.final_fit:
        model = _final_fit(config, pairs, eval_pairs, report, out, log)
        if eval_pairs is not None:
            evaluation = evaluate_model(
                model,
                eval_pairs,
                tie_policy=config.two_class_tie_policy,
                batch_size=config.score_batch_size,
                media_errors=config.media_errors,
            )
            report["eval_file"] = {"path": str(config.eval_file), "evaluation": evaluation}
            table = markdown_table(headline(evaluation), f"held-out file {config.eval_file}")
            report["markdown"] = (report.get("markdown", "") + "\n" + table).lstrip("\n")
            if wandb_enabled(config):
                log_evaluation(evaluation, prefix="eval_file", config=config, kind="final-fit", title=config.eval_file)
    if is_main:  # the outputs first: an upload that fails below loses nothing
        atomic_write_json(out / "report.json", report)
        if report.get("markdown"):  # no evaluation (cv_folds <= 1, no eval_file): no report.md, not an empty one
            atomic_write_text(out / "report.md", report["markdown"])
    if config.final_fit and wandb_enabled(config):
        if config.wandb_log_model and config.process_index == 0 and "model_dir" in report.get("final", {}):
            name = f"{config.run_name or 'emoreward-final'}-model"
            name = log_model_artifact(report["final"]["model_dir"], name, {"train_file": str(config.train_file)})
            if name is not None:  # None: no active run (a final fit reused from an earlier, finished run)
                log(f"W&B: model directory logged as artifact {name}:final")
        finish_wandb()  # the upload (online mode) happens here, after every local output is written
    wait_for_everyone(config)
    return report


def _final_fit(config, pairs, eval_pairs, report: dict, out: Path, log) -> RewardModel:
    """Fit on all pairs and save to `<output_dir>/model` (or reuse a finished earlier fit of the same recipe)."""
    model_dir = out / "model"
    fingerprint = work_fingerprint(run_identity(config, pairs), list(range(len(pairs))), [])
    final = _load_finished(model_dir, fingerprint)
    if final is not None:
        log(f"final model: finished earlier, reusing {model_dir}")
        report["final"] = final
        return load_reward_model(model_dir, media_root=config.media_root)
    run_name = config.run_name or "emoreward-final"
    if wandb_enabled(config):
        start_wandb_run(config, name=run_name, job_type="final", group=wandb_group(config, pairs), kind="final-fit")
    fit = fit_reward_model(
        config,
        pairs,
        output_dir=out / "checkpoints",
        run_name=run_name,
        save=True,
        eval_pairs=eval_pairs,
        log=log,
    )
    from emoreward.models.cards import data_metadata

    # the card's (and the export's) licence and datasets: the training data's own
    fit.model.settings.extra["data"] = data_metadata(config.train_file).to_dict()
    save_final_model(fit.model, model_dir, config, model_card(config, report, fit))
    if config.process_index == 0:
        write_training_data(model_dir, config.train_file, pairs)  # `emoreward evaluate` flags in-sample pairs
    report["final"] = {
        "model_dir": str(model_dir),
        "train_seconds": fit.train_seconds,
        "tie_threshold": fit.tie_threshold,
        "exclusions": fit.exclusions.to_dict(),
        "train_log": fit.log_history,
    }
    if config.process_index == 0:  # written last, atomically: its presence means the model directory is complete
        atomic_write_json(model_dir / FINISHED_FILE, {"fingerprint": fingerprint, "evaluation": report["final"]})
    log(f"final model (all {len(pairs)} pairs) saved to {model_dir}; {fit.exclusions.summary()}")
    return fit.model


def _silent(*_args, **_kwargs) -> None:
    return None


def wandb_group(config: EmoRewardConfig, pairs: list[PreferencePair]) -> str:
    """The W&B group of one job's runs (folds and final fit): the run name and 8 hex digits of the run identity
    (`emoreward.training.run_identity`), so a resumed job logs into the same group and another recipe into another."""
    return f"{config.run_name or 'emoreward'}-{run_identity(config, pairs)['fingerprint'][:8]}"


def _load_finished(directory: Path, fingerprint: str) -> dict | None:
    """The saved evaluation of work finished by an earlier, interrupted run of the same recipe and data; None when
    there is none, it belongs to other work, or the marker is empty or torn (warned, naming the file)."""
    saved = read_json_or_none(directory / FINISHED_FILE, what="finished-work marker")
    if not isinstance(saved, dict) or saved.get("fingerprint") != fingerprint:
        return None
    return saved.get("evaluation")


def model_card(config: EmoRewardConfig, report: dict, fit: FitResult) -> str:
    """README.md for a saved model directory: backbone, inputs, data, metrics with baselines, intended use."""
    from emoreward.models.cards import reward_model_card

    cv = report.get("cross_validation")
    metrics = cv and markdown_table(cv["summary"], f"{cv['k']}-fold cross-validation (held-out folds)")
    data = f"`{config.train_file}` ({report['n_pairs']} pairs; {fit.exclusions.summary()}); ties: `{config.ties}`"
    return reward_model_card(fit.model.settings, data=data, metrics=metrics or "", lora=config.use_peft)


__all__ = [
    "FINISHED_FILE",
    "FitResult",
    "fit_reward_model",
    "model_card",
    "run_cross_validation",
    "run_training",
    "stratified_folds",
    "wandb_group",
]

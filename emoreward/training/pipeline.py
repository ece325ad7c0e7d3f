"""The main job, one pipeline for text and multimodal reward models: cross-validate, fit, calibrate, evaluate.
`run_training(config)` is the single code path behind `emoreward train` and `scripts/train_reward.py`.
See docs/training.md.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold
from transformers import set_seed

from emoreward.data import PreferencePair, load_pairs, read_pairs
from emoreward.data.negatives import generate_negatives, rules_source
from emoreward.data.pairs import canonical_pairs, sample_groups
from emoreward.evaluation.controlled import ControlledSet, controlled_markdown, new_edit_flags, pool_sections
from emoreward.evaluation.harness import evaluate_model
from emoreward.evaluation.judge import RewardModelJudge
from emoreward.evaluation.metrics import calibrate_tie_threshold
from emoreward.evaluation.report import aggregate, headline, markdown_table, plot_confusion, weighting_note
from emoreward.models.base import RewardModel, check_finite_weights
from emoreward.models.loading import open_reward_model
from emoreward.training.adapters import adapter_for
from emoreward.training.config import EmoRewardConfig, public_config, with_fields
from emoreward.training.distributed import distributed_setup, save_final_model, wait_for_everyone
from emoreward.training.fit_workers import (
    FitPool,
    FitWorkers,
    fit_result,
    resolve_fit_workers,
    thread_budget,
    torch_threads,
)
from emoreward.training.negatives import training_pairs
from emoreward.training.objectives import get_objective
from emoreward.training.preprocess import ExclusionReport
from emoreward.training.provenance import (
    TRAINING_DATA_FILE,
    InSampleCheck,
    check_in_sample,
    training_record,
    write_training_data,
)
from emoreward.training.run_identity import (
    check_checkpoint,
    check_resumable,
    recorded_fit_plan,
    run_identity,
    work_fingerprint,
)
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
CONTROLLED_SOURCE = rules_source("the evaluated pairs")


@dataclass
class FitResult:
    """One fitted reward model and what happened while fitting it."""

    model: RewardModel  # or, for a judge recipe, the trained judge's folder (`emoreward.training.judge`)
    exclusions: ExclusionReport  # a judge recipe's: `training.judge.judge_exclusions`
    train_seconds: float
    log_history: list[dict]
    tie_threshold: float
    train_threads: int = 1  # torch threads of the training loop (its rounding depends on them: a fact of the run)
    n_negatives: int = 0  # controlled negatives trained on beside the human pairs (`training.negatives`)
    trained_edits: frozenset | None = None  # their edits (`Negative.edit_key`; None: none asked): which are new


def fit_reward_model(
    config: EmoRewardConfig,
    pairs: list[PreferencePair],
    *,
    output_dir: str | Path,
    run_name: str,
    save: bool,
    eval_pairs: list[PreferencePair] | None = None,
    log=None,
    train_threads: int | None = None,
) -> FitResult:
    """Train one reward model (any backbone kind) on `pairs` with `EmoRewardTrainer`, run the objective's
    after-fit step (the `penalty` transform), then calibrate the tie threshold on the same pairs.

    Pairs are encoded once per run (`emoreward.training.dataset_cache`); text batches run in length groups
    (`LengthSplitAdapter`). A text model then scores in the precision `"auto"` picks (`emoreward.models.precision`); a
    saved model scored in bfloat16 records its bf16 verdict agreement first (`settings.extra["bf16_agreement"]`).
    With `save`, checkpoints carry the run's identity and an interrupted run of the same identity resumes from the
    last one. `eval_pairs` with `eval_strategy` set are evaluated during training. `train_threads` bounds the torch
    threads of the training loop alone.

    Raises:
        MediaError: unreadable media with `media_errors: raise`; ValueError: no pair left after exclusions;
        RunIdentityError: a checkpoint of another run."""
    import torch

    from emoreward.models.precision import record_bf16_agreement
    from emoreward.training.dataset_cache import encoded_dataset
    from emoreward.training.preprocess import LengthSplitAdapter

    set_seed(config.seed)
    adapter = adapter_for(config)
    if adapter.kind == "text":  # forward passes in length groups: little padding (see LengthSplitAdapter)
        adapter = LengthSplitAdapter(adapter, multiple=config.pad_to_multiple_of)
    model = adapter.build_model(config)
    trained_on = training_pairs(config, pairs)  # the human pairs, plus controlled negatives of them if asked
    dataset, exclusions = encoded_dataset(trained_on.pairs, model, config)
    logger.info("%s: %s; %s", run_name, trained_on.summary(), exclusions.summary())
    changes = {"output_dir": str(output_dir), "run_name": run_name, "save_strategy": config.save_strategy}
    if not save:
        changes.update(save_strategy="no", load_best_model_at_end=False)
    eval_dataset = None
    if eval_pairs and config.eval_strategy != "no":
        eval_dataset, _ = encoded_dataset(eval_pairs, model, config)
    else:  # no held-out pairs (e.g. a cross-validation fold: its test fold must not pick the checkpoint)
        changes.update(eval_strategy="no", load_best_model_at_end=False)
    args = with_fields(config, **changes)
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
        identity = run_identity(config, trained_on.pairs)
        trainer.run_identity = identity
        checkpoint, skipped = _last_checkpoint(output_dir)
        if checkpoint is not None:
            check_checkpoint(checkpoint, identity)
        if skipped:  # counted and printed: the work of the skipped steps is done again
            (log or logger.info)(
                f"{run_name}: {len(skipped)} newer checkpoint(s) skipped, unusable: {'; '.join(skipped)}"
            )
        if checkpoint is not None:
            (log or logger.info)(f"{run_name}: resuming the same run from {checkpoint}")
    start = time.perf_counter()
    with torch_threads(train_threads) if train_threads else contextlib.nullcontext():
        threads = torch.get_num_threads()
        trainer.train(resume_from_checkpoint=checkpoint)
    seconds = time.perf_counter() - start
    model.model = trainer.model
    model.model.eval()
    check_finite_weights(model.model, f"{run_name} (after training)")  # the last step may have diverged
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
    n_negatives = len(trained_on.pairs) - trained_on.n_human
    return FitResult(model, exclusions, seconds, trainer_log, threshold, threads, n_negatives, trained_on.edits)


def _last_checkpoint(output_dir: str | Path) -> tuple[str | None, list[str]]:
    """The newest usable `checkpoint-<step>` in `output_dir` (`checkpoint_problem`: complete, every file whole and
    readable), or None; and the newer ones skipped, each as ``"<folder>: <why>"`` (an incomplete one is also
    logged as a warning)."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    if not Path(output_dir).is_dir():
        return None, []
    steps = {}
    for path in Path(output_dir).glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
        suffix = path.name.rsplit("-", 1)[1]
        if path.is_dir() and suffix.isdigit():
            steps[int(suffix)] = path
    skipped = []
    for step in sorted(steps, reverse=True):
        problem = checkpoint_problem(steps[step], step)
        if problem is None:
            return str(steps[step]), skipped
        skipped.append(f"{steps[step]}: {problem}")
        if problem.startswith("incomplete"):
            logger.warning(
                "checkpoint %s is incomplete (interrupted while saving): resuming from an earlier one", steps[step]
            )
    return None, skipped


def checkpoint_problem(folder: Path, step: int) -> str | None:
    """Why step checkpoint `folder` cannot be resumed from, or None: its `trainer_state.json` (written last) does not
    name `step`, or a file is cut short or unreadable (a safetensors file shorter than its header says, a torch
    pickle whose zip directory is missing, a JSON file that does not parse). Reads headers only, no tensor."""
    state = read_json_or_none(folder / "trainer_state.json", what="trainer state")
    if not (isinstance(state, dict) and state.get("global_step") == step):
        return "incomplete (interrupted while saving)"
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        problem = _file_problem(path)
        if problem is not None:
            return f"{path.relative_to(folder)} {problem}"
    return None


def _file_problem(path: Path) -> str | None:
    import json
    import zipfile

    size = path.stat().st_size
    if path.suffix == ".safetensors":
        with path.open("rb") as fh:
            head = fh.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 0 or n > size - 8:
                return f"is truncated ({size} bytes, no whole header)"
            try:
                header = json.loads(fh.read(n))
                end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
            except (ValueError, TypeError, KeyError, IndexError):
                return "has an unreadable header"
        return None if size == 8 + n + end else f"is truncated ({size} of {8 + n + end} bytes)"
    if path.suffix in (".pt", ".pth", ".bin"):
        return None if zipfile.is_zipfile(path) else f"is truncated or unreadable ({size} bytes, no zip directory)"
    if path.suffix == ".json":
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, OSError):
            return f"is truncated or unreadable JSON ({size} bytes)"
    return None


def stratified_folds(
    pairs: list[PreferencePair], k: int, seed: int, *, media_by_id: bool = False
) -> list[tuple[list[int], list[int]]]:
    """Stratified k-fold split of pair indices by label that keeps each sample (`sample_groups`: its pairs, and every
    pair sharing one of its descriptions) in one fold, over the pairs in their content order (`canonical_pairs`): the
    same folds whatever the order of the rows. scikit-learn, shuffled and seeded: `StratifiedGroupKFold` when a sample
    has several pairs; `StratifiedKFold` when every sample has one (then the same split, and the folds of one-pair
    files stay those of earlier versions).

    Raises:
        ValueError: more folds than samples."""
    order = {id(p): k for k, p in enumerate(canonical_pairs(pairs))}
    ranked = sorted(range(len(pairs)), key=lambda i: order[id(pairs[i])])
    labels = [pairs[i].label for i in ranked]
    groups = sample_groups([pairs[i] for i in ranked], media_by_id=media_by_id)
    n_samples = len(set(groups))
    if k > n_samples:
        what = "pairs" if n_samples == len(labels) else f"samples ({len(labels)} pairs)"
        raise ValueError(f"cv_folds={k} is more folds than the {n_samples} {what} to split")
    if n_samples == len(labels):
        splits = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed).split(np.zeros(len(labels)), labels)
    else:
        splitter = StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed)
        splits = splitter.split(np.zeros(len(labels)), labels, groups)
    return [(sorted(ranked[i] for i in tr), sorted(ranked[i] for i in te)) for tr, te in splits]


def _num(value: float | None) -> str:
    """A metric for a log line: two decimals, or "n/a" when undefined (e.g. no length-counter pair)."""
    return "n/a" if value is None else f"{value:.2f}"


@dataclass(frozen=True)
class FoldJob:
    """One cross-validation fold to train: its number `k` (0-based), the pair indices, the work fingerprint its
    finished marker carries (`work_fingerprint`) and its folder `<output_dir>/cv/fold<k>`."""

    k: int
    train_idx: tuple[int, ...]
    test_idx: tuple[int, ...]
    fingerprint: str
    fold_dir: Path


def _default_fit(config: EmoRewardConfig) -> Callable[[list[PreferencePair], Path, str], FitResult]:
    return lambda train, fold_dir, name: fit_reward_model(
        config, train, output_dir=fold_dir, run_name=name, save=False
    )


def _default_evaluate(
    config: EmoRewardConfig, controlled: ControlledSet | None = None, trained_edits: frozenset | None = None
) -> Callable[[RewardModel, list[PreferencePair]], dict]:
    """The pipeline's evaluation of a model on `test` pairs, with the controlled-error section of `controlled` (default:
    the rules engine's negatives of `test`, with no in-sample flags: held-out pairs; flagged new where their edit is
    none of `trained_edits`, the edits of the negatives the model trained on)."""

    def held_out(test: list[PreferencePair]) -> ControlledSet:
        negatives = generate_negatives(test, media_by_id=config.media_root is not None).negatives
        return ControlledSet(negatives, CONTROLLED_SOURCE, None, new_edit_flags(negatives, trained_edits))

    return lambda model, test: evaluate_model(
        model,
        test,
        tie_policy=config.two_class_tie_policy,
        batch_size=config.score_batch_size,
        media_errors=config.media_errors,
        controlled=controlled if controlled is not None else held_out(test),
        media_by_id=config.media_root is not None,
    )


def run_fold(
    config: EmoRewardConfig,
    pairs: list[PreferencePair],
    job: FoldJob,
    group: str,
    fit: Callable[[list[PreferencePair], Path, str], FitResult] | None = None,
    evaluate: Callable[[RewardModel, list[PreferencePair]], dict] | None = None,
) -> tuple[dict, str]:
    """Train and judge one fold, in the main process or in a `FitPool` worker (the same steps either way): `fit`
    (default `fit_reward_model`) on the other folds, `evaluate` (default `evaluate_model`) on the held-out one, then
    `<fold_dir>/finished.json`, written last by the main process.

    Returns:
        (the fold's evaluation, its one-line summary for the log)."""
    train = [pairs[i] for i in job.train_idx]
    test = [pairs[i] for i in job.test_idx]
    run_name = f"{config.run_name or 'emoreward'}-fold{job.k}"
    if wandb_enabled(config):
        start_wandb_run(config, name=run_name, job_type="fold", group=group, kind="cv-fold")
    result = (fit or _default_fit(config))(train, job.fold_dir, run_name)
    evaluation = (evaluate or _default_evaluate(config, trained_edits=result.trained_edits))(result.model, test)
    evaluation.update(
        fold=job.k,
        train_seconds=result.train_seconds,
        train_threads=result.train_threads,
        exclusions=result.exclusions.to_dict(),
        n_train=len(train),
        n_train_negatives=result.n_negatives,
    )
    if wandb_enabled(config):
        log_evaluation(evaluation, config=config, kind="cv-fold", title=f"fold {job.k}, held-out pairs")
        finish_wandb()
    if config.process_index == 0:  # written last and atomically: a rerun reuses the fold only when this file is whole
        atomic_write_json(job.fold_dir / FINISHED_FILE, {"fingerprint": job.fingerprint, "evaluation": evaluation})
    h = headline(evaluation)
    line = (
        f"fold {job.k + 1}/{config.cv_folds}: 2-class WAF {_num(h['judge'].get('two_class_waf'))} "
        f"(length baseline {_num(h['length_baseline'].get('two_class_waf'))}), "
        f"length-debiased ACC {_num(h['judge'].get('length_debiased_acc'))}, trained {result.train_seconds:.0f}s; "
        + (f"{len(train)} human pairs + {result.n_negatives} controlled negatives; " if result.n_negatives else "")
        + result.exclusions.summary()
    )
    return evaluation, line


class CrossValidation:
    """The stratified k-fold cross-validation of one run, planned and started when made, read with `result()`.

    Finished folds of the same run are reused (`cv/fold<k>/finished.json`); the rest train here or, with
    `fit_workers`, in worker processes. `free_cores()` waits until the final fit can run beside the folds still
    training. As a context manager, leaving it waits for (after an error: cancels) the folds in flight."""

    def __init__(self, config, pairs, *, fit=None, evaluate=None, log=print):
        self.config, self.pairs, self.log = config, pairs, log
        self.fit, self.evaluate = fit, evaluate
        self.group = wandb_group(config, pairs)
        self.evaluations: dict[int, dict] = {}
        self.jobs: list[FoldJob] = []
        out, identity = Path(config.output_dir), run_identity(config, pairs)
        by_id = getattr(config, "media_root", None) is not None  # clips read by sample id: part of a pair's context
        for k, (train_idx, test_idx) in enumerate(
            stratified_folds(pairs, config.cv_folds, config.seed, media_by_id=by_id)
        ):
            train_idx, test_idx = tuple(map(int, train_idx)), tuple(map(int, test_idx))
            job = FoldJob(k, train_idx, test_idx, work_fingerprint(identity, list(train_idx), list(test_idx)),
                          out / "cv" / f"fold{k}")  # fmt: skip
            evaluation = load_finished(job.fold_dir, job.fingerprint)
            if evaluation is None:
                self.jobs.append(job)
            else:
                log(f"fold {k + 1}/{config.cv_folds}: finished earlier, reusing {job.fold_dir / FINISHED_FILE}")
                self.evaluations[k] = evaluation
        custom = fit is not None or evaluate is not None  # closures do not travel to a worker process
        if custom:
            self.plan = FitWorkers(1, thread_budget(), "custom fit or evaluation")
        else:  # planned for all the run's folds, once: a resumed run trains on the same thread counts
            planned = resolve_fit_workers(
                config.fit_workers,
                jobs=config.cv_folds,
                kind=config.kind,
                device=config.device.type,
                world_size=config.world_size,
            )
            recorded = recorded_fit_plan(
                out, {"workers": planned.workers, "threads": planned.threads}, is_main=config.process_index == 0
            )
            if (recorded["workers"], recorded["threads"]) != (planned.workers, planned.threads):
                planned = FitWorkers(recorded["workers"], recorded["threads"], "the plan recorded when the run began")
            self.plan = planned
        # the pool: no more workers than folds left (the threads of each stay the plan's)
        self.workers = min(self.plan.workers, len(self.jobs)) if self.plan.parallel else 1
        self.pool: FitPool | None = None
        self.futures: dict[int, Future] = {}
        self._waiting = list(self.jobs)  # folds not yet handed to a worker
        self._unprinted = [job.k for job in self.jobs]  # the log lines of folds in workers, printed in fold order
        self._lines: dict[int, str] = {}
        self._log_lock = threading.Lock()
        if self.plan.parallel and self.jobs:
            log(
                f"cross-validation: {self.workers} folds at a time in worker processes, {self.plan.threads} "
                f"torch thread(s) each ({self.plan.reason})"
            )
            self.pool = FitPool(self.workers, self.plan.threads)
            self._hand_out()

    def _report_done(self, k: int, future: Future) -> None:
        """Print the finished folds' lines in fold order (a fold that ends before the one ahead of it waits)."""
        if future.cancelled() or future.exception() is not None:
            return
        with self._log_lock:
            self._lines[k] = future.result()[1]
            while self._unprinted and self._unprinted[0] in self._lines:
                self.log(self._lines.pop(self._unprinted.pop(0)))

    def _run_here(self) -> None:
        for job in self.jobs:
            if job.k in self.evaluations:
                continue
            with torch_threads(self.plan.threads):  # the plan's threads, as in a worker
                self.evaluations[job.k], line = run_fold(
                    self.config, self.pairs, job, self.group, self.fit, self.evaluate
                )
            gc.collect()  # free this fold's model and optimizer before the next fold builds its own
            self.log(line)

    def _running(self) -> list[Future]:
        return [f for f in self.futures.values() if not f.done()]

    def _hand_out(self) -> None:
        """Give waiting folds to free workers: never more in flight than workers, so that an interrupt (which
        reaches the workers too) leaves no fold queued behind the interrupted ones."""
        while self._waiting and len(self._running()) < self.workers:
            job = self._waiting.pop(0)
            future = self.pool.submit(run_fold, self.config, self.pairs, job, self.group)
            self.futures[job.k] = future
            future.add_done_callback(functools.partial(self._report_done, job.k))

    def _wait(self, *, until_free: bool) -> None:
        while True:
            self._hand_out()
            running = self._running()
            if not running or (until_free and not self._waiting and len(running) < self.workers):
                return
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                fit_result(future)  # a failed fold stops the run now, not after the others

    def free_cores(self) -> int | None:
        """Block until every fold is handed out and a worker is free; return the torch threads of the final fit (the
        plan's threads per fit when the folds run in workers, else None: all threads).

        Raises:
            the first failed fold's exception (`RuntimeError` when its worker process died)."""
        if self.pool is None:
            self._run_here()
        else:
            self._wait(until_free=True)
        return self.plan.threads if self.plan.parallel else None

    def result(self) -> tuple[dict, str]:
        """Wait for every fold; return (`{"k", "seed", "summary", "folds"}`, Markdown table) and write
        `<output_dir>/confusion.png` (main process only).

        Raises:
            the first failed fold's exception (`RuntimeError` when its worker process died)."""
        if self.pool is None:
            self._run_here()
        else:
            self._wait(until_free=False)
        for k, future in sorted(self.futures.items()):
            self.evaluations[k] = fit_result(future)[0]
        config = self.config
        fold_reports = [self.evaluations[k] for k in sorted(self.evaluations)]
        summary = aggregate(fold_reports)
        cross_validation = {"k": config.cv_folds, "seed": config.seed, "summary": summary, "folds": fold_reports}
        cross_validation["weighting"] = {  # held-out folds: every pair and every sample in exactly one
            "unit": "pair",
            "n_pairs": sum(f["weighting"]["n_pairs"] for f in fold_reports),
            "n_samples": sum(f["weighting"]["n_samples"] for f in fold_reports),
        }
        if config.process_index == 0:
            cm = np.sum([f["judge"]["three_class"]["confusion"] for f in fold_reports], axis=0)
            plot_confusion(
                cm,
                ["1", "2", "tie"],
                fold_reports[0]["judge"]["three_class"]["pred_labels"],
                Path(config.output_dir) / "confusion.png",
                title=f"{config.cv_folds}-fold CV, held-out pairs",
            )
        markdown = markdown_table(
            summary,
            f"{config.cv_folds}-fold cross-validation on {len(self.pairs)} pairs (mean ± std over folds, held-out "
            "folds)",
            weighting_note(fold_reports),
            folds=cross_validation["k"],
        )
        sections = [f["controlled_errors"] for f in fold_reports if "controlled_errors" in f]
        if sections:  # every held-out pair in one fold: the folds' negatives are disjoint, their counts add up
            pooled = pool_sections(sections, f"{CONTROLLED_SOURCE}, pooled over {len(sections)} folds")
            cross_validation["controlled_errors"] = pooled
            markdown += "\n" + controlled_markdown(pooled, "Controlled errors (held-out folds)")
        return cross_validation, markdown

    def __enter__(self) -> CrossValidation:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.pool is not None:
            self.pool.__exit__(exc_type, exc, tb)


def run_training(config: EmoRewardConfig, *, log=print, warn: Callable[[str], None] | None = None) -> dict:
    """Run the main job for any backbone kind: load and check the pairs (`train_file`, `eval_file`) before any
    training, stratified k-fold cross-validation (`CrossValidation`), the final fit on all pairs (saved with its card),
    an optional evaluation on `eval_file`, then `report.json`, `report.md` and `confusion.png`. An `eval_file` holding
    pairs (or controlled negatives) the final model trains on is counted and marked in-sample as `evaluate` marks it
    (`eval_file_check`), and `warn`ed about (default: a line on stderr) before any fold trains.

    Returns:
        the report dict also written to `<output_dir>/report.json`.

    Raises:
        DataError / ValueError: bad training or evaluation data (both are read before any training starts)."""
    config.check_max_length()  # a recipe the backbone cannot run fails here, not on the first long pair
    by_id = config.media_root is not None  # clips read by sample id: the id is part of a pair's context
    loaded = read_pairs(config.train_file, media_by_id=by_id)
    pairs = canonical_pairs(loaded.pairs)  # the file's row order changes nothing
    eval_pairs = load_pairs(config.eval_file, media_by_id=by_id) if config.eval_file else None  # before any fold
    if config.controlled_negatives_file:  # a file written from other data is refused before any fold trains
        training_pairs(config, pairs, require_match=True)
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
    log(f"loaded {loaded.summary()}")
    eval_check = eval_file_check(config, pairs, eval_pairs) if eval_pairs is not None and config.final_fit else None
    for line in eval_check[1].warnings if eval_check is not None and is_main else ():
        (warn or _stderr)(f"emoreward train: warning: {line}")
    if wandb_mode is not None:
        log(wandb_line(config, pairs, wandb_mode))
    report: dict = {
        "recipe": public_config(config),
        "kind": config.kind,
        "train_file": str(config.train_file),
        "n_pairs": len(pairs),
        "n_samples": loaded.n_samples,
        "n_records": loaded.n_records,
        "annotators": loaded.agreement.to_dict(),
        "wandb_mode": wandb_mode,
        "distributed": distributed_setup(config),
    }
    with CrossValidation(config, pairs, log=log) if config.cv_folds > 1 else contextlib.nullcontext() as folds:
        final = None
        if config.final_fit:  # beside the last folds when they train in worker processes (`fit_workers`)
            threads = folds.free_cores() if folds is not None else None
            final = _fit_final(config, pairs, eval_pairs, out, log, train_threads=threads)
        if folds is not None:
            report["cross_validation"], report["markdown"] = folds.result()
    if config.final_fit:
        model = _save_final(config, pairs, final, report, out, log)
        if eval_check is not None:
            negatives, check = eval_check
            source = rules_source(str(config.eval_file))  # as `evaluate` names them
            controlled = ControlledSet(negatives, source, check.negative_flags, check.new_edit)
            evaluation = _default_evaluate(config, controlled)(model, eval_pairs)
            evaluation["n_in_sample_pairs"] = check.n_in_sample  # as `evaluate` counts them on the saved model
            report["eval_file"] = {"path": str(config.eval_file), "evaluation": evaluation, "in_sample": check.note}
            title = (
                f"eval_file {config.eval_file} ({len(eval_pairs)} pairs, IN-SAMPLE)"
                if check.n_in_sample
                else f"held-out file {config.eval_file}"
            )
            table = markdown_table(headline(evaluation), title, weighting_note([evaluation]))
            if check.n_in_sample:
                table += f"\n{check.note}\n"
            table += "\n" + controlled_markdown(
                evaluation["controlled_errors"], f"Controlled errors, {config.eval_file}"
            )
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


def eval_file_check(
    config: EmoRewardConfig, pairs: list[PreferencePair], eval_pairs: list[PreferencePair]
) -> tuple[list, InSampleCheck]:
    """The controlled negatives of `eval_file`'s section (the rules engine's, as every evaluation of the pipeline)
    and the in-sample check of `eval_pairs` and those negatives against what the final model trains on
    (`provenance.check_in_sample` on the record `_save_final` writes, `training_record`): the rule and the words of
    `evaluate` on the saved model, before any fold trains."""
    negatives = generate_negatives(eval_pairs, media_by_id=config.media_root is not None).negatives
    check = check_in_sample(
        training_record(**final_training_data(config, pairs)),
        str(Path(config.output_dir) / "model" / TRAINING_DATA_FILE),
        eval_pairs,
        config.eval_file,
        negatives,
        rules_source(str(config.eval_file)),
    )
    return negatives, check


def final_training_data(config: EmoRewardConfig, pairs: list[PreferencePair]) -> dict:
    """What the final model trains on, as `provenance.write_training_data` / `training_record` take it: the source,
    the human `pairs`, the controlled negatives' pairs (their controlled section is flagged in-sample too) and their
    edits (an edit no training negative made is counted apart)."""
    trained = training_pairs(config, pairs)
    return {
        "source": config.train_file,
        "pairs": pairs,
        "negatives": trained.pairs[trained.n_human :],
        "edits": trained.edits,
        "media_by_id": config.media_root is not None,
    }


def _stderr(line: str) -> None:
    sys.stderr.write(line + "\n")


def _fit_final(config, pairs, eval_pairs, out: Path, log, *, train_threads: int | None = None) -> FitResult | dict:
    """Fit on all pairs (its W&B run started first), or the record of a finished earlier fit of the same run (a
    dict: `_save_final` then reuses `<output_dir>/model`)."""
    model_dir = out / "model"
    final = load_finished(model_dir, final_fingerprint(config, pairs))
    if final is not None:
        log(f"final model: finished earlier, reusing {model_dir}")
        return final
    run_name = config.run_name or "emoreward-final"
    if wandb_enabled(config):
        start_wandb_run(config, name=run_name, job_type="final", group=wandb_group(config, pairs), kind="final-fit")
    return fit_reward_model(
        config,
        pairs,
        output_dir=out / "checkpoints",
        run_name=run_name,
        save=True,
        eval_pairs=eval_pairs,
        log=log,
        train_threads=train_threads,
    )


def final_fingerprint(config, pairs) -> str:
    """The work fingerprint of a run's final fit (every pair trained on, none held out): its `finished.json` key."""
    return work_fingerprint(run_identity(config, pairs), list(range(len(pairs))), [])


def _save_final(config, pairs, fit: FitResult | dict, report: dict, out: Path, log) -> RewardModel:
    """Save the final fit to `<output_dir>/model` with its card, the training data and, last, `finished.json`; a
    reused fit (a dict) is loaded from there instead."""
    model_dir = out / "model"
    if isinstance(fit, dict):
        report["final"] = fit
        return open_reward_model(model_dir, media_root=config.media_root)
    from emoreward.models.cards import data_metadata

    # the card's (and the export's) licence and datasets: the training data's own
    fit.model.settings.extra["data"] = data_metadata(config.train_file).to_dict()
    save_final_model(fit.model, model_dir, config, model_card(config, report, fit))
    if config.process_index == 0:
        write_training_data(model_dir, **final_training_data(config, pairs))
    report["final"] = {
        "model_dir": str(model_dir),
        "train_seconds": fit.train_seconds,
        "train_threads": fit.train_threads,
        "tie_threshold": fit.tie_threshold,
        "exclusions": fit.exclusions.to_dict(),
        "train_log": fit.log_history,
    }
    if config.process_index == 0:  # written last, atomically: its presence means the model directory is complete
        atomic_write_json(
            model_dir / FINISHED_FILE,
            {"fingerprint": final_fingerprint(config, pairs), "evaluation": report["final"]},
        )
    log(
        f"final model (all {len(pairs)} pairs) saved to {model_dir}, trained {fit.train_seconds:.0f}s; "
        f"{fit.exclusions.summary()}"
    )
    return fit.model


def _silent(*_args, **_kwargs) -> None:
    return None


def wandb_line(config: EmoRewardConfig, pairs: list[PreferencePair], mode: str) -> str:
    """The job's line saying where its W&B runs go: mode, project, group, local folder (and `wandb sync` offline)."""
    return (
        f"W&B ({mode}): project {os.environ.get('WANDB_PROJECT')}, group {wandb_group(config, pairs)}, "
        f"files under {os.environ.get('WANDB_DIR')}"
        + (" (upload later with `wandb sync`)" if mode == "offline" else "")
    )


def wandb_group(config: EmoRewardConfig, pairs: list[PreferencePair]) -> str:
    """The W&B group of one job's runs: the run name and 8 hex digits of the run identity."""
    return f"{config.run_name or 'emoreward'}-{run_identity(config, pairs)['fingerprint'][:8]}"


def load_finished(directory: Path, fingerprint: str) -> dict | None:
    """The saved evaluation of finished work of the same run; None when there is none, it belongs to other work, or
    the marker is torn."""
    saved = read_json_or_none(directory / FINISHED_FILE, what="finished-work marker")
    if not isinstance(saved, dict) or saved.get("fingerprint") != fingerprint:
        return None
    return saved.get("evaluation")


def model_card(config: EmoRewardConfig, report: dict, fit: FitResult) -> str:
    """README.md for a saved model directory: backbone, inputs, data, metrics with baselines, intended use."""
    from emoreward.models.cards import reward_model_card

    cv = report.get("cross_validation")
    metrics = cv and markdown_table(cv["summary"], f"{cv['k']}-fold cross-validation (held-out folds)", folds=cv["k"])
    data = f"`{config.train_file}` ({report['n_pairs']} pairs; {fit.exclusions.summary()}); ties: `{config.ties}`"
    return reward_model_card(fit.model.settings, data=data, metrics=metrics or "", lora=config.use_peft)


__all__ = [
    "FINISHED_FILE",
    "FitResult",
    "eval_file_check",
    "final_fingerprint",
    "fit_reward_model",
    "load_finished",
    "model_card",
    "CrossValidation",
    "FoldJob",
    "run_fold",
    "run_training",
    "stratified_folds",
    "wandb_group",
    "wandb_line",
]

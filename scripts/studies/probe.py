"""Value-head probes: reward models whose backbone is frozen and whose value head is trained on cached features.

A probe is the `use_peft: false`, frozen-backbone corner of the reward model: the same backbone, input format and
value head, trained with the same pairwise likelihoods and length-robust objectives as `EmoRewardTrainer`
(`emoreward.training.objectives`). The backbone never changes, so its features are computed once and a k-fold study
of every `length_debias` variant costs one forward pass over the distinct descriptions instead of one LoRA
fine-tuning per fold and variant. It is the linear-probe baseline of representation learning (Alain & Bengio 2016,
"Understanding intermediate layers using linear classifier probes").

The probe reward of a description is `w . h(description)` (`num_heads` rows of `w` with `length_debias:
disentangled`; head 0 is the quality reward). `value_head_inputs` checks that the value head applied to the
features it returns gives the rewards of `TextRewardModel.score_ids`. See docs/training.md (`--probe`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from emoreward.data import PreferencePair
from emoreward.evaluation.judge import RewardModelJudge
from emoreward.models.base import RewardContext, apply_score_transform
from emoreward.models.text import TextRewardModel
from emoreward.training.objectives import get_objective, length_penalty_from_rewards
from emoreward.training.preprocess import length_balance_weights


def _value_head(model: torch.nn.Module) -> torch.nn.Module:
    """The value head module (`score` for decoders, `classifier` for encoders; peft's wrapper if wrapped)."""
    for name in ("score", "classifier"):
        for module_name, module in model.named_modules():
            if module_name.split(".")[-1] == name:
                return module
    raise ValueError("no value head (`score` or `classifier`) found in the model")


@torch.inference_mode()
def value_head_inputs(
    model: TextRewardModel, descriptions: Sequence[str], subtitles: Sequence[str | None] | None = None, batch_size=16
) -> np.ndarray:
    """The hidden states the value head reads for each description, as `TextRewardModel.score` would see them.

    Args:
        model: a reward model (its LoRA, if any, is applied: the features of a fine-tuned model are allowed).
        descriptions: `N` descriptions; `subtitles`: `N` optional contexts.
        batch_size: sequences per forward pass.

    Returns:
        `np.ndarray` of shape `(N, hidden)`, float64.

    Raises:
        RuntimeError: if the value head applied to the returned features does not reproduce the model's rewards
            (within 1e-4): the pooled position was not found the way the model pools.
    """
    subtitles = list(subtitles) if subtitles is not None else [None] * len(descriptions)
    head = _value_head(model.model)
    captured: list[torch.Tensor] = []
    handle = head.register_forward_hook(lambda _m, args, _out: captured.append(args[0].detach()))
    sequences = [model.encode(d, RewardContext(subtitle=s)).input_ids for d, s in zip(descriptions, subtitles)]
    try:
        out, rewards = None, np.empty(len(sequences))
        order = np.argsort([len(s) for s in sequences], kind="stable")
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            captured.clear()
            # one forward pass per group (the scoring engine would split it by its token budget otherwise)
            tokens = len(idx) * (max(len(sequences[i]) for i in idx) + 64)
            rewards[idx] = model.score_ids([sequences[i] for i in idx], batch_size=len(idx), max_batch_tokens=tokens)
            [hidden] = captured
            if hidden.dim() == 3:  # decoder: (batch, seq, hidden), pooled at the last non-pad token
                lengths = [len(sequences[i]) for i in idx]
                width = hidden.shape[1]  # the engine pads to a multiple of its own
                left = model.tokenizer.padding_side == "left"
                pos = torch.tensor([width - 1 if left else n - 1 for n in lengths])
                hidden = hidden[torch.arange(len(idx)), pos]
            if out is None:
                out = np.empty((len(sequences), hidden.shape[-1]), dtype=np.float64)
            out[idx] = hidden.double().cpu().numpy()
    finally:
        handle.remove()
    weight = _head_weight(head)
    check = out @ weight[0] + _head_bias(head)
    if not np.allclose(check, rewards, atol=1e-4, rtol=1e-4):
        raise RuntimeError(
            f"value_head_inputs: head(features) differs from the model's rewards by up to "
            f"{np.abs(check - rewards).max():.2e}; the pooled position does not match the model's"
        )
    return out


def _head_weight(head: torch.nn.Module) -> np.ndarray:
    """Weight of the (active) value head, shape `(num_heads, hidden)`."""
    linear = getattr(head, "modules_to_save", {}).get("default", head) if hasattr(head, "modules_to_save") else head
    return linear.weight.detach().double().cpu().numpy()


def _head_bias(head: torch.nn.Module) -> float:
    linear = getattr(head, "modules_to_save", {}).get("default", head) if hasattr(head, "modules_to_save") else head
    return 0.0 if linear.bias is None else float(linear.bias.detach()[0])


@dataclass
class ProbeConfig:
    """Training settings of a probe (the fields mirror `EmoRewardConfig`).

    Attributes:
        ties: `drop | rao-kupper | davidson`; `tie_parameter`: its epsilon or nu.
        length_debias: `none | reweight | penalty | disentangled` (as in `EmoRewardConfig.length_debias`).
        odin_length_weight, odin_orthogonal_weight: the ODIN terms of `disentangled`.
        weight_decay: L2 penalty on the head weights (per pair, as AdamW's decoupled decay is not used here).
        epochs: full-batch L-BFGS iterations; `seed`: head initialisation.
    """

    ties: str = "rao-kupper"
    tie_parameter: float = 1.0
    length_debias: str = "none"
    odin_length_weight: float = 1.0
    odin_orthogonal_weight: float = 1.0
    weight_decay: float = 1e-2
    epochs: int = 200
    seed: int = 0


@dataclass
class Probe:
    """A trained probe: `rewards(features)` is `features @ weight[0] - penalty` (quality head only).

    Attributes:
        weight: `(num_heads, hidden)` value-head weights; `mean`, `scale`: feature standardisation.
        score_transform: the `penalty` objective's length penalty (`emoreward.models.base.apply_score_transform`),
            else None.
    """

    weight: np.ndarray
    mean: np.ndarray
    scale: np.ndarray
    score_transform: dict | None = None

    def rewards(self, features: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Quality rewards, shape `(N,)`, for features `(N, hidden)` and lengths `(N,)` in characters."""
        r = ((features - self.mean) / self.scale) @ self.weight[0]
        return apply_score_transform(r, lengths, self.score_transform)  # as a fine-tuned model's `score` does


def fit_probe(
    chosen: np.ndarray,
    rejected: np.ndarray,
    tie: np.ndarray,
    length_chosen: np.ndarray,
    length_rejected: np.ndarray,
    config: ProbeConfig,
) -> Probe:
    """Train a value head on frozen features of preference pairs.

    Args:
        chosen, rejected: features `(n_pairs, hidden)` of the chosen and rejected descriptions (either order
            for ties); `tie`: `(n_pairs,)` 1.0 for tie pairs.
        length_chosen, length_rejected: `(n_pairs,)` lengths in characters.
        config: loss and length options.

    Returns:
        the trained `Probe`. The loss is the objective's (`emoreward.training.objectives`), the one
        `EmoRewardTrainer` uses, with the `reweight` weights of `length_balance_weights`; `penalty` fits alpha on
        the training descriptions afterwards (`length_penalty_from_rewards`, as for a fine-tuned model). With
        `ties: drop` the tie pairs are left out, as the trainer's encoding leaves them out
        (`training.preprocess.encode_text_pair`); Bradley-Terry would otherwise read them as "first wins".
    """
    if config.ties == "drop" and np.any(tie):
        keep = np.asarray(tie) == 0
        chosen, rejected, tie = chosen[keep], rejected[keep], np.asarray(tie)[keep]
        length_chosen, length_rejected = np.asarray(length_chosen)[keep], np.asarray(length_rejected)[keep]
    both = np.concatenate([chosen, rejected])
    mean, scale = both.mean(0), both.std(0) + 1e-6
    x = torch.tensor((both - mean) / scale, dtype=torch.float64)
    n = len(chosen)
    objective = get_objective(config.length_debias)
    heads = objective.num_heads
    gen = torch.Generator().manual_seed(config.seed)
    weight = (torch.randn(heads, x.shape[1], generator=gen, dtype=torch.float64) * 0.01).requires_grad_()
    tie_t = torch.tensor(tie, dtype=torch.float64)
    lengths = torch.tensor(np.concatenate([length_chosen, length_rejected]), dtype=torch.float64)
    weights = torch.tensor(
        length_balance_weights(list(length_chosen), list(length_rejected), list(tie)), dtype=torch.float64
    )
    optimizer = torch.optim.LBFGS([weight], lr=1.0, max_iter=config.epochs, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        logits = x @ weight.T  # (2 * n, heads): chosen rows first
        loss = objective.loss(
            logits,
            tie=tie_t,
            ties=config.ties,
            tie_parameter=config.tie_parameter,
            weight=weights,
            lengths=lengths,
            head_weight=weight,
            odin_length_weight=config.odin_length_weight,
            odin_orthogonal_weight=config.odin_orthogonal_weight,
        ).loss
        loss = loss + config.weight_decay * weight.pow(2).sum() / n
        loss.backward()
        return loss

    optimizer.step(closure)
    probe = Probe(weight.detach().numpy(), mean, scale)
    if objective.after_fit is not None:  # penalty: fitted on the distinct training descriptions
        distinct = np.unique(np.concatenate([both, lengths.numpy()[:, None]], axis=1), axis=0)
        feats, lens = distinct[:, :-1], distinct[:, -1]
        probe.score_transform = length_penalty_from_rewards(probe.rewards(feats, lens), lens)
    return probe


def recipe_model(config) -> TextRewardModel:
    """The frozen text reward model of a recipe (`EmoRewardConfig`) as a probe reads it: its backbone (GGUF file,
    instruction, `max_length`, remote-code setting) in float32, LoRA not applied."""
    return TextRewardModel.from_backbone(
        config.model_name_or_path,
        gguf_file=config.gguf_file,
        instruction=config.instruction,
        max_length=config.max_length,
        dtype=torch.float32,
        trust_remote_code=config.trust_remote_code,
    )


class FeatureCache:
    """Value-head inputs of distinct (description, subtitle) texts, computed in chunks and kept on disk.

    Each chunk is written as `<directory>/chunk-XXXXX.npz` (texts and features) once it is complete, so an
    interrupted extraction resumes at the first missing chunk; a chunk whose texts differ from the current
    ones (another dataset or order) raises instead of being mixed in.
    """

    def __init__(self, directory: str | Path, chunk_size: int = 64):
        self.directory = Path(directory)
        self.chunk_size = chunk_size

    def features(
        self, model: TextRewardModel, texts: Sequence[tuple[str, str | None]], batch_size: int = 16, log=print
    ) -> np.ndarray:
        """Features `(len(texts), hidden)` of `texts` (distinct, fixed order), computing only missing chunks.

        Raises:
            ValueError: a chunk on disk holds other texts than the ones asked for.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        parts = []
        n_chunks = (len(texts) + self.chunk_size - 1) // self.chunk_size
        for c in range(n_chunks):
            chunk = list(texts[c * self.chunk_size : (c + 1) * self.chunk_size])
            path = self.directory / f"chunk-{c:05d}.npz"
            keys = np.array(["\x1f".join([d, s or ""]) for d, s in chunk], dtype=object)
            if path.exists():
                data = np.load(path, allow_pickle=True)
                if list(data["keys"]) != list(keys):
                    raise ValueError(f"{path}: feature chunk of other texts; use another cache directory")
                parts.append(data["features"])
                continue
            start = time.perf_counter()
            feats = value_head_inputs(model, [d for d, _ in chunk], [s for _, s in chunk], batch_size=batch_size)
            tmp = path.with_suffix(".tmp.npz")
            np.savez(tmp, keys=keys, features=feats)
            os.replace(tmp, path)  # a chunk file exists only once complete
            log(f"features: chunk {c + 1}/{n_chunks} ({len(chunk)} texts, {time.perf_counter() - start:.1f}s)")
            parts.append(feats)
        return np.concatenate(parts) if parts else np.empty((0, 0))


class ProbeJudge(RewardModelJudge):
    """A probe as a harness judge: rewards from cached features (no model calls)."""

    def __init__(self, probe: Probe, features: dict[tuple[str, str | None], np.ndarray], tie_threshold: float):
        self.probe, self.table = probe, features
        self.tie_threshold, self.name, self.n_scored, self._cache, self.errors = tie_threshold, "probe", 0, {}, {}

    def rewards(self, descriptions: Sequence[str], contexts: Sequence[RewardContext]) -> np.ndarray:
        feats = np.array([self.table[(d, c.subtitle)] for d, c in zip(descriptions, contexts)])
        return self.probe.rewards(feats, np.array([len(d) for d in descriptions], dtype=float))


def _oriented(pairs: Sequence[PreferencePair], table) -> tuple[np.ndarray, ...]:
    """(chosen, rejected, tie, length_chosen, length_rejected) arrays of labelled pairs."""
    chosen, rejected, tie, lc, lr = [], [], [], [], []
    for p in pairs:
        a, b = (p.description_2, p.description_1) if str(p.label) == "2" else (p.description_1, p.description_2)
        chosen.append(table[(a, p.media.subtitle)])
        rejected.append(table[(b, p.media.subtitle)])
        tie.append(1.0 if str(p.label) == "tie" else 0.0)
        lc.append(len(a))
        lr.append(len(b))
    return np.array(chosen), np.array(rejected), np.array(tie), np.array(lc, float), np.array(lr, float)


def probe_cross_validation(
    model: TextRewardModel,
    pairs: list[PreferencePair],
    variants: Sequence[str],
    *,
    folds: int = 5,
    seed: int = 42,
    config: ProbeConfig | None = None,
    cache_dir: str | Path,
    tie_policy: str = "wrong",
    log=print,
) -> dict[str, dict]:
    """k-fold cross-validation of value-head probes, one per `length_debias` variant, on the shared harness.

    The folds are `emoreward.training.pipeline.stratified_folds` (the same split as `run_training` with the same
    seed); the tie threshold is calibrated on the training folds as for a fine-tuned model; every held-out fold
    is judged in normal and swapped order and scored by `evaluate_judgements`.

    Returns:
        `{variant: {"summary": aggregate over folds, "folds": [evaluation, ...]}}`.
    """
    from emoreward.evaluation import evaluate_judgements, run_judge
    from emoreward.evaluation.metrics import calibrate_tie_threshold
    from emoreward.evaluation.report import aggregate
    from emoreward.training.pipeline import stratified_folds

    base = config or ProbeConfig()
    texts = list(dict.fromkeys((d, p.media.subtitle) for p in pairs for d in (p.description_1, p.description_2)))
    feats = FeatureCache(cache_dir).features(model, texts, log=log)
    table = dict(zip(texts, feats))
    out = {}
    for variant in variants:
        cfg = ProbeConfig(**{**base.__dict__, "length_debias": variant})
        evaluations = []
        for train_idx, test_idx in stratified_folds(pairs, folds, seed):
            train, test = [pairs[i] for i in train_idx], [pairs[i] for i in test_idx]
            probe = fit_probe(*_oriented(train, table), cfg)
            r1, r2 = ProbeJudge(probe, table, 0.0).pair_rewards(train)
            threshold = calibrate_tie_threshold(r1 - r2, [p.label for p in train])
            evaluation = evaluate_judgements(
                run_judge(ProbeJudge(probe, table, threshold), test), tie_policy=tie_policy
            )
            evaluation["tie_threshold"] = threshold
            evaluations.append(evaluation)
        out[variant] = {"summary": aggregate(evaluations), "folds": evaluations}
        log(f"probe {variant}: done ({folds} folds)")
    return out

"""Length-controlled ranking: any pair model of the registry with description-length covariates (style control).

"Prefer the longer description" explains most verdicts on emotion descriptions, so a plain ranking mixes quality
with verbosity. :func:`fit_length_controlled` adds the standardised log-length difference as a covariate beside the
model effects (Chatbot Arena's style control), with bootstrap intervals over samples; `order_changes` and
`comparison_markdown` compare it with the plain ranking.
See docs/ranking.md ("Length-controlled ranking").
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import ndtr  # the normal CDF, without importing scipy.stats

from emoreward.data.text import description_length, markdown_cell
from emoreward.ranking.bootstrap import BootstrapCI, percentile_interval, recentre, resample_unit_weights
from emoreward.ranking.bradley_terry import (
    DEFAULT_PRIOR_VARIANCE,
    SCORE_TOLERANCE,
    BTResult,
    finite_float,
    finite_floats,
    number_cell,
    prior_precision,
    single_blas_thread,
)
from emoreward.ranking.counts import PairwiseCounts, check_connected
from emoreward.ranking.edges import (
    FitEdges,
    edge_sentences,
    format_interval,
    intervals_defined,
    separated_groups,
    tie_parameter_edge,
)
from emoreward.ranking.length_batched import (
    DIVERGED,
    Design,
    build_design,
    damped_newton,
    data_nll,
    fit_resamples,
    n_params,
)
from emoreward.ranking.records import PairwiseRecord
from emoreward.ranking.tie_models import DEFAULT_TIE_MODEL, PairModel, get_model
from emoreward.utils.separation import decided_rows, separating_direction


COVARIATES: dict[str, Callable[[str], float]] = {
    "log_length": lambda text: math.log1p(description_length(text, "chars")),
    "log_words": lambda text: math.log1p(description_length(text, "words")),
    "lines": lambda text: float(text.count("\n") + 1 if text.strip() else 0),
}
"""Per-description covariates by name: ``log(1 + characters)`` (the default), ``log(1 + words)``, line count."""
DEFAULT_COVARIATES: tuple[str, ...] = ("log_length",)

_MIN_BOOT_SE = 20  # resamples needed for a bootstrap standard error; below, the Wald one is reported


def description_features(
    descriptions: Mapping[tuple[str, str], str], covariates: Sequence[str | tuple[str, Callable[[str], float]]]
) -> tuple[list[str], dict[tuple[str, str], np.ndarray]]:
    """Per-description covariate values ``(names, {(sample, model): np.ndarray of shape (K,)})`` of
    ``descriptions`` (``(sample, model) -> text``); ``covariates``: names from `COVARIATES` or ``(name, function of
    the text)`` pairs. Raises ValueError on an unknown or repeated name, or a non-finite value."""
    names, fns = [], []
    for cov in covariates:
        if isinstance(cov, str):
            if cov not in COVARIATES:
                raise ValueError(f"unknown covariate {cov!r}; available: {sorted(COVARIATES)}")
            names.append(cov)
            fns.append(COVARIATES[cov])
        else:
            names.append(str(cov[0]))
            fns.append(cov[1])
    if len(set(names)) != len(names):
        raise ValueError(f"covariates repeat: {names}")
    values = {}
    for key, text in descriptions.items():
        row = np.array([float(fn(text)) for fn in fns], dtype=float)
        if not np.all(np.isfinite(row)):
            raise ValueError(
                f"covariate values {dict(zip(names, row.tolist()))} of sample {key[0]!r}, model "
                f"{key[1]!r} are not finite"
            )
        values[key] = row
    return names, values


@dataclass(frozen=True)
class ControlledFit:
    """A length-controlled (style-controlled) fit of a pair model with bootstrap intervals.

    Attributes:
        items (`list[str]`): the M models, order of ``scores``.
        scores, ci_lower, ci_upper (`np.ndarray` of shape `(M,)`): model effects ``b``, centred (natural-log strength
            units, as the plain fit's), with their bootstrap interval; all NaN when the fit is not identified.
        covariates (`list[str]`): the K covariate names.
        coefficients, coef_lower, coef_upper (`np.ndarray` of shape `(K,)`): ``gamma_k``, logit per RMS of the
            covariate difference (NaN for a dropped, collinear or separated covariate), with its interval.
        std_errors, p_values (`np.ndarray` of shape `(K,)`): standard error of ``gamma_k`` (bootstrap over samples;
            the Wald one below 20 usable resamples) and the two-sided normal p-value of ``gamma_k = 0``.
        scales (`np.ndarray` of shape `(K,)`): ``sigma_k``, root-mean-square of the raw covariate differences.
        model (`str`): the pair model's name (``"bradley-terry"``: ties dropped); tie_parameter: its ``beta`` /
            ``nu`` (on the centred scale), ``None`` for Bradley-Terry or at its bound; tie_parameter_at_bound:
            ``"no ties"`` / ``"only ties"`` where it sits at its bound (`emoreward.ranking.edges.tie_parameter_edge`,
            as the plain fits'), else ``None``.
        log_likelihood (`float`): data log-likelihood (prior excluded); n_comparisons (`int`): records in it.
        ci_level (`float`), n_boot (`int`): coverage, resamples; ``n_failed`` of them diverged and are left out.
        warnings (`list[str]`): dropped, collinear or separated covariates, failed resamples.
        boot_scores `(n_boot, M)`, boot_coefficients `(n_boot, K)`: every resample's fit, NaN where not compared or
            failed.
        prior_variance (`float` or `None`): the prior on ``b``.
        separation (`dict` or `None`): where covariates and/or model identity separate the verdicts (no finite
            maximum likelihood): ``{"covariates", "models", "decided", "undecided"}``; ``covariates`` empty when model
            identity alone separates; ``models``: ``{model: "never lost" | "never won"}``, whose interval end on that
            side is open (null in the JSON).
        ranking, ranks: as `BTResult`'s.
    """

    items: list[str]
    scores: np.ndarray
    ci_lower: np.ndarray
    ci_upper: np.ndarray
    covariates: list[str]
    coefficients: np.ndarray
    coef_lower: np.ndarray
    coef_upper: np.ndarray
    std_errors: np.ndarray
    p_values: np.ndarray
    scales: np.ndarray
    model: str
    tie_parameter: float | None
    log_likelihood: float
    n_comparisons: int
    ci_level: float
    n_boot: int
    n_failed: int
    warnings: list[str]
    boot_scores: np.ndarray
    boot_coefficients: np.ndarray
    prior_variance: float | None = DEFAULT_PRIOR_VARIANCE
    separation: dict[str, Any] | None = None
    tie_parameter_at_bound: str | None = None
    ranking: list[str] = field(init=False)
    ranks: list[int] = field(init=False)

    def __post_init__(self) -> None:
        ranked = BTResult(list(self.items), self.scores, self.model, self.log_likelihood, float(self.n_comparisons))
        object.__setattr__(self, "ranking", ranked.ranking)  # shared ranks as every plain fit's
        object.__setattr__(self, "ranks", ranked.ranks)

    @property
    def identified(self) -> bool:
        """Whether the model effects are estimates (not NaN because of collinearity or separation)."""
        return bool(np.all(np.isfinite(self.scores)))

    @property
    def coefficient_per_doubling(self) -> np.ndarray:
        """`np.ndarray` of shape `(K,)`: ``gamma_k * ln 2 / sigma_k``, the logit change when the covariate
        difference is ``ln 2`` (for ``log_length``: one description twice as long as the other)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.coefficients * math.log(2.0) / self.scales

    def as_bt_result(self) -> BTResult:
        """The model effects as a `BTResult` (for the tables and plots of plain fits), interval attached."""
        return BTResult(
            items=list(self.items),
            scores=self.scores,
            model=f"{self.model} + {'+'.join(self.covariates)}",
            log_likelihood=self.log_likelihood,
            n_comparisons=float(self.n_comparisons),
            tie_parameter=self.tie_parameter,
            prior_variance=self.prior_variance,
            ci_lower=self.ci_lower,
            ci_upper=self.ci_upper,
            ci_level=self.ci_level,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (non-finite numbers become ``None``)."""
        return {
            "model": self.model,
            "items": list(self.items),
            "scores": finite_floats(self.scores),
            "ci_lower": finite_floats(self.ci_lower),
            "ci_upper": finite_floats(self.ci_upper),
            "ranking": list(self.ranking) if self.identified else None,
            "ranks": list(self.ranks) if self.identified else None,
            "covariates": {
                name: {
                    "coefficient": finite_float(self.coefficients[k]),
                    "ci_lower": finite_float(self.coef_lower[k]),
                    "ci_upper": finite_float(self.coef_upper[k]),
                    "std_error": finite_float(self.std_errors[k]),
                    "p_value": finite_float(self.p_values[k]),
                    "scale": finite_float(self.scales[k]),
                    "per_doubling": finite_float(self.coefficient_per_doubling[k]),
                }
                for k, name in enumerate(self.covariates)
            },
            "tie_parameter": finite_float(self.tie_parameter),
            "tie_parameter_at_bound": self.tie_parameter_at_bound,
            "log_likelihood": finite_float(self.log_likelihood),
            "n_comparisons": int(self.n_comparisons),
            "prior_variance": finite_float(self.prior_variance),
            "ci_level": self.ci_level,
            "n_boot": self.n_boot,
            "n_failed": self.n_failed,
            "separation": self.separation,
            "warnings": list(self.warnings),
        }

    def coefficients_markdown(self, digits: int = 3) -> str:
        """Markdown table of the covariate coefficients with interval, standard error, p-value, per doubling, rendered
        from :meth:`to_dict`'s values (a value the JSON has as null is ``-``, never ``nan``)."""
        pct = f"{100 * self.ci_level:g}%"
        lines = [
            f"| covariate | coefficient (logit / RMS) | {pct} CI | s.e. | p-value | logit per doubling |",
            "|---|---:|---|---:|---:|---:|",
        ]
        fixed = f".{digits}f"
        for name, cov in self.to_dict()["covariates"].items():
            if self.separation is not None and name in self.separation["covariates"]:
                lines.append(f"| {markdown_cell(name)} | infinite (separation) | - | - | - | - |")
                continue
            if self.separation is not None and cov["coefficient"] is None:
                lines.append(f"| {markdown_cell(name)} | not identified (separation) | - | - | - | - |")
                continue
            if cov["coefficient"] is None:
                lines.append(f"| {markdown_cell(name)} | - | - | - | - | - |")
                continue
            ci = "-"
            if cov["ci_lower"] is not None and cov["ci_upper"] is not None:
                ci = f"[{number_cell(cov['ci_lower'], fixed)}, {number_cell(cov['ci_upper'], fixed)}]"
            lines.append(
                f"| {markdown_cell(name)} | {number_cell(cov['coefficient'], fixed)} | {ci} "
                f"| {number_cell(cov['std_error'], fixed)} | {number_cell(cov['p_value'], '.2g')} "
                f"| {number_cell(cov['per_doubling'], fixed)} |"
            )
        return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- edge diagnostics


def _collinear(x: np.ndarray, m: int) -> bool:
    """Whether a covariate column is a linear combination of the model-indicator columns (rank deficiency)."""
    gram_b = x[:, :m].T @ x[:, :m]
    gram = x.T @ x
    return np.linalg.matrix_rank(gram) < np.linalg.matrix_rank(gram_b) + (x.shape[1] - m)


# ------------------------------------------------------------------------------------------------------- fit


def fit_length_controlled(
    records: Sequence[PairwiseRecord],
    features: Mapping[tuple[str, str], np.ndarray],
    covariates: Sequence[str] = DEFAULT_COVARIATES,
    model: PairModel | None = None,
    items: Sequence[str] | None = None,
    prior_variance: float | None = DEFAULT_PRIOR_VARIANCE,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int | None = 0,
    batched: bool = True,
) -> ControlledFit:
    """Fit the length-controlled model, with bootstrap intervals over samples.

    Source: Chatbot Arena's style control (Li, Angelopoulos, Chiang, LMSYS blog, 2024-08-29; FastChat
    ``elo_analysis.py``, ``construct_style_matrices``), on description-model verdicts::

        logit P(i beats j | sample s) = (b_i - b_j) + sum_k gamma_k z_k(i, j, s),
        z_k(i, j, s) = (f_k(d_is) - f_k(d_js)) / sigma_k,

    ``d_is`` the description model ``i`` wrote for sample ``s``, ``f_k`` a per-description covariate (default
    ``log(1 + characters)``), ``sigma_k`` the root-mean-square of the differences. Any pair model of
    `emoreward.ranking.tie_models` gives the likelihood, ties included, at the two sides' log-strengths
    ``b_i + gamma . z / 2`` and ``b_j - gamma . z / 2`` (a model of the difference sees the logit above); ``b`` gets
    the plain fits' prior and is centred; ``gamma`` is unpenalised (maximum likelihood).
    Unlike FastChat (``(a - b) / (a + b + 1)``, z-scored) we take the log-length difference scaled by its RMS without
    centring: a description pair has no natural order.

    Edges (each a warning, ``None`` where a number would mislead): a constant covariate is dropped; one collinear
    with model identity is not reported; one that separates the decisive verdicts has an infinite coefficient
    (`separation_note`); where model identity alone separates them, the scores are the prior-bounded ones with open
    interval ends. The edges the plain fits meet are asked of their owner, `emoreward.ranking.edges`, on the verdicts
    this fit reads, with the plain fits' nulls and sentences: models separated by identity alone, a tie parameter at
    its bound (no ties or only ties: ``None``, named in ``tie_parameter_at_bound``), one resampling unit. Diverging
    resamples are left out of the percentile bootstrap over samples (the draws of `bootstrap_ci`), fitted by
    :func:`emoreward.ranking.length_batched.fit_resamples`.

    Args:
        records (`Sequence[PairwiseRecord]`): the verdicts; every record needs a ``sample``.
        features (`Mapping[tuple[str, str], np.ndarray]`): ``(sample, model) -> raw covariate values`` of shape
            `(K,)` (see :func:`description_features`).
        covariates (`Sequence[str]`): the K names, in the order of the feature vectors.
        model (`PairModel`, *optional*): the pair model (`emoreward.ranking.tie_models`; default
            ``DEFAULT_TIE_MODEL``, as `emoreward.ranking.fit.FitSpec`); Bradley-Terry drops ties (as
            :func:`~emoreward.ranking.bradley_terry.fit_bradley_terry`'s default).
        items (`Sequence[str]`, *optional*): item order (default: sorted names).
        prior_variance (`float` or `None`): Gaussian prior on the model effects, as the plain fits.
        n_boot, alpha, seed: as :func:`~emoreward.ranking.bootstrap.bootstrap_ci` (same seed, same resamples).
        batched (`bool`): every resample at once (default) or one at a time (the reference path; same optimum to
            about 1e-8).

    Returns:
        `ControlledFit`; its ``warnings`` are also raised as `UserWarning`.

    Raises:
        ValueError: on no records, a record without sample or features (the message names the
            record), feature vectors of the wrong length, a disconnected comparison graph, ``n_boot < 1`` or
            ``alpha`` outside (0, 1).
    """
    model = get_model(DEFAULT_TIE_MODEL) if model is None else model
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    precision = prior_precision(prior_variance)
    records = list(records)
    if not records:
        raise ValueError("fit_length_controlled needs at least one record")
    covariates = list(covariates)
    values = _description_covariates(records, features, covariates)
    raw = values[:, 0] - values[:, 1]
    items = sorted({r.item_a for r in records} | {r.item_b for r in records}) if items is None else list(items)
    check_connected(PairwiseCounts.from_records(records, items), "error")
    notes: list[str] = []
    scales = np.sqrt(np.mean(raw**2, axis=0)) if len(raw) else np.zeros(len(covariates))
    kept = scales > 0
    for k in np.flatnonzero(~kept):
        notes.append(f"covariate {covariates[k]!r} does not differ within any compared pair: dropped")
    design, in_design = build_design(records, items, values[:, :, kept] / scales[kept], model)
    boot_s = np.full((n_boot, len(items)), np.nan)
    boot_c = np.full((n_boot, len(covariates)), np.nan)
    n_failed = 0
    with single_blas_thread():  # small products: OpenBLAS threads only spin
        full = _full_fit(design, model, [c for c, k in zip(covariates, kept) if k], precision, notes)
        separation, gamma_identified = None, True
        in_records = fitted = [r for r, k in zip(records, in_design) if k]  # fitted: the verdicts the likelihood reads
        if full.undecided is not None and not full.by_models:  # covariates separate: the model effects on the rest
            fitted = [r for r, u in zip(in_records, full.undecided) if u]
            full, boot_s, open_ends, groups = _separated_fit(
                design, model, full.undecided, fitted, items, precision, n_boot, seed, batched
            )
            separation = {"covariates": [c for c, k in zip(covariates, kept) if k], "models": groups}
        elif full.identified and intervals_defined(design.n_units):  # one sample: no interval (edges)
            boot_s, boot_c[:, kept], n_failed = _bootstrap(design, model, full, precision, n_boot, seed, batched)
        separated: dict[str, str] = {}
        if full.by_models:  # model identity separates: the prior-bounded fit, open ends as the plain fits'
            groups = separated = separated_groups(PairwiseCounts.from_records(in_records, items), model)
            open_ends = tuple(np.array([groups.get(i) == kind for i in items]) for kind in ("never won", "never lost"))
            # in the limit the decided verdicts leave the likelihood: the coefficients rest on the undecided rest
            gamma_identified = bool(np.any(design.x[full.undecided, len(items) :] != 0))
            if kept.any() and not gamma_identified:
                notes.append(
                    f"model identity decides {int((~full.undecided).sum())} of the {len(full.undecided)} verdicts, "
                    "leaving none where the covariates differ: the coefficients are not identified (null)"
                )
            separation = {"covariates": [], "models": groups}
        if separation is not None:
            separation.update(decided=int((~full.undecided).sum()), undecided=int(full.undecided.sum()))
    if n_failed:
        notes.append(
            f"{n_failed} of {n_boot} resamples separated (their coefficients diverged): left out of the intervals"
        )
    if not full.converged and full.identified:
        notes.append("the full-data Newton iteration did not converge: treat the fit with care")
    # the plain fits' edges, asked of their owner (edges.py) on the verdicts this fit reads: the same nulls, the same
    # sentences (separation by model identity, a tie parameter at its bound, one resampling unit)
    edges = FitEdges(separated, tie_parameter_edge(model, PairwiseCounts.from_records(fitted, items)), design.n_units)
    notes += edge_sentences(edges, prior_variance)
    all_ties = edges.tie_parameter == "only ties"
    if all_ties and kept.any():  # nothing to weigh length by
        notes.append("no verdict says which description is better: the covariates' coefficients are not identified")
    scores = full.scores if full.identified else np.full(len(items), np.nan)
    coef, se, pval = (np.full(len(covariates), np.nan) for _ in range(3))
    if full.identified and not (separation and separation["covariates"]) and gamma_identified and not all_ties:
        # covariates in the separation: their coefficients are infinite (null, named)
        coef[kept], se[kept] = full.coefficients, full.wald_se
        good = np.isfinite(boot_c[:, kept]).all(axis=1) if kept.any() else np.zeros(n_boot, dtype=bool)
        if good.sum() >= _MIN_BOOT_SE:  # verdicts on one sample are correlated: the Wald one understates it
            se[kept] = np.std(boot_c[good][:, kept], axis=0, ddof=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            pval[kept] = 2.0 * ndtr(-np.abs(coef[kept] / se[kept]))
    lo_s, hi_s = percentile_interval(boot_s, scores, alpha)[:2]
    if separation is not None:  # an end the undecided verdicts do not bound is open (edges.format_interval)
        lo_s[open_ends[0]], hi_s[open_ends[1]] = -np.inf, np.inf
    lo_c, hi_c = percentile_interval(boot_c, coef, alpha)[:2]
    for note in notes:
        warnings.warn(f"length-controlled fit: {note}", UserWarning, stacklevel=2)
    return ControlledFit(
        items=items,
        scores=scores,
        ci_lower=lo_s,
        ci_upper=hi_s,
        covariates=covariates,
        coefficients=coef,
        coef_lower=lo_c,
        coef_upper=hi_c,
        std_errors=se,
        p_values=pval,
        scales=scales,
        model=model.name,
        tie_parameter=None if edges.tie_parameter else full.tie_parameter,
        tie_parameter_at_bound=edges.tie_parameter,
        log_likelihood=full.log_likelihood,
        n_comparisons=int(design.x.shape[0]),
        ci_level=1.0 - alpha,
        n_boot=n_boot,
        n_failed=n_failed,
        warnings=notes,
        boot_scores=boot_s,
        boot_coefficients=boot_c,
        prior_variance=prior_variance,
        separation=separation,
    )


def _separated_fit(
    design: Design,
    model: PairModel,
    undecided: np.ndarray,
    undecided_records: list[PairwiseRecord],
    items: list[str],
    precision: float,
    n_boot: int,
    seed: int | None,
    batched: bool,
) -> tuple[_FullFit, np.ndarray, tuple[np.ndarray, np.ndarray], dict[str, str]]:
    """The limit of the fit where the covariates separate the verdicts: the decided verdicts leave the likelihood,
    the model effects are fitted (and bootstrapped) on the ``undecided`` rest with their prior; an interval end
    those verdicts do not bound is open.

    Returns:
        ``(fit, boot_scores (n_boot, M), (open_lower (M,), open_upper (M,)), separated models among the undecided
        verdicts (`separated_groups`))``.
    """
    m = design.m
    keep = undecided
    sub = design.subset(keep, columns=m)
    boot_s = np.full((n_boot, m), np.nan)
    if keep.any():
        theta, ok, _ = damped_newton(sub, model, np.ones((1, int(keep.sum()))), precision, hessian=False)
        est, converged = theta[0], bool(ok[0])
    else:
        est, converged = np.zeros(n_params(sub, model)), True
        if model.has_tie:
            est[-1] = model.bounds[0]
    fit = _FullFit(
        estimate=est,
        scores=est[:m] - est[:m].mean(),
        coefficients=np.zeros(0),
        wald_se=np.zeros(0),
        tie_parameter=_tie_parameter(model, est, m),
        log_likelihood=-data_nll(sub, model, est) if keep.any() else 0.0,
        converged=converged,
        identified=True,
        undecided=undecided,
    )
    if keep.any() and intervals_defined(design.n_units):
        boot_s, _, _ = _bootstrap(sub, model, fit, precision, n_boot, seed, batched)
    counts = PairwiseCounts.from_records(undecided_records, items)
    groups = separated_groups(counts, model)
    compared = (counts.totals > 0).any(axis=1)
    # a model some resample's undecided verdicts never show has only the prior to bound it there: open both ends
    unbounded = ~compared | np.isnan(boot_s).any(axis=0)
    lower = np.array([unbounded[k] or groups.get(i) == "never won" for k, i in enumerate(items)])
    upper = np.array([unbounded[k] or groups.get(i) == "never lost" for k, i in enumerate(items)])
    return fit, boot_s, (lower, upper), groups


def _description_covariates(
    records: list[PairwiseRecord], features: Mapping[tuple[str, str], np.ndarray], covariates: list[str]
) -> np.ndarray:
    """``(f(d_a), f(d_b))`` of every record, shape `(N, 2, K)`; a ValueError names the first record without
    features (or with a vector of the wrong shape)."""
    k_cov = len(covariates)
    index = {key: row for row, key in enumerate(features)}
    vectors = [np.asarray(v, dtype=float) for v in features.values()]
    shaped = np.array([v.shape == (k_cov,) for v in vectors] + [False])  # the last entry: no features
    table = np.array([v if ok else np.zeros(k_cov) for v, ok in zip(vectors, shaped)]).reshape(-1, k_cov)
    missing = len(vectors)
    rows_a = np.fromiter((index.get((r.sample, r.item_a), missing) for r in records), np.int64, len(records))
    rows_b = np.fromiter((index.get((r.sample, r.item_b), missing) for r in records), np.int64, len(records))
    no_sample = np.fromiter((r.sample is None for r in records), bool, len(records))
    bad = np.flatnonzero(no_sample | ~(shaped[rows_a] & shaped[rows_b]))
    if len(bad):
        n = int(bad[0])
        r = records[n]
        if rows_a[n] == missing or rows_b[n] == missing or r.sample is None:
            name = r.item_a if rows_a[n] == missing else r.item_b
            raise ValueError(
                f"record {n} ({r.item_a} vs {r.item_b}, sample {r.sample!r}): no covariates for model {name!r} on "
                "this sample"
            )
        raise ValueError(f"record {n}: covariate vectors must have shape ({k_cov},) for {covariates}")
    return np.stack([table[rows_a], table[rows_b]], axis=1)


@dataclass(frozen=True)
class _FullFit:
    """The full-data fit: parameters (``estimate``, uncentred), centred ``scores``, kept ``coefficients`` with
    their Wald standard errors, and whether the model effects are identified (not collinear nor separated)."""

    estimate: np.ndarray
    scores: np.ndarray
    coefficients: np.ndarray
    wald_se: np.ndarray
    tie_parameter: float | None
    log_likelihood: float
    converged: bool
    identified: bool
    undecided: np.ndarray | None = None  # separated: the records the separating directions leave at 0
    by_models: bool = False  # model identity alone separates (the fit stays the prior-bounded one)


def separation_note(kept: Sequence[str], n_decided: int, n_undecided: int, with_models: bool = False) -> str:
    """The warning of a fit whose covariates separate the verdicts, alone or ``with_models``."""
    rest = (
        f"the model effects are fitted on the {n_undecided} verdicts it leaves undecided"
        if n_undecided
        else "no verdict is left for the model effects: they are 0, bounded by the prior only"
    )
    how = (
        "together with model identity (no finite model effects and coefficients fit them)"
        if with_models
        else "every one where they differ (the longer/shorter description always wins)"
    )
    return (
        f"separation: covariates {list(kept)} decide {n_decided} of the {n_decided + n_undecided} verdicts, {how}, "
        "so maximum likelihood has no finite "
        f"coefficient (reported as null: infinite along that direction); {rest}, and an interval end those verdicts "
        "do not bound is open (null in the JSON), as for separated models of the plain fits"
    )


def _tie_parameter(model: PairModel, estimate: np.ndarray, m: int) -> float | None:
    """The tie parameter of a fit (``None`` without one), on the centred scale where it shifts with the scores."""
    if not model.has_tie:
        return None
    shift = float(np.mean(estimate[:m])) if model.shifts_with_scores else 0.0
    return float(model.tie_parameter(float(estimate[-1]) - shift))


def _full_fit(design: Design, model: PairModel, kept: list[str], precision: float, notes: list[str]) -> _FullFit:
    """Fit all records; collinear or nearly separated covariates make it unidentified (noted). Verdicts decided by a
    separation (`decided_rows` on the full design) are marked (``undecided``); ``by_models`` where model identity
    alone separates (the prior-bounded fit, as the plain fits')."""
    m, p = design.m, design.x.shape[1]
    identified = True
    if kept and _collinear(design.x, m):
        notes.append(
            f"covariates {kept} are collinear with model identity (each model's relative length is the same on every "
            "sample): model effects and coefficients are not separately identified; reported as null"
        )
        identified = False
    undecided = None
    orders = model.binding_orders(bool(np.any(design.outcome == 2)))  # 2: a tie verdict
    if identified and kept:
        direction = separating_direction(design.x[:, m:], design.outcome, orders, design.level[:, m:])
        if direction is not None:  # the limit of the fit as the coefficients grow along it: _separated_fit
            z = design.x[:, m:] @ direction
            undecided = np.abs(z) <= 1e-9 * max(1.0, float(np.abs(z).max()))
            notes.append(separation_note(kept, int((~undecided).sum()), int(undecided.sum())))
    by_models = False
    if identified and undecided is None:
        level = design.level
        decided = decided_rows(design.x, design.outcome, orders, level)
        if decided is not None:
            undecided = ~decided
            by_models = not kept or np.array_equal(
                decided, decided_rows(design.x[:, :m], design.outcome, orders, level[:, :m])
            )
            if not by_models:
                notes.append(separation_note(kept, int(decided.sum()), int(undecided.sum()), with_models=True))
    theta, ok, hess = damped_newton(design, model, np.ones((1, design.x.shape[0])), precision)
    est = theta[0]
    if (undecided is None or by_models) and identified and kept and (not ok[0] or np.max(np.abs(est[m:p])) > DIVERGED):
        notes.append(
            f"covariates {kept} nearly separate the verdicts (fitted coefficient beyond {DIVERGED:g} logits per RMS "
            "difference, or no convergence): the estimate rests on the few verdicts length does not decide; scores, "
            "coefficients and p-values reported as null"
        )
        identified = False
    wald_se = np.sqrt(np.maximum(np.diag(np.linalg.pinv(hess[0]))[m:p], 0.0))
    return _FullFit(
        estimate=est,
        scores=est[:m] - est[:m].mean(),
        coefficients=est[m:p],
        wald_se=wald_se,
        tie_parameter=_tie_parameter(model, est, m),
        log_likelihood=-data_nll(design, model, est),
        converged=bool(ok[0]),
        identified=identified,
        undecided=undecided,
        by_models=by_models,
    )


def _bootstrap(
    design: Design, model: PairModel, full: _FullFit, precision: float, n_boot: int, seed: int | None, batched: bool
) -> tuple[np.ndarray, np.ndarray, int]:
    """Every resample's centred scores `(n_boot, M)` and kept coefficients `(n_boot, K_kept)`, NaN where a model
    was not compared (scores) or the resample failed (separated: not converged or beyond ``DIVERGED``), and the
    number of failed resamples. The resamples are :func:`~emoreward.ranking.bootstrap.bootstrap_ci`'s."""
    m, p = design.m, design.x.shape[1]
    unit_w = resample_unit_weights(design.n_units, n_boot, seed).astype(float)
    fits = fit_resamples(design, model, full.estimate, unit_w, precision, batched)
    theta = fits.params
    good = fits.converged & (np.max(np.abs(theta[:, m:p]), axis=1, initial=0.0) <= DIVERGED)
    present_rows = np.zeros((design.n_units, m))
    np.add.at(present_rows, (design.units, design.a), 1.0)
    np.add.at(present_rows, (design.units, design.b), 1.0)
    present = (unit_w @ present_rows) > 0
    scores = recentre(theta[:, :m], full.scores, present)
    scores[~good] = np.nan
    coefficients = theta[:, m:p].copy()
    coefficients[~good] = np.nan
    return scores, coefficients, int((~good).sum())


# ----------------------------------------------------------------------------------------- plain vs controlled


def order_changes(plain: BootstrapCI | BTResult, controlled: ControlledFit) -> list[tuple[str, str]]:
    """Pairs ``(i, j)`` the plain fit puts ``i`` above ``j`` and the controlled fit reverses, with the two intervals
    apart in at least one fit; empty when the controlled fit is not identified."""
    result = plain.estimate if isinstance(plain, BootstrapCI) else plain
    if not controlled.identified:
        return []
    index = {name: k for k, name in enumerate(controlled.items)}
    out = []
    for a in range(len(result.items)):
        for b in range(len(result.items)):
            ia, ib = result.items[a], result.items[b]
            if ia not in index or ib not in index:
                continue
            ca, cb = index[ia], index[ib]
            if not (result.scores[a] > result.scores[b] + SCORE_TOLERANCE):
                continue
            if not (controlled.scores[cb] > controlled.scores[ca] + SCORE_TOLERANCE):
                continue
            apart_plain = result.ci_lower is not None and result.ci_lower[a] > result.ci_upper[b]
            apart_ctrl = controlled.ci_lower[cb] > controlled.ci_upper[ca]
            if apart_plain or apart_ctrl:
                out.append((ia, ib))
    return out


def comparison_markdown(
    plain: BootstrapCI | BTResult,
    controlled: ControlledFit,
    digits: int = 2,
    open_ends: Callable[[str], tuple[bool, bool]] | None = None,
) -> str:
    """Markdown table, controlled order first: rank, model, controlled score [CI], plain rank and score [CI].

    `open_ends(model)`: which ends of the plain fit's interval only its prior bounds (`FitEdges.open_ends`), shown
    as -inf / +inf as in the main table (`emoreward.ranking.edges.format_interval`)."""
    result = plain.estimate if isinstance(plain, BootstrapCI) else plain
    pct = f"{100 * controlled.ci_level:g}%"
    lines = [
        f"| controlled rank | model | controlled score | {pct} CI | plain rank | plain score | plain {pct} CI |",
        "|---:|---|---:|---|---:|---:|---|",
    ]
    order = controlled.ranking if controlled.identified else list(result.ranking)
    ranks = controlled.ranks if controlled.identified else [None] * len(order)
    for rank, name in zip(ranks, order):
        k = controlled.items.index(name)
        ctrl = "-" if rank is None else f"{controlled.scores[k]:.{digits}f}"
        ci = "-" if rank is None else format_interval(controlled.ci_lower[k], controlled.ci_upper[k], digits)
        j = result.items.index(name)
        ends = open_ends(name) if open_ends is not None else (False, False)
        pci = "-" if result.ci_lower is None else format_interval(result.ci_lower[j], result.ci_upper[j], digits, ends)
        lines.append(
            f"| {'-' if rank is None else rank} | {markdown_cell(name)} | {ctrl} | {ci} | {result.rank(name)} "
            f"| {number_cell(result.scores[j], f'.{digits}f')} | {pci} |"
        )
    return "\n".join(lines) + "\n\n" + controlled.coefficients_markdown(digits)

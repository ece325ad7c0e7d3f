"""Pairwise likelihoods, one object per model: plain Bradley-Terry and the tie models (EmoPrefer, Rao-Kupper,
Davidson), each a `PairModel` in its own module of this package, found when the package is imported.

Every fit reads the models from here: the count-table driver (`emoreward.ranking.batched`), the length-controlled
fit, BPA's Rao-Kupper, the command line's choices and the reports. A new tie model is one module here defining
``MODEL = YourModel()`` (or any code calling `register`). See docs/ranking.md.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
from dataclasses import dataclass

import numpy as np


# Bounds on the tie log-parameter keep the fit finite when a data set (or bootstrap resample) has no ties.
TIE_LOG_BOUNDS = (-30.0, 30.0)


@dataclass(frozen=True)
class PartitionScaling:
    """How an `exponential_family` model's `PairModel.scaled_log_partition` relates to ``A``'s derivatives: it reads
    ``u = argument * d`` and returns each derivative of ``A`` (``a_d, a_dd, a_e, a_de, a_ee``) divided by a factor
    ``constant * nu^power``, ``nu = exp(eta)``, the same for every pair of a row (Davidson: ``u = d / 2``; ``p0 - p1``
    for ``a_d = (p0 - p1) / 2``, factor 1/2; ``1 / (e^u + e^-u + nu)`` for ``a_e = P(tie)``, factor ``nu``). A
    model without a tie parameter has every power 0."""

    argument: float = 1.0
    constants: tuple[float, float, float, float, float] = (1.0, 1.0, 1.0, 1.0, 1.0)
    powers: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)

    def factors(self, eta, rows: int) -> tuple[np.ndarray, ...]:
        """The five factors, each `(rows, 1)` float64, at ``eta`` `(rows, 1)` (``None``: every power 0)."""
        nu = None if eta is None else np.exp(np.asarray(eta, dtype=np.float64))
        return tuple(
            np.full((rows, 1), c) if k == 0 else c * nu**k for c, k in zip(self.constants, self.powers, strict=True)
        )


class PairModel:
    """One pairwise likelihood, written once: values and derivatives per compared pair, batched over rows.

    A model sees, per row ``b`` (a count table or a weighting) and pair ``p``: the log-strengths ``s_i``, ``s_j``
    (`(R, P)`), the tie log-parameter ``eta`` (`(R, 1)`, ``None`` for plain Bradley-Terry) and the counts ``w``
    (i beat j), ``lo`` (j beat i), ``t`` (ties), each `(R, P)`.

    Attributes:
        name (`str`): the name users pick it by (``--tie-model``).
        has_tie (`bool`): the model has a tie parameter ``eta`` (False: plain Bradley-Terry, ties not modelled).
        offset (`float`): the tie parameter is ``offset + exp(eta)`` (Rao-Kupper's ``nu >= 1``: 1).
        shifts_with_scores (`bool`): the likelihood is unchanged when ``s`` and ``eta`` shift together (EmoPrefer's
            ``beta`` has the units of ``theta``), so centring the scores shifts ``eta`` too.
        bounds (`tuple[float, float]`): bounds on ``eta``; they keep the fit finite for data without ties (the
            optimum is then the lower bound) or with ties only (the upper bound).
        order (`int`): position in listings (choices, messages); built-ins first.
        orders (`dict[int, tuple[tuple[str, str], ...]]`): what a verdict (0: ``i`` won, 1: ``j`` won, 2: a tie)
            says where the likelihood has no finite maximum: ``(ahead, behind)`` among the pair's items ``"i"``,
            ``"j"`` and the tie level ``"0"`` (``eta``, held by its ``bounds``). A direction of the scores that keeps
            every such order, one strictly, raises the likelihood without bound (separation; Albert & Anderson
            1984, Ford 1957); both orders of one pair: the verdict binds their difference. The default: a tie
            binds the difference (Davidson, Rao-Kupper). Read by `emoreward.ranking.edges.separated_groups` and
            `emoreward.utils.separation` (every fit's separation and open interval ends).
        difference_only (`bool`): the likelihood depends on the scores through ``d = s_i - s_j`` only (with ``eta``),
            so its derivatives in ``s_j`` are those in ``s_i`` negated and `difference_terms` gives them all; the
            length-controlled resamples then sum 5 terms per record instead of 9 (True: Bradley-Terry, Davidson,
            Rao-Kupper; False, the safe default: EmoPrefer, whose tie level competes with each score).
        exponential_family (`bool`): a `difference_only` model whose negative log-likelihood is
            ``n A(d, eta) - T_d d - T_e eta`` with ``n``, ``T_d``, ``T_e`` linear in the counts
            (`natural_statistics`) and ``A`` free of them (`log_partition`): an exponential family in the natural
            parameters ``(d, eta)``. Its gradient is ``n A' - T`` and its Hessian ``n A''``, so the
            length-controlled resamples sum the data-linear part ``T`` once per sample and evaluate only ``A``'s
            derivatives per record (True: Bradley-Terry, Davidson; False: Rao-Kupper, whose outcomes' log-odds are
            not linear in ``(d, eta)``, and EmoPrefer).
        partition_scaling (`PartitionScaling`): how `scaled_log_partition` is scaled (default: not at all); the
            resamples apply the factors to the sums, not per record.
    """

    name: str = ""
    has_tie: bool = True
    offset: float = 0.0
    shifts_with_scores: bool = False
    bounds: tuple[float, float] = TIE_LOG_BOUNDS
    order: int = 100
    difference_only: bool = False
    exponential_family: bool = False
    partition_scaling: PartitionScaling = PartitionScaling()
    orders: dict[int, tuple[tuple[str, str], ...]] = {0: (("i", "j"),), 1: (("j", "i"),), 2: (("i", "j"), ("j", "i"))}

    def binding_orders(self, any_tie: bool) -> dict[int, tuple[tuple[str, str], ...]]:
        """`orders` as they bind the scores in data with or without a tie verdict: with none, the tie level
        ``"0"`` bounds no score (``eta`` alone sits at its lower bound, reported as "no ties"), so its orders go."""
        if any_tie:
            return self.orders
        return {code: tuple(o for o in pairs if "0" not in o) for code, pairs in self.orders.items()}

    def terms(self, s_i, s_j, eta, w, lo, t, derivatives: bool):
        """Negative log-likelihood per row and, with ``derivatives``, the per-pair gradient and Hessian entries.

        Returns:
            ``(nll (R,), grad, hess)``: ``grad`` maps ``"i"``, ``"j"`` (and ``"e"`` for ``eta``) to `(R, P)` arrays
            of first derivatives in ``(s_i, s_j, eta)``; ``hess`` maps ``"ii"``, ``"jj"``, ``"ij"`` (and ``"ie"``,
            ``"je"``, ``"ee"``) to second derivatives. Both ``None`` without ``derivatives``.
        """
        raise NotImplementedError

    def difference_terms(self, d, eta, w, lo, t, hessian: bool = True):
        """The derivatives of a `difference_only` model's negative log-likelihood in ``d = s_i - s_j`` and ``eta``
        per pair, without the likelihood itself: what a Newton pass over many rows needs, in few array operations.

        Args:
            d: `(R, P)` score differences; eta: `(R, 1)` tie log-parameters (``None`` without a tie parameter);
            w, lo, t: `(R, P)` or `(1, P)` counts of ``i`` winning, ``j`` winning and ties (any float dtype; the
            results have ``d``'s); hessian: the second derivatives too.

        Returns:
            ``(g_d, h_dd, g_e, h_de, h_ee)``, each `(R, P)`: ``d nll / d d``, ``d^2 nll / d d^2``, ``d nll / d eta``,
            ``d^2 nll / d d d eta``, ``d^2 nll / d eta^2`` (the last three ``None`` without a tie parameter). In
            `terms`' entries: ``g_d = grad["i"] = -grad["j"]``, ``h_dd = hess["ii"] = hess["jj"] = -hess["ij"]``,
            ``h_de = hess["ie"] = -hess["je"]``. Without ``hessian`` a model may return ``None`` for the second
            derivatives (the gradient-only passes). This default reads them from `terms` at ``(d, 0)`` (right for
            any `difference_only` model, not faster); a model overrides it with its closed form.
        """
        _, grad, hess = self.terms(d, np.zeros_like(d), eta, w, lo, t, True)
        if not self.has_tie:
            return grad["i"], hess["ii"], None, None, None
        return grad["i"], hess["ii"], grad["e"], hess["ie"], hess["ee"]

    def natural_statistics(self, w, lo, t):
        """An `exponential_family` model's trials and sufficient statistics, each linear in the counts.

        Args:
            w, lo, t: counts of ``i`` winning, ``j`` winning and ties (arrays of one shape, any float dtype).

        Returns:
            ``(n, T_d, T_e)`` of that shape: the trials multiplying ``A`` and the coefficients of ``d`` and ``eta``
            (``T_e`` ``None`` without a tie parameter).
        """
        raise NotImplementedError

    def log_partition(self, d, eta, hessian: bool = True):
        """An `exponential_family` model's derivatives of ``A(d, eta)``, the negative log-likelihood per trial less
        its data-linear part, per pair: `scaled_log_partition` times `partition_scaling`'s factors.

        Args:
            d: `(R, P)` score differences; eta: `(R, 1)` tie log-parameters (``None`` without a tie parameter);
            hessian: the second derivatives too.

        Returns:
            ``(a_d, a_dd, a_e, a_de, a_ee)``, each `(R, P)` in ``d``'s dtype (the second derivatives ``None``
            without ``hessian``; the ``eta`` ones without a tie parameter): `difference_terms` is
            ``(n a_d - T_d, n a_dd, n a_e - T_e, n a_de, n a_ee)``.
        """
        scaling = self.partition_scaling
        terms = self.scaled_log_partition(np.multiply(d, scaling.argument), eta, hessian)
        factors = scaling.factors(eta, d.shape[0])
        return tuple(None if v is None else (v * f).astype(d.dtype) for v, f in zip(terms, factors))

    def scaled_log_partition(self, u, eta, hessian: bool = True, bound: float | None = None):
        """`log_partition` up to the factors of `partition_scaling`, which the length-controlled resamples apply
        to the sums over the records instead of to every record (the pass's hot loop).

        Args:
            u: `(R, P)` ``partition_scaling.argument`` times the score differences, a fresh array the model may
                overwrite; eta: `(R, 1)` tie log-parameters (``None`` without a tie parameter); hessian: the second
                derivatives too; bound: an upper bound on ``|u|`` over the array, or ``None`` (unknown): a model
                may skip its overflow guard where the bound shows it idle.

        Returns:
            ``(s_d, s_dd, s_e, s_de, s_ee)``, each `(R, P)` in ``u``'s dtype (``None`` where `log_partition`'s
            are): `log_partition`'s entries each divided by its factor (`PartitionScaling.factors`).
        """
        raise NotImplementedError

    def tie_probability_between_equals(self, tie_parameter: float) -> float:
        """P(tie) between two items of equal strength at ``tie_parameter`` (``beta`` / ``nu``)."""
        raise NotImplementedError

    def tie_parameter_for_rate(self, rate: float) -> float:
        """The tie parameter at which P(tie | equal strength) is ``rate`` in (0, 1) (the start value)."""
        raise NotImplementedError

    def tie_parameter(self, eta):
        """``beta`` / ``nu`` from the log-parameter ``eta`` (a float or an array)."""
        return self.offset + np.exp(eta)

    def initial_tie_log(self, initial: float | None, n_ties: float, n: float) -> float:
        """Starting ``eta``: from ``initial`` (``beta`` / ``nu``) or where P(tie | equal) is the observed tie rate.

        Raises:
            ValueError: if ``initial`` is not finite or not above ``offset``.
        """
        if initial is not None:
            value = float(initial)
            if not (math.isfinite(value) and value > self.offset):
                raise ValueError(
                    f"initial_tie_parameter must be finite and > {self.offset:g} for {self.name}, got {initial!r}"
                )
            return min(max(math.log(value - self.offset), self.bounds[0]), self.bounds[1])
        rate = min(max(float(n_ties) / n if n > 0 else 0.0, 1e-3), 0.999)
        return math.log(self.tie_parameter_for_rate(rate) - self.offset)


DEFAULT_TIE_MODEL = "davidson"
"""THE default tie model (``--tie-model``, `emoreward.ranking.fit.FitSpec`): Davidson (1970), a tie half a win and
half a loss. EmoPrefer's appendix-F model lowers both models on a tie, as a loss would; it stays in the report as the
paper's column."""

MODELS: dict[str, PairModel] = {}
"""Every pairwise model by name, plain Bradley-Terry included."""
TIE_MODELS: dict[str, PairModel] = {}
"""The tie models by name, in listing order: what ``--tie-model`` offers and the fits accept."""


def register(model: PairModel) -> PairModel:
    """Add ``model`` to `MODELS` (and `TIE_MODELS` when it has a tie parameter); returns it.

    Raises:
        ValueError: if another model already has its name.
    """
    if model.name in MODELS and MODELS[model.name] is not model:
        raise ValueError(f"a pairwise model named {model.name!r} is already registered")
    MODELS[model.name] = model
    ranked = sorted([*TIE_MODELS.values(), model] if model.has_tie else TIE_MODELS.values(), key=lambda x: x.order)
    TIE_MODELS.clear()
    TIE_MODELS.update({x.name: x for x in ranked})
    return model


def unregister(name: str) -> None:
    """Remove the model ``name`` (a no-op when absent)."""
    MODELS.pop(name, None)
    TIE_MODELS.pop(name, None)


def get_model(name: str) -> PairModel:
    """The model called ``name`` (``"bradley-terry"`` or a tie model).

    Raises:
        ValueError: for an unknown name (the message lists the tie models).
    """
    if name not in MODELS:
        raise ValueError(f"unknown tie model {name!r}; choose one of {tuple(TIE_MODELS)}")
    return MODELS[name]


def softplus_expit(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``softplus(x) = log(1 + e^x)`` and ``expit(x) = 1 / (1 + e^-x)``, stably, from one ``exp(-|x|)``."""
    e = np.exp(-np.abs(x))
    return np.maximum(x, 0.0) + np.log1p(e), np.where(x >= 0, 1.0, e) / (1.0 + e)


def expit_from_negative(negative: np.ndarray) -> np.ndarray:
    """``expit(x) = 1 / (1 + exp(-x))`` from an array holding ``-x``, overwritten (three array operations); an
    ``exp`` that overflows gives the limit 0 exactly (not reported). Good to a unit in the last place in absolute
    terms, not relative ones near 0 (`softplus_expit` is)."""
    with np.errstate(over="ignore"):
        np.exp(negative, out=negative)
    negative += 1.0
    return np.reciprocal(negative, out=negative)


def softmax3(z0, z1, z2) -> tuple[np.ndarray, ...]:
    """Probabilities of three logits and their log-sum-exp (max shift, three ``exp``, one ``log``)."""
    top = np.maximum(np.maximum(z0, z1), z2)
    e0, e1, e2 = np.exp(z0 - top), np.exp(z1 - top), np.exp(z2 - top)
    total = e0 + e1 + e2
    return e0 / total, e1 / total, e2 / total, top + np.log(total)


for _module in pkgutil.iter_modules(__path__):
    _model = getattr(importlib.import_module(f"{__name__}.{_module.name}"), "MODEL", None)
    if isinstance(_model, PairModel):
        register(_model)

__all__ = [
    "DEFAULT_TIE_MODEL",
    "MODELS",
    "TIE_LOG_BOUNDS",
    "TIE_MODELS",
    "PairModel",
    "PartitionScaling",
    "get_model",
    "register",
    "unregister",
]

"""One fit specification (`FitSpec`): the pair model object, the prior and the description covariates, resolved once
at the edge (the command's options, the API's arguments) and carried as one value to every fit, bootstrap, effect
and report. The length-controlled fit is the same fit with covariates. See docs/ranking.md ("Fit specification").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from emoreward.ranking.batched import DEFAULT_PRIOR_VARIANCE, prior_precision
from emoreward.ranking.length_control import COVARIATES, DEFAULT_COVARIATES
from emoreward.ranking.tie_models import DEFAULT_TIE_MODEL, PairModel, get_model


def _default_model() -> PairModel:
    return get_model(DEFAULT_TIE_MODEL)


@dataclass(frozen=True)
class FitSpec:
    """What every fit of a ranking computes.

    Attributes:
        model (`PairModel`): the tie model object that ranks (`emoreward.ranking.tie_models.TIE_MODELS`; default
            ``DEFAULT_TIE_MODEL``): the count-table fit, its bootstrap, the length-controlled fit, the P(tie) of the
            report and the separation checks all read it.
        prior_variance (`float` or `None`): variance of the Gaussian prior on the log-strengths (``None``: none).
        covariates (`tuple[str, ...]`): the length-controlled fit's description covariates (names in
            `emoreward.ranking.length_control.COVARIATES`); empty: no length-controlled fit.

    Raises:
        ValueError: a model that is not a registered tie model, a non-positive or non-finite ``prior_variance``,
            an unknown covariate.
    """

    model: PairModel = field(default_factory=_default_model)
    prior_variance: float | None = DEFAULT_PRIOR_VARIANCE
    covariates: tuple[str, ...] = DEFAULT_COVARIATES

    def __post_init__(self) -> None:
        if not isinstance(self.model, PairModel) or not self.model.has_tie:
            raise ValueError(f"FitSpec.model must be a tie model object (TIE_MODELS), got {self.model!r}")
        prior_precision(self.prior_variance)
        unknown = [c for c in self.covariates if c not in COVARIATES]
        if unknown:
            raise ValueError(f"unknown covariate(s) {unknown}; available: {sorted(COVARIATES)}")
        object.__setattr__(self, "covariates", tuple(self.covariates))

    @property
    def name(self) -> str:
        """The tie model's name (``--tie-model``), as reports show it."""
        return self.model.name

    @classmethod
    def resolve(
        cls,
        tie_model: str | PairModel | None = None,
        prior_variance: float | None = DEFAULT_PRIOR_VARIANCE,
        covariates: Sequence[str] = DEFAULT_COVARIATES,
    ) -> FitSpec:
        """THE resolution of a tie model's name (``--tie-model``, an API argument) into its object, once, at the edge.

        Args:
            tie_model (`str`, `PairModel` or `None`): a name in `TIE_MODELS`, the object, or ``None`` for
                ``DEFAULT_TIE_MODEL``.
            prior_variance, covariates: as the attributes.

        Raises:
            ValueError: an unknown name (the message lists the tie models), or as the class.
        """
        model = tie_model if isinstance(tie_model, PairModel) else get_model(tie_model or DEFAULT_TIE_MODEL)
        return cls(model, prior_variance, tuple(covariates))


__all__ = ["FitSpec"]

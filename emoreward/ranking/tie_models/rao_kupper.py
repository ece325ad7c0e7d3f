"""Rao-Kupper's tie model (Rao & Kupper 1967): ``P(i>j) = theta_i / (theta_i + nu theta_j)``,
``P(tie) = (nu^2 - 1) P(i>j) P(j>i)``, ``nu = 1 + exp(eta) >= 1``. See docs/ranking.md."""

from __future__ import annotations

import math

import numpy as np

from emoreward.ranking.tie_models import PairModel, expit_from_negative, softplus_expit


_LOG2 = math.log(2.0)


def _expit(x):
    return softplus_expit(x)[1]


class RaoKupper(PairModel):
    """In logistic form with ``a = log nu = softplus(eta)``: ``log P(i>j) = -softplus(a - d)``, ``log P(j>i) =
    -softplus(a + d)``, ``log P(tie) = log(nu^2 - 1) + log P(i>j) + log P(j>i)``."""

    name = "rao-kupper"
    offset = 1.0
    order = 1
    difference_only = True

    @staticmethod
    def log_probabilities(d: np.ndarray, log_nu: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``log P(i>j)``, ``log P(j>i)``, ``log P(tie)`` at score differences ``d`` and ``log nu > 0``."""
        log_pa = -softplus_expit(log_nu - d)[0]
        log_pb = -softplus_expit(log_nu + d)[0]
        return log_pa, log_pb, math.log(math.expm1(2.0 * log_nu)) + log_pa + log_pb

    def terms(self, s_i, s_j, eta, w, lo, t, derivatives: bool):
        d = s_i - s_j
        a = softplus_expit(eta)[0]
        log_nu2m1 = eta[:, 0] + np.logaddexp(_LOG2, eta[:, 0])  # log(nu^2 - 1)
        wt, lt = w + t, lo + t
        sp_a, sa = softplus_expit(a - d)
        sp_b, sb = softplus_expit(a + d)
        nll = (wt * sp_a + lt * sp_b).sum(axis=1) - t.sum(axis=1) * log_nu2m1
        if not derivatives:
            return nll, None, None
        da, db = sa * (1 - sa), sb * (1 - sb)
        fd, fa = lt * sb - wt * sa, wt * sa + lt * sb
        fdd, fda = wt * da + lt * db, lt * db - wt * da
        q = _expit(eta)
        g1 = 1.0 + _expit(eta - _LOG2)
        g2 = _expit(eta - _LOG2) * (1.0 - _expit(eta - _LOG2))
        fe = fa * q - t * g1  # the -T log(nu^2 - 1) term, spread over the pairs by their ties
        fee = fdd * q**2 + fa * q * (1 - q) - t * g2
        grad = {"i": fd, "j": -fd, "e": fe}
        hess = {"ii": fdd, "jj": fdd, "ij": -fdd, "ie": fda * q, "je": -fda * q, "ee": fee}
        return nll, grad, hess

    def difference_terms(self, d, eta, w, lo, t, hessian: bool = True):
        a = softplus_expit(eta)[0]
        wt, lt = w + t, lo + t
        sa = expit_from_negative(d - a)  # expit(a - d)
        sb = expit_from_negative(np.subtract(-a, d))  # expit(a + d)
        da = sa * (1.0 - sa) if hessian else None
        db = sb * (1.0 - sb) if hessian else None
        sa *= wt
        sb *= lt
        q = _expit(eta)
        half = _expit(eta - _LOG2)
        fa = sa + sb
        fa *= q
        g_e = fa - t * (1.0 + half)
        g_d = np.subtract(sb, sa, out=sb)
        if not hessian:
            return g_d, None, g_e, None, None
        da *= wt
        db *= lt
        h_dd = da + db
        h_de = np.subtract(db, da, out=db)
        h_de *= q
        h_ee = h_dd * q**2
        fa *= 1 - q
        h_ee += fa
        h_ee -= t * (half * (1.0 - half))
        return g_d, h_dd, g_e, h_de, h_ee

    def tie_probability_between_equals(self, tie_parameter: float) -> float:
        return (tie_parameter - 1.0) / (tie_parameter + 1.0)

    def tie_parameter_for_rate(self, rate: float) -> float:
        return (1 + rate) / (1 - rate)


MODEL = RaoKupper()

"""Davidson's tie model (Davidson 1970): P(i>j), P(j>i), P(tie) proportional to ``theta_i``, ``theta_j`` and
``nu sqrt(theta_i theta_j)``, ``nu = exp(eta)``. See docs/ranking.md."""

from __future__ import annotations

import numpy as np

from emoreward.ranking.tie_models import PairModel, PartitionScaling, softmax3


_SATURATED = {np.float32: 40.0, np.float64: 300.0}  # |d/2| - max(eta, 0) beyond which p0, p1 are exactly 0 or 1


class Davidson(PairModel):
    """Dividing by ``sqrt(theta_i theta_j)`` leaves a three-way logit with logits ``d/2``, ``-d/2``, ``eta``
    (``d = s_i - s_j``): a tie counts as half a win and half a loss."""

    name = "davidson"
    order = 2
    difference_only = True
    exponential_family = True  # A = log(e^(d/2) + e^(-d/2) + e^eta), T_d = (w - lo) / 2, T_e = t
    partition_scaling = PartitionScaling(0.5, (0.5, 0.25, 1.0, -0.5, 1.0), (0, 0, 1, 1, 1))

    def terms(self, s_i, s_j, eta, w, lo, t, derivatives: bool):
        n = w + lo + t
        z0 = 0.5 * (s_i - s_j)
        p0, p1, p2, lse = softmax3(z0, -z0, np.broadcast_to(eta, z0.shape))
        nll = (n * lse - (w - lo) * z0).sum(axis=1) - eta[:, 0] * t.sum(axis=1)
        if not derivatives:
            return nll, None, None
        gd = 0.5 * ((n * p0 - w) - (n * p1 - lo))
        hdd = 0.25 * n * (p0 + p1 - (p0 - p1) ** 2)
        hde = 0.5 * n * p2 * (p1 - p0)
        grad = {"i": gd, "j": -gd, "e": n * p2 - t}
        hess = {"ii": hdd, "jj": hdd, "ij": -hdd, "ie": hde, "je": -hde, "ee": n * p2 * (1 - p2)}
        return nll, grad, hess

    def difference_terms(self, d, eta, w, lo, t, hessian: bool = True):
        # relative to the larger win logit |d|/2: the other win exp(-|d|) = h^2, the tie nu h, h = exp(-|d|/2); p0 - p1
        # takes d's sign. Gradient only: n / (1 + h^2 + nu h) once, so that n p2 and n (p0 - p1) cost a product each
        tie = np.abs(d)
        tie *= -0.5
        np.exp(tie, out=tie)
        e = tie * tie
        tie *= np.exp(eta)
        den = 1.0 + e
        den += tie
        n = w + lo + t
        if not hessian:
            scale = np.divide(n, den, out=den)
            tie *= scale
            tie -= t
            np.subtract(1.0, e, out=e)
            e *= scale
            np.copysign(e, d, out=e)
            e -= w - lo
            e *= 0.5
            return e, None, tie, None, None
        inv = np.reciprocal(den, out=den)
        wins = 1.0 + e
        wins *= inv  # p0 + p1
        np.subtract(1.0, e, out=e)
        e *= inv
        diff = np.copysign(e, d, out=e)  # p0 - p1
        tie *= inv
        tie *= n  # n p2
        h_ee = tie * wins
        h_de = tie * diff
        h_de *= -0.5
        tie -= t
        h_dd = diff * diff
        np.subtract(wins, h_dd, out=h_dd)
        h_dd *= 0.25 * n
        diff *= n
        diff -= w - lo
        diff *= 0.5
        return diff, h_dd, tie, h_de, h_ee

    def natural_statistics(self, w, lo, t):
        return w + lo + t, 0.5 * (w - lo), t

    def scaled_log_partition(self, u, eta, hessian: bool = True, bound: float | None = None):
        # from e = exp(u), u = d/2, r = 1 / (e + 1/e + nu): p0 - p1 = (e - 1/e) r and P(tie) = nu r, so A's
        # derivatives are (p0 - p1) / 2, (1 - (p0 - p1)^2 - nu r) / 4, nu r, -nu (p0 - p1) r / 2 and nu r (1 - nu r):
        # the factors 1/2, 1/4 and nu go to the sums (partition_scaling); |u| clipped where the probabilities are 0
        # or 1 to the working precision (no overflow), unless the bound shows no |u| gets there
        nu = np.exp(eta).astype(u.dtype)
        if bound is None:
            bound = max(float(u.max()), -float(u.min())) if u.size else 0.0
        if bound > _SATURATED[u.dtype.type]:
            top = _SATURATED[u.dtype.type] + max(float(np.max(eta)), 0.0)
            np.clip(u, -top, top, out=u)
        e = np.exp(u, out=u)
        inv = np.reciprocal(e)
        den = e + inv
        den += nu
        r = np.reciprocal(den, out=den)
        diff = np.subtract(e, inv, out=e)
        diff *= r  # p0 - p1
        if not hessian:
            return diff, None, r, None, None
        rest = np.multiply(r, -nu, out=inv)
        rest += 1.0  # 1 - P(tie)
        h_dd = diff * diff
        np.subtract(rest, h_dd, out=h_dd)
        h_de = diff * r
        h_ee = np.multiply(rest, r, out=rest)
        return diff, h_dd, r, h_de, h_ee

    def tie_probability_between_equals(self, tie_parameter: float) -> float:
        return tie_parameter / (2.0 + tie_parameter)

    def tie_parameter_for_rate(self, rate: float) -> float:
        return 2 * rate / (1 - rate)


MODEL = Davidson()

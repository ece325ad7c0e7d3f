"""Davidson's tie model (Davidson 1970): P(i>j), P(j>i), P(tie) proportional to ``theta_i``, ``theta_j`` and
``nu sqrt(theta_i theta_j)``, ``nu = exp(eta)``. See docs/ranking.md."""

from __future__ import annotations

import numpy as np

from emoreward.ranking.tie_models import PairModel, softmax3


_SATURATED = {np.float32: 40.0, np.float64: 300.0}  # |d/2| - max(eta, 0) beyond which p0, p1 are exactly 0 or 1


class Davidson(PairModel):
    """Dividing by ``sqrt(theta_i theta_j)`` leaves a three-way logit with logits ``d/2``, ``-d/2``, ``eta``
    (``d = s_i - s_j``): a tie counts as half a win and half a loss."""

    name = "davidson"
    order = 2
    difference_only = True
    exponential_family = True  # A = log(e^(d/2) + e^(-d/2) + e^eta), T_d = (w - lo) / 2, T_e = t

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

    def log_partition(self, d, eta, hessian: bool = True):
        # from e = exp(d/2): p0 - p1 = (e - 1/e) r, p2 = nu r, r = 1 / (e + 1/e + nu), in few array operations (the
        # pass's hot loop); |d/2| clipped where the probabilities are 0 or 1 to the working precision (no overflow)
        nu = np.exp(eta).astype(d.dtype)
        half = np.multiply(d, 0.5)
        top = _SATURATED[half.dtype.type] + max(float(np.max(eta)), 0.0)
        if half.size and (half.max() > top or half.min() < -top):
            np.clip(half, -top, top, out=half)
        e = np.exp(half, out=half)
        inv = np.reciprocal(e)
        den = e + inv
        den += nu
        r = np.reciprocal(den, out=den)
        diff = np.subtract(e, inv, out=e)
        diff *= r  # p0 - p1
        tie = np.multiply(r, nu, out=inv)  # p2
        if not hessian:
            diff *= 0.5
            return diff, None, tie, None, None
        h_dd = np.multiply(diff, diff, out=r)
        h_dd += tie
        np.subtract(1.0, h_dd, out=h_dd)
        h_dd *= 0.25  # (p0 + p1 - (p0 - p1)^2) / 4
        h_de = tie * diff
        h_de *= -0.5
        h_ee = 1.0 - tie
        h_ee *= tie
        diff *= 0.5
        return diff, h_dd, tie, h_de, h_ee

    def tie_probability_between_equals(self, tie_parameter: float) -> float:
        return tie_parameter / (2.0 + tie_parameter)

    def tie_parameter_for_rate(self, rate: float) -> float:
        return 2 * rate / (1 - rate)


MODEL = Davidson()

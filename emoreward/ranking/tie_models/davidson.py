"""Davidson's tie model (Davidson 1970): P(i>j), P(j>i), P(tie) proportional to ``theta_i``, ``theta_j`` and
``nu sqrt(theta_i theta_j)``, ``nu = exp(eta)``. See docs/ranking.md."""

from __future__ import annotations

import numpy as np

from emoreward.ranking.tie_models import PairModel, softmax3


class Davidson(PairModel):
    """Dividing by ``sqrt(theta_i theta_j)`` leaves a three-way logit with logits ``d/2``, ``-d/2``, ``eta``
    (``d = s_i - s_j``): a tie counts as half a win and half a loss."""

    name = "davidson"
    order = 2

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

    def tie_probability_between_equals(self, tie_parameter: float) -> float:
        return tie_parameter / (2.0 + tie_parameter)

    def tie_parameter_for_rate(self, rate: float) -> float:
        return 2 * rate / (1 - rate)


MODEL = Davidson()

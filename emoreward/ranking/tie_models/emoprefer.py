"""EmoPrefer's tie model (EmoPrefer, appendix F, eq. 2-3): P(i>j), P(j>i), P(tie) proportional to ``theta_i``,
``theta_j`` and ``beta = exp(eta)``. See docs/ranking.md."""

from __future__ import annotations

import numpy as np

from emoreward.ranking.tie_models import PairModel, softmax3


class EmoPrefer(PairModel):
    """A three-way logit with logits ``s_i``, ``s_j``, ``eta``; ``beta`` has the units of ``theta`` (it shifts with
    the scores) and is reported on the centred scale, so P(tie) between two average items is ``beta / (2 + beta)``."""

    name = "emoprefer"
    shifts_with_scores = True
    order = 0
    # each verdict is a choice among i, j and the tie level: a win puts the winner above both, a tie the level above
    # both items (a tie bounds each score from above only)
    orders = {0: (("i", "j"), ("i", "0")), 1: (("j", "i"), ("j", "0")), 2: (("0", "i"), ("0", "j"))}

    def terms(self, s_i, s_j, eta, w, lo, t, derivatives: bool):
        n = w + lo + t
        p0, p1, p2, lse = softmax3(s_i, s_j, np.broadcast_to(eta, s_i.shape))
        nll = (n * lse - w * s_i - lo * s_j).sum(axis=1) - eta[:, 0] * t.sum(axis=1)
        if not derivatives:
            return nll, None, None
        grad = {"i": n * p0 - w, "j": n * p1 - lo, "e": n * p2 - t}
        hess = {
            "ii": n * p0 * (1 - p0),
            "jj": n * p1 * (1 - p1),
            "ij": -n * p0 * p1,
            "ie": -n * p0 * p2,
            "je": -n * p1 * p2,
            "ee": n * p2 * (1 - p2),
        }
        return nll, grad, hess

    def tie_probability_between_equals(self, tie_parameter: float) -> float:
        return tie_parameter / (2.0 + tie_parameter)

    def tie_parameter_for_rate(self, rate: float) -> float:
        return 2 * rate / (1 - rate)


MODEL = EmoPrefer()

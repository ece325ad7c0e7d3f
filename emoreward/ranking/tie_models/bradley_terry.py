"""Plain Bradley-Terry: ``P(i beats j) = theta_i / (theta_i + theta_j)``; ties are not modelled (EMER-Ranker,
section 2, eq. 2-4; Hunter 2004). See docs/ranking.md."""

from __future__ import annotations

import numpy as np

from emoreward.ranking.tie_models import PairModel, expit_from_negative, softplus_expit


class BradleyTerry(PairModel):
    """With ``d = s_i - s_j``: ``nll = (w + lo) softplus(d) - w d`` per pair (``t`` is ignored)."""

    name = "bradley-terry"
    has_tie = False
    orders = {0: (("i", "j"),), 1: (("j", "i"),), 2: ()}  # ties are not in the likelihood
    difference_only = True
    exponential_family = True  # A = softplus(d), n = w + lo, T_d = w

    def terms(self, s_i, s_j, eta, w, lo, t, derivatives: bool):
        d = s_i - s_j
        n = w + lo
        sp, sig = softplus_expit(d)
        nll = (n * sp - w * d).sum(axis=1)
        if not derivatives:
            return nll, None, None
        gd, hd = n * sig - w, n * sig * (1.0 - sig)
        return nll, {"i": gd, "j": -gd}, {"ii": hd, "jj": hd, "ij": -hd}

    def difference_terms(self, d, eta, w, lo, t, hessian: bool = True):
        n = w + lo
        sig = expit_from_negative(np.negative(d))
        slope = sig * (1.0 - sig) * n if hessian else None
        sig *= n
        sig -= w
        return sig, slope, None, None, None

    def natural_statistics(self, w, lo, t):
        return w + lo, w, None

    def scaled_log_partition(self, u, eta, hessian: bool = True, bound: float | None = None):
        sig = expit_from_negative(np.negative(u, out=u))
        return sig, sig * (1.0 - sig) if hessian else None, None, None, None


MODEL = BradleyTerry()

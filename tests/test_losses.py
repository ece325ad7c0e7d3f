"""Tie-aware likelihoods: probabilities sum to one and match the closed forms."""

from __future__ import annotations

import math

import pytest
import torch

from emoreward.training.losses import bradley_terry_nll, davidson_nll, pairwise_nll, rao_kupper_nll


D = torch.tensor([-2.0, -0.3, 0.0, 0.7, 3.0], dtype=torch.float64)


def probs(nll_fn, d, param):
    win = torch.exp(-nll_fn(d, torch.zeros_like(d), param))
    lose = torch.exp(-nll_fn(-d, torch.zeros_like(d), param))
    tie = torch.exp(-nll_fn(d, torch.ones_like(d), param))
    return win, lose, tie


@pytest.mark.parametrize("fn, param", [(rao_kupper_nll, 0.8), (davidson_nll, 1.5)])
def test_outcome_probabilities_sum_to_one(fn, param):
    win, lose, tie = probs(fn, D, param)
    torch.testing.assert_close(win + lose + tie, torch.ones_like(D))
    torch.testing.assert_close(tie, torch.exp(-fn(-D, torch.ones_like(D), param)))  # tie is symmetric


def test_rao_kupper_closed_form():
    eps, d = 0.8, 0.7
    theta, pi_i, pi_j = math.exp(eps), math.exp(d), 1.0
    tie = (theta**2 - 1) * pi_i * pi_j / ((pi_i + theta * pi_j) * (pi_j + theta * pi_i))
    got = torch.exp(-rao_kupper_nll(torch.tensor([d]), torch.tensor([1.0]), eps)).item()
    assert got == pytest.approx(tie)
    assert torch.exp(-rao_kupper_nll(torch.tensor([d]), torch.tensor([0.0]), eps)).item() == pytest.approx(
        pi_i / (pi_i + theta * pi_j)
    )


def test_davidson_closed_form_and_bt_limit():
    nu, d = 1.5, 0.7
    pi_i, pi_j = math.exp(d), 1.0
    z = pi_i + pi_j + nu * math.sqrt(pi_i * pi_j)
    got_tie = torch.exp(-davidson_nll(torch.tensor([d]), torch.tensor([1.0]), nu)).item()
    assert got_tie == pytest.approx(nu * math.sqrt(pi_i * pi_j) / z)
    assert bradley_terry_nll(torch.tensor([0.0])).item() == pytest.approx(math.log(2))
    with pytest.raises(ValueError, match="unknown tie mode"):
        pairwise_nll(D, None, "thurstone", 1.0)

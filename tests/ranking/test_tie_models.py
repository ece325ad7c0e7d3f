"""Every pair model's fit (the one Newton driver) against the L-BFGS-B oracle at 1e-6, and a new tie model added in
one file: registered, fitted, bootstrapped and ranked by the API and by `emoreward rank --tie-model` with no other
change."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from oracle import fit_bradley_terry as oracle_bt
from oracle import fit_bradley_terry_ties as oracle_ties

from emoreward.ranking.bootstrap import bootstrap_ci
from emoreward.ranking.bradley_terry import fit_bradley_terry, fit_bradley_terry_ties
from emoreward.ranking.counts import PairwiseCounts
from emoreward.ranking.effects import tie_probability_between_equals
from emoreward.ranking.records import PairwiseRecord
from emoreward.ranking.tie_models import MODELS, TIE_MODELS, PairModel, register, softmax3, unregister


def table(kind: str, m: int = 6, seed: int = 0) -> PairwiseCounts:
    rng = np.random.default_rng(seed)
    wins = rng.integers(1, 6, (m, m)).astype(float)
    ties = rng.integers(0, 4, (m, m)).astype(float)
    ties = np.triu(ties, 1) + np.triu(ties, 1).T
    if kind == "no ties":
        ties[:] = 0.0
    if kind == "all ties":
        wins[:] = 0.0
        ties = np.ones((m, m))
    if kind == "disconnected":  # two groups never compared with each other (the prior bounds the fit)
        half = m // 2
        for block in (wins, ties):
            block[:half, half:] = 0.0
            block[half:, :half] = 0.0
    if kind == "sparse":  # a chain: each item compared with its neighbours only
        keep = np.abs(np.subtract.outer(np.arange(m), np.arange(m))) == 1
        wins, ties = wins * keep, ties * keep
    np.fill_diagonal(wins, 0.0)
    np.fill_diagonal(ties, 0.0)
    return PairwiseCounts([f"m{k}" for k in range(m)], wins, ties)


CASES = [
    ("dense", 10.0),
    ("dense", None),
    ("no ties", 10.0),
    ("all ties", 10.0),
    ("disconnected", 10.0),
    ("sparse", 1.0),
    ("sparse", None),
]


def assert_agree(fit, ref, at_bound=False):
    """Scores, log-likelihood and P(tie | equal strength) at 1e-6; the tie parameter itself too, unless the optimum
    is at its upper bound (all ties: the oracle stops short of the bound on a flat objective)."""
    np.testing.assert_allclose(fit.scores, ref.scores, atol=1e-6)
    np.testing.assert_allclose(fit.log_likelihood, ref.log_likelihood, atol=1e-6, rtol=1e-9)
    if ref.tie_parameter is not None:
        p_fit, p_ref = (tie_probability_between_equals(r.model, r.tie_parameter) for r in (fit, ref))
        np.testing.assert_allclose(p_fit, p_ref, atol=1e-6)
        if not at_bound:
            np.testing.assert_allclose(fit.tie_parameter, ref.tie_parameter, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize(("kind", "prior"), CASES)
@pytest.mark.parametrize("model", list(TIE_MODELS))
def test_every_tie_model_matches_the_oracle(model, kind, prior):
    counts = table(kind, seed=len(kind))
    warn = "warn" if kind == "disconnected" else "error"
    with pytest.warns(UserWarning) if kind == "disconnected" else _nothing():
        fit = fit_bradley_terry_ties(counts, model, prior_variance=prior, on_disconnected=warn)
    with pytest.warns(UserWarning) if kind == "disconnected" else _nothing():
        ref = oracle_ties(counts, model, prior_variance=prior, on_disconnected=warn)
    assert_agree(fit, ref, at_bound=kind == "all ties")


@pytest.mark.parametrize(("kind", "prior"), [c for c in CASES if c[0] != "all ties"])
@pytest.mark.parametrize("ties", ["drop", "half"])
def test_bradley_terry_matches_the_oracle(kind, prior, ties):
    counts = table(kind, seed=len(kind))
    warn = "warn" if kind == "disconnected" else "error"
    with pytest.warns(UserWarning) if kind == "disconnected" else _nothing():
        fit = fit_bradley_terry(counts, prior, ties=ties, on_disconnected=warn)
    with pytest.warns(UserWarning) if kind == "disconnected" else _nothing():
        ref = oracle_bt(counts, prior, ties=ties, on_disconnected=warn)
    assert_agree(fit, ref)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class SquaredDavidson(PairModel):
    """A toy tie model, the whole of it: Davidson's on ``theta^2`` (logits ``d``, ``-d``, ``eta``). Without a
    prior its scores are Davidson's halved, with the same ``nu``."""

    name = "toy-squared-davidson"

    def terms(self, s_i, s_j, eta, w, lo, t, derivatives):
        n = w + lo + t
        d = s_i - s_j
        p0, p1, p2, lse = softmax3(d, -d, np.broadcast_to(eta, d.shape))
        nll = (n * lse - (w - lo) * d).sum(axis=1) - eta[:, 0] * t.sum(axis=1)
        if not derivatives:
            return nll, None, None
        gd = (n * p0 - w) - (n * p1 - lo)
        hdd = n * (p0 + p1 - (p0 - p1) ** 2)
        hde = n * p2 * (p1 - p0)
        grad = {"i": gd, "j": -gd, "e": n * p2 - t}
        return nll, grad, {"ii": hdd, "jj": hdd, "ij": -hdd, "ie": hde, "je": -hde, "ee": n * p2 * (1 - p2)}

    def tie_probability_between_equals(self, tie_parameter):
        return tie_parameter / (2.0 + tie_parameter)

    def tie_parameter_for_rate(self, rate):
        return 2 * rate / (1 - rate)


@pytest.fixture
def toy():
    model = register(SquaredDavidson())
    try:
        yield model.name
    finally:
        unregister(model.name)


def test_a_new_tie_model_is_one_object_registered(toy):
    assert toy in TIE_MODELS
    counts = table("dense", seed=3)
    fit = fit_bradley_terry_ties(counts, toy, prior_variance=None)
    davidson = fit_bradley_terry_ties(counts, "davidson", prior_variance=None)
    np.testing.assert_allclose(fit.scores, davidson.scores / 2, atol=1e-8)
    np.testing.assert_allclose(fit.tie_parameter, davidson.tie_parameter, rtol=1e-8)
    assert tie_probability_between_equals(toy, 1.0) == pytest.approx(1 / 3)
    # the bootstrap fits every resample with the same driver: the intervals are Davidson's halved
    rng = np.random.default_rng(4)
    items = counts.items
    records = [
        PairwiseRecord(items[a], items[b], str(rng.choice(["1", "2", "tie"])), sample=f"s{k % 40}")
        for k, (a, b) in enumerate(zip(rng.integers(0, 6, 600), rng.integers(0, 6, 600)))
        if a != b
    ]
    runs = [
        bootstrap_ci(records, functools.partial(fit_bradley_terry_ties, tie_model=name, prior_variance=None), 50)
        for name in (toy, "davidson")
    ]
    np.testing.assert_allclose(runs[0].lower, runs[1].lower / 2, atol=1e-7)
    np.testing.assert_allclose(runs[0].upper, runs[1].upper / 2, atol=1e-7)


def test_the_command_line_offers_every_registered_tie_model(toy):
    import argparse

    from emoreward.cli.rank import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    choices = next(a.choices for a in parser._actions if a.dest == "tie_model")
    assert list(choices) == list(TIE_MODELS) and toy in choices


@pytest.mark.parametrize("prior", [10.0, None])
@pytest.mark.parametrize("covariates", [1, 2])
@pytest.mark.parametrize("model", ["bradley-terry", *TIE_MODELS])
def test_every_pair_model_length_controlled_fit_matches_the_oracle(model, covariates, prior):
    """The length-controlled fit under every pair model (its one objective, written once in `PairModel.terms`)
    against the L-BFGS-B oracle's own likelihood at 1e-6: scores, coefficients, tie parameter, log-likelihood."""
    import warnings

    from oracle import fit_length_controlled as oracle_controlled

    from emoreward.ranking.counts import encode_records
    from emoreward.ranking.length_control import fit_length_controlled
    from emoreward.ranking.tie_models import get_model

    rng = np.random.default_rng(7)
    items = [f"m{k}" for k in range(5)]
    quality = rng.normal(0, 1, 5)
    records, features = [], {}
    for s in range(30):
        values = rng.normal(4.0, 0.5, (5, covariates))
        features.update({(f"s{s}", name): values[k] for k, name in enumerate(items)})
        for i in range(5):
            for j in range(i + 1, 5):
                u = quality[i] - quality[j] + 0.8 * (values[i, 0] - values[j, 0])
                p = np.array([np.exp(u / 2), np.exp(-u / 2), 0.8])
                outcome = str(rng.choice(["1", "2", "tie"], p=p / p.sum()))
                records.append(PairwiseRecord(items[i], items[j], outcome, sample=f"s{s}"))
    names = [f"c{k}" for k in range(covariates)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        fit = fit_length_controlled(records, features, names, get_model(model), items, prior, n_boot=1)
    encoded = encode_records(records, items)
    raw = np.array([features[r.sample, r.item_a] - features[r.sample, r.item_b] for r in records])
    z = raw / np.sqrt(np.mean(raw**2, axis=0))  # the scale: RMS over every record (Bradley-Terry's ties included)
    ref = oracle_controlled(z, encoded.a, encoded.b, encoded.outcome, len(items), model, prior)
    np.testing.assert_allclose(fit.scores, ref["scores"], atol=1e-6)
    np.testing.assert_allclose(fit.coefficients, ref["coefficients"], atol=1e-6)
    np.testing.assert_allclose(fit.log_likelihood, ref["log_likelihood"], atol=1e-6, rtol=1e-9)
    if ref["tie_parameter"] is not None:
        np.testing.assert_allclose(fit.tie_parameter, ref["tie_parameter"], rtol=1e-6)
    else:
        assert fit.tie_parameter is None


def test_a_new_tie_model_ranks_through_the_api_and_the_command(toy, tiny_rm_dir, tmp_path, capsys):
    """The toy, registered above and nowhere else, ranks a table with a reward model: through `rank` (its scores
    Davidson's halved without a prior, the same tie parameter) and through `emoreward rank --tie-model` (the API's
    report, the toy named as the model that ranks)."""
    import json

    from relations._inputs import assert_same_numbers
    from test_rank_cli import write_table

    from emoreward.cli.main import main
    from emoreward.data.tables import load_description_table
    from emoreward.models.saved import SavedRewardModel
    from emoreward.ranking.annotators import RewardModelAnnotator
    from emoreward.ranking.api import rank
    from emoreward.ranking.fit import FitSpec

    data = write_table(tmp_path / "t.jsonl")
    table = load_description_table(data)
    annotator = RewardModelAnnotator(SavedRewardModel(tiny_rm_dir))
    common = {"n_boot": 20, "seed": 0, "length_control": False, "progress": False}
    plain = {name: rank(table, annotator, "full", {**common, "fit": FitSpec.resolve(name, prior_variance=None)})
             for name in (toy, "davidson")}  # fmt: skip
    ours, davidson = (plain[name].ties.estimate for name in (toy, "davidson"))
    assert ours.model == toy and 0 < davidson.tie_parameter < 1e3
    np.testing.assert_allclose(ours.scores, davidson.scores / 2, atol=1e-7)
    np.testing.assert_allclose(ours.tie_parameter, davidson.tie_parameter, rtol=1e-7)

    out = tmp_path / "r.json"
    argv = ["--judge", tiny_rm_dir, "--data", data, "--tie-model", toy, "--no-length-control", "--n-boot", "20"]
    assert main(["rank", *map(str, argv), "--no-cache", "--quiet", "--output", str(out)]) == 0, capsys.readouterr().err
    command = json.loads(out.read_text(encoding="utf-8"))
    fresh = RewardModelAnnotator(SavedRewardModel(tiny_rm_dir))  # scores again, as the command with --no-cache
    api = rank(table, fresh, "full", {**common, "fit": FitSpec.resolve(toy)}).to_dict()
    assert command["tie_model"] == toy and command["bradley_terry_ties"]["model"] == toy
    assert_same_numbers(command, api, ignore=[r"^/judge/", r"^/data/", r"^/score_cache/"])


@pytest.mark.parametrize("name", list(MODELS))
def test_difference_terms_are_the_terms_derivatives(name):
    """`PairModel.difference_only` holds (the likelihood unchanged when both scores shift) and the lean
    `difference_terms`, with and without the Hessian, in float64 and float32, equal `terms`' entries and the generic
    default at random points: 1e-10 relative (float32: 1e-5)."""
    model = MODELS[name]
    rng = np.random.default_rng(11)
    s_i, s_j = rng.normal(0, 4, (2, 4, 300))
    eta = rng.uniform(-3, 3, (4, 1)) if model.has_tie else None
    w, lo, t = rng.uniform(0, 3, (3, 4, 300))
    nll, grad, hess = model.terms(s_i, s_j, eta, w, lo, t, True)
    shifted = model.terms(s_i + 1.7, s_j + 1.7, eta, w, lo, t, False)[0]
    if not model.difference_only:
        assert name == "emoprefer" and not np.allclose(shifted, nll)  # the tie level competes with each score
        return
    np.testing.assert_allclose(shifted, nll, rtol=1e-12)
    expected = (grad["i"], hess["ii"], *((grad["e"], hess["ie"], hess["ee"]) if model.has_tie else (None,) * 3))
    for a, b in ((grad["j"], -grad["i"]), (hess["jj"], hess["ii"]), (hess["ij"], -hess["ii"])):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-300)
    if model.has_tie:
        np.testing.assert_allclose(hess["je"], -hess["ie"], rtol=1e-12)
    d = s_i - s_j
    for dtype, rtol in ((np.float64, 1e-10), (np.float32, 1e-5)):
        args = [d, eta, w, lo, t]
        args = [None if v is None else v.astype(dtype) for v in args]
        for got in (model.difference_terms(*args), PairModel.difference_terms(model, *args)):
            for value, ref in zip(got, expected, strict=True):
                assert (value is None) == (ref is None)
                if ref is not None:
                    assert value.dtype == dtype
                    np.testing.assert_allclose(value, ref, rtol=rtol, atol=rtol * np.abs(ref).max())
        gradient_only = model.difference_terms(*args, hessian=False)
        for k in (0, 2):
            if expected[k] is not None:
                np.testing.assert_allclose(
                    gradient_only[k], expected[k], rtol=rtol, atol=rtol * np.abs(expected[k]).max()
                )


@pytest.mark.parametrize("name", list(MODELS))
def test_the_exponential_family_split_is_the_difference_terms(name):
    """`PairModel.exponential_family` holds exactly where a single verdict's Hessian in ``(d, eta)`` is the same
    for every outcome that counts as a trial (the log-likelihood linear in the outcome counts with natural
    parameters linear in ``(d, eta)``: Bradley-Terry, Davidson; not Rao-Kupper, nor EmoPrefer, not
    `difference_only`), and there ``n A' - T`` and ``n A''`` (`log_partition`, `natural_statistics`) equal
    `terms`' entries at random points and counts, saturated ones too: 1e-10 relative (float32: 1e-5, in its
    dtype)."""
    model = MODELS[name]
    if not model.difference_only:
        assert not model.exponential_family
        return
    rng = np.random.default_rng(12)
    d = rng.normal(0, 4, (4, 300))
    eta = rng.uniform(-3, 3, (4, 1)) if model.has_tie else None
    one_hot = np.eye(3)[:, :, None, None] * np.ones((1, 1, 4, 300))
    hessians = [
        np.stack([v for k, v in enumerate(model.difference_terms(d, eta, *o)) if k in (1, 3, 4) and v is not None])
        for o in one_hot
    ]
    trials = [np.abs(h).max() > 0 for h in hessians]  # Bradley-Terry: a tie is no trial
    counted = [h for h, on in zip(hessians, trials) if on]
    linear = all(np.allclose(h, counted[0], rtol=1e-9, atol=1e-12) for h in counted)
    assert linear == model.exponential_family, name
    if not model.exponential_family:
        assert name == "rao-kupper"
        return
    w, lo, t = rng.uniform(0, 3, (3, 4, 300))
    d[:, :6] = [-2000.0, -700.0, -90.0, 90.0, 700.0, 2000.0]  # saturated probabilities, no overflow
    _, grad, hess = model.terms(d, np.zeros_like(d), eta, w, lo, t, True)
    expected = (grad["i"], hess["ii"], *((grad["e"], hess["ie"], hess["ee"]) if model.has_tie else (None,) * 3))
    for dtype, rtol in ((np.float64, 1e-10), (np.float32, 1e-5)):
        n, t_d, t_e = model.natural_statistics(*(v.astype(dtype) for v in (w, lo, t)))
        eta_d = None if eta is None else eta.astype(dtype)
        a_d, a_dd, a_e, a_de, a_ee = model.log_partition(d.astype(dtype), eta_d)
        split = (n * a_d - t_d, n * a_dd, *((n * a_e - t_e, n * a_de, n * a_ee) if model.has_tie else (None,) * 3))
        for value, ref in zip(split, expected, strict=True):
            assert (value is None) == (ref is None)
            if ref is not None:
                assert value.dtype == dtype
                np.testing.assert_allclose(value, ref, rtol=rtol, atol=rtol * np.abs(ref).max())
        gradient_only = model.log_partition(d.astype(dtype), eta_d, hessian=False)
        assert gradient_only[1] is None and gradient_only[3] is None and gradient_only[4] is None
        np.testing.assert_allclose(gradient_only[0], a_d, rtol=1e-6)
        if model.has_tie:
            np.testing.assert_allclose(gradient_only[2], a_e, rtol=1e-6)


class FlaggedSquaredDavidson(SquaredDavidson):
    """The toy declaring itself `difference_only` without a `difference_terms` of its own: the default, from
    `terms`, serves the lean resample passes."""

    name = "toy-squared-davidson-flagged"
    difference_only = True


@pytest.mark.parametrize("toy_model", [SquaredDavidson(), FlaggedSquaredDavidson()], ids=["generic", "default"])
def test_a_new_tie_model_fits_the_length_controlled_resamples(toy_model):
    """A toy tie model's length-controlled resamples, through the generic pass (`difference_only` False) or the
    difference pass with the default `difference_terms`: every resample batched, equal to one at a time, and to
    Davidson's halved (no prior: the toy's scores, coefficient and ``eta`` are Davidson's on ``theta^2``)."""
    from emoreward.ranking.bootstrap import resample_unit_weights
    from emoreward.ranking.length_batched import build_design, damped_newton, fit_resamples

    rng = np.random.default_rng(5)
    items = [f"m{k}" for k in range(4)]
    records = [
        PairwiseRecord(items[a], items[b], str(rng.choice(["1", "2", "tie"])), sample=f"s{k % 30}")
        for k, (a, b) in enumerate(zip(rng.integers(0, 4, 900), rng.integers(0, 4, 900)))
        if a != b
    ]
    covariates = rng.normal(0, 1, (len(records), 2, 1))
    params = {}
    for name, model in (("toy", toy_model), ("davidson", MODELS["davidson"])):
        design, _ = build_design(records, items, covariates, model)
        estimate = damped_newton(design, model, np.ones((1, len(design.x))), 0.0)[0][0]
        weights = resample_unit_weights(design.n_units, 20, 3).astype(float)
        batch, one = (fit_resamples(design, model, estimate, weights, 0.0, batched) for batched in (True, False))
        assert batch.batched.all() and batch.converged.all()
        np.testing.assert_allclose(batch.params, one.params, atol=1e-8)
        params[name] = batch.params
    np.testing.assert_allclose(params["toy"][:, :-1], params["davidson"][:, :-1] / 2, atol=1e-7)
    np.testing.assert_allclose(params["toy"][:, -1], params["davidson"][:, -1], atol=1e-7)

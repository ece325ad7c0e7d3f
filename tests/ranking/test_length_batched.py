"""The length-controlled bootstrap with every resample at once (emoreward.ranking.length_batched) reaches the optimum
of the per-resample damped Newton fits to 1e-6: on random verdict tables with ties (Davidson) and without
(Bradley-Terry), with and without the prior, one or two covariates, absent models, resamples without ties,
separated resamples, and the OV-MERD shape (10 models x 332 samples, the bundled descriptions' lengths). The
compiled (pair, sample) pass equals the records pass (1e-10) on grids, gaps, repeated and swapped verdicts, with
0-2 covariates, on any number of threads; designs without a per-description table take the records pass."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from emoreward.data.tables import bundled_ovmerd_path, load_description_table
from emoreward.ranking.bootstrap import resample_unit_weights
from emoreward.ranking.bradley_terry import prior_precision
from emoreward.ranking.length_batched import build_design, damped_newton, fit_resamples
from emoreward.ranking.length_control import description_features, fit_length_controlled
from emoreward.ranking.records import PairwiseRecord
from emoreward.ranking.tie_models import MODELS


def verdicts(log_length, models, quality, bias=1.0, tie_log=0.0, seed=0, skip=None):
    """Davidson verdicts of every model pair on every sample: logit = quality difference + bias x log-length
    difference; ``skip(sample, i, j)`` leaves a comparison out."""
    rng = np.random.default_rng(seed)
    records = []
    for s in range(log_length.shape[0]):
        for i in range(len(models)):
            for j in range(i + 1, len(models)):
                if skip is not None and skip(s, i, j):
                    continue
                u = quality[i] - quality[j] + bias * (log_length[s, i] - log_length[s, j])
                weights = np.array([math.exp(u / 2), math.exp(-u / 2), math.exp(tie_log)])
                outcome = rng.choice(["1", "2", "tie"], p=weights / weights.sum())
                records.append(PairwiseRecord(models[i], models[j], outcome, sample=f"s{s}"))
    return records


def random_table(n_models=5, n_samples=40, seed=0, covariates=1, **kwargs):
    rng = np.random.default_rng(seed)
    models = [f"m{k}" for k in range(n_models)]
    log_length = 4.0 + rng.normal(0, 0.5, n_models) + rng.normal(0, 0.3, (n_samples, n_models))
    records = verdicts(log_length, models, rng.normal(0, 1, n_models), seed=seed, **kwargs)
    extra = rng.normal(0, 1, (n_samples, n_models))
    features = {
        (f"s{s}", m): np.array([log_length[s, k], extra[s, k]][:covariates])
        for s in range(n_samples)
        for k, m in enumerate(models)
    }
    return records, features, ["log_length", "noise"][:covariates], models


def both_paths(records, features, names, models, model="davidson", prior_variance=10.0, n_boot=40, seed=1):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return [
            fit_length_controlled(
                records, features, names, MODELS[model], models, prior_variance, n_boot, seed=seed, batched=batched
            )
            for batched in (True, False)
        ]


def assert_same(fast, reference, atol=1e-6):
    for field in ("scores", "ci_lower", "ci_upper", "coefficients", "coef_lower", "coef_upper", "std_errors"):
        np.testing.assert_allclose(getattr(fast, field), getattr(reference, field), atol=atol, err_msg=field)
    np.testing.assert_allclose(fast.boot_scores, reference.boot_scores, atol=atol)  # NaN where the reference has it
    np.testing.assert_allclose(fast.boot_coefficients, reference.boot_coefficients, atol=atol)
    assert fast.n_failed == reference.n_failed
    assert fast.warnings == reference.warnings


def resample_fits(records, features, names, models, model="davidson", prior_variance=10.0, n_boot=40, seed=1):
    """`fit_resamples` both ways on the design `fit_length_controlled` builds (the covariates scaled alike)."""
    values = np.array([(features[r.sample, r.item_a], features[r.sample, r.item_b]) for r in records])
    raw = values[:, 0] - values[:, 1]
    pair_model = MODELS[model]
    design, _ = build_design(records, models, values / np.sqrt(np.mean(raw**2, axis=0)), pair_model)
    precision = prior_precision(prior_variance)
    estimate = damped_newton(design, pair_model, np.ones((1, len(design.x))), precision)[0][0]
    weights = resample_unit_weights(design.n_units, n_boot, seed).astype(float)
    return [fit_resamples(design, pair_model, estimate, weights, precision, batched) for batched in (True, False)]


@pytest.mark.parametrize("prior_variance", [10.0, None])
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("covariates", [1, 2])
def test_all_resamples_at_once_equal_one_at_a_time(model, prior_variance, covariates):
    table = random_table(covariates=covariates)
    fast, reference = both_paths(*table, model=model, prior_variance=prior_variance)
    assert fast.identified and fast.n_failed == 0
    assert_same(fast, reference)
    batch, one = resample_fits(*table, model=model, prior_variance=prior_variance)
    assert batch.batched.mean() >= 0.9  # the batched path did the work, the fallback only the odd resample
    assert not one.batched.any()
    np.testing.assert_allclose(batch.params, one.params, atol=1e-6)


def test_a_model_absent_from_some_resamples():
    # m4 is compared on three samples only: resamples that miss them leave it out (NaN), the others agree; the
    # records no longer form a full pair x sample grid, so this is the general (gathered weights) layout
    table = random_table(n_samples=40, skip=lambda s, i, j: j == 4 and s >= 3)
    fast, reference = both_paths(*table, n_boot=60)
    absent = np.isnan(reference.boot_scores[:, 4])
    assert absent.any() and not absent.all()
    assert_same(fast, reference)


def test_resamples_without_ties_keep_the_tie_parameter_at_its_bound():
    # ties only on samples 0 and 1: a resample without both has no ties (log nu at its bound, as the plain fit)
    table = random_table(n_samples=30, tie_log=-30.0, seed=2)
    records = list(table[0])
    records += [PairwiseRecord("m0", "m1", "tie", sample="s0"), PairwiseRecord("m2", "m3", "tie", sample="s1")]
    table = (records, *table[1:])
    batch, one = resample_fits(*table, n_boot=60)
    weights = resample_unit_weights(30, 60, 1)
    no_ties = (weights[:, 0] == 0) & (weights[:, 1] == 0)
    assert no_ties.any()
    assert not batch.batched[no_ties].any()  # fitted by the damped Newton path, exactly as before
    np.testing.assert_allclose(batch.params, one.params, atol=1e-6)
    np.testing.assert_array_equal(batch.converged, one.converged)
    assert_same(*both_paths(*table, n_boot=60))


def test_separated_resamples_fail_alike():
    # the longer description wins every decisive verdict except on samples 0-2: a resample without those is
    # separated (the coefficient diverges), fails in both paths, and is left out of the intervals alike
    rng = np.random.default_rng(3)
    models = [f"m{k}" for k in range(4)]
    n_samples = 30
    log_length = 4.0 + rng.normal(0, 0.5, (n_samples, 4))
    records, features = [], {}
    for s in range(n_samples):
        for k, m in enumerate(models):
            features[f"s{s}", m] = np.array([log_length[s, k]])
        for i in range(4):
            for j in range(i + 1, 4):
                longer_first = log_length[s, i] > log_length[s, j]
                first = longer_first if s >= 3 else not longer_first
                records.append(PairwiseRecord(models[i], models[j], "1" if first else "2", sample=f"s{s}"))
    table = (records, features, ["log_length"], models)
    fast, reference = both_paths(*table, model="bradley-terry", n_boot=60)
    assert fast.identified
    assert reference.n_failed > 0
    assert_same(fast, reference)


def test_ovmerd_shape():
    # the bundled OV-MERD descriptions' lengths (10 models x 332 samples, 14,940 pairs), a length-biased judge
    table = load_description_table(bundled_ovmerd_path())
    names, features = description_features(table.descriptions, ["log_length"])
    models, samples = list(table.models), sorted({s for s, _ in table.descriptions})
    log_length = np.array([[features[s, m][0] for m in models] for s in samples])
    quality = np.linspace(-1.5, 1.5, len(models))
    records = verdicts(log_length, models, quality, bias=1.5, tie_log=1.0, seed=4)
    records = [PairwiseRecord(r.item_a, r.item_b, r.outcome, sample=samples[int(r.sample[1:])]) for r in records]
    assert len(records) == 14_940
    batch, one = resample_fits(records, features, names, models, n_boot=12)
    assert batch.batched.all()
    np.testing.assert_allclose(batch.params, one.params, atol=1e-6)
    assert_same(*both_paths(records, features, names, models, n_boot=12))


def test_designs_of_any_shape_agree_with_one_resample_at_a_time():
    records, features, names, models = random_table(n_samples=20, seed=9)
    # a sparse design (two pairs per sample, as an active sampler leaves it)
    sparse = [r for k, r in enumerate(records) if (k % 10 - k // 10) % 5 == 0]  # a different two on each sample
    assert_same(*both_paths(sparse, features, names, models, n_boot=30))


def test_build_design_checks_the_covariate_shape():
    records, features, _, models = random_table(n_samples=5, seed=10)
    with pytest.raises(ValueError, match=r"covariates must have shape \(50, 2, K\)"):
        build_design(records, models, np.zeros((len(records), 1)), MODELS["davidson"])


@pytest.mark.parametrize("model", [name for name, m in MODELS.items() if m.difference_only])
@pytest.mark.parametrize("covariates", [0, 2])
def test_a_difference_models_per_sample_tables_equal_the_two_sided_ones(model, covariates):
    """A `difference_only` model's per-sample gradient and Hessian at the start, from its derivatives in ``(d,
    eta)`` over each record's non-zero coordinates, equal those from `PairModel.terms` at the record's two sides
    (the route of any other model): 1e-12 relative."""
    from emoreward.ranking.length_batched import _difference_tables, _side_tables

    records, features, names, models = random_table(n_samples=12, covariates=max(covariates, 1), seed=7)
    values = np.array([(features[r.sample, r.item_a], features[r.sample, r.item_b]) for r in records])
    design, _ = build_design(records, models, values[:, :, :covariates], MODELS[model])
    estimate = damped_newton(design, MODELS[model], np.ones((1, len(design.x))), 0.1)[0][0]
    for got, expected in zip(
        _difference_tables(design, MODELS[model], estimate), _side_tables(design, MODELS[model], estimate), strict=True
    ):
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12 * np.abs(expected).max())


@pytest.mark.parametrize("model", [name for name, m in MODELS.items() if m.difference_only])
@pytest.mark.parametrize("covariates", [1, 2])
def test_the_chebyshev_start_third_derivatives_are_the_hessians_slope(model, covariates):
    """The per-sample third derivatives of the Chebyshev start (a `difference_only` model's), contracted with a
    direction, equal the central difference of the per-sample Hessians along it (1e-6 relative)."""
    from emoreward.ranking.length_batched import _unit_tables

    records, features, names, models = random_table(n_samples=12, covariates=covariates, seed=5)
    values = np.array([(features[r.sample, r.item_a], features[r.sample, r.item_b]) for r in records])
    design, _ = build_design(records, models, values, MODELS[model])
    estimate = damped_newton(design, MODELS[model], np.ones((1, len(design.x))), 0.1)[0][0]
    direction = np.random.default_rng(6).normal(0, 1, estimate.shape)
    tables = _unit_tables(design, MODELS[model], estimate)
    q, h = len(estimate), 1e-5
    slope = (
        _unit_tables(design, MODELS[model], estimate + h * direction).hess
        - _unit_tables(design, MODELS[model], estimate - h * direction).hess
    ) / (2 * h)
    third = tables.third[:, tables.third_map] @ direction  # (samples, Q, Q)
    np.testing.assert_allclose(third.reshape(len(third), q * q), slope, rtol=1e-6, atol=1e-6 * np.abs(slope).max())


@pytest.mark.parametrize("model", [name for name, m in MODELS.items() if m.exponential_family])
@pytest.mark.parametrize("covariates", [1, 2])
def test_the_exponential_family_pass_equals_the_difference_pass(model, covariates):
    """A `PairModel.exponential_family` model's pass (``A``'s derivatives up to `PairModel.partition_scaling`'s
    factors per record, the factors and the data-linear part per resample once: `_UnitTables.statistics`; in
    float32 the scaled derivatives less their value at the estimate, `reference_at`) equals the pass through
    `PairModel.difference_terms` (the property switched off) in gradient and Hessian: 1e-10 relative in float64,
    1e-5 in float32 (whose ``n (s' - s'(estimate))`` keeps the gradient's digits near the estimate)."""
    from emoreward.ranking.length_batched import _ordered, _unit_tables
    from emoreward.ranking.length_pass import derivative_pass, reference_at

    family = MODELS[model]
    plain = type(family)()
    plain.exponential_family = False
    records, features, names, models = random_table(n_samples=12, covariates=covariates, seed=8)
    values = np.array([(features[r.sample, r.item_a], features[r.sample, r.item_b]) for r in records])
    design, _ = build_design(records, models, values, family)
    estimate = damped_newton(design, family, np.ones((1, len(design.x))), 0.1)[0][0]
    rng = np.random.default_rng(9)
    theta = estimate + rng.normal(0, 0.05, (6, len(estimate)))
    counts = resample_unit_weights(design.n_units, 6, 2).astype(float)
    rec, tables = _ordered(design), _unit_tables(design, family, estimate)
    linear = counts @ tables.statistics
    for dtype, rtol in ((np.float64, 1e-10), (np.float32, 1e-5)):
        expected = derivative_pass(rec, plain, theta, counts, design.m, np.float64)
        reference = reference_at(rec, family, estimate, dtype) if dtype is np.float32 else None
        got = derivative_pass(rec, family, theta, counts, design.m, dtype, linear=linear, reference=reference)
        for value, ref_value in zip(got, expected, strict=True):
            np.testing.assert_allclose(value, ref_value, rtol=rtol, atol=rtol * np.abs(ref_value).max())

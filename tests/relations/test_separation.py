"""Separation and degeneracy: every fit either gives a finite estimate, flagged where maximum likelihood has none, or
an explicit undefined with the reason; never a null score nor a huge coefficient without a word.

The case length control exists for: a judge that always prefers the longer description. Its length-controlled
ranking must have finite scores whose intervals all overlap (length explains every verdict, so nothing
distinguishes the models once length is in the model) and name the separation in the JSON and the Markdown;
`evaluate`'s and `judge`'s length-controlled logit on verdicts that length separates must be finite and flagged.
Owners: `emoreward.utils.separation` (the one detector, Firth's logit), `emoreward.ranking.length_control`
(`_full_fit`, `_separated_fit`), `emoreward.evaluation.metrics.length_controlled_preference`.
"""

from __future__ import annotations

import json
import math
import random
import warnings

import numpy as np
import pytest
from _inputs import WORDS, read_json, run_ok, write_jsonl

from emoreward.data.tables import DescriptionTable
from emoreward.ranking.bradley_terry import fit_bradley_terry_ties
from emoreward.ranking.counts import PairwiseCounts
from emoreward.ranking.edges import separated_groups
from emoreward.ranking.length_control import comparison_markdown, fit_length_controlled
from emoreward.ranking.records import PairwiseRecord
from emoreward.ranking.tie_models import TIE_MODELS, get_model


COVERS = {"rank": ("*", "--tie-model"), "evaluate": ("*",), "judge": ("*",)}


def length_decided_pairs(n: int = 24, seed: int = 0) -> list[dict]:
    """Pairs whose human label always prefers the longer description (length separates the verdicts)."""
    r = random.Random(seed)
    rows = []
    for i in range(n):
        a = " ".join(r.choice(["happy", "sad", "calm", "tense"]) for _ in range(r.randint(2, 9)))
        b = " ".join(r.choice(["happy", "sad", "calm", "tense"]) for _ in range(r.randint(2, 9)))
        if len(a) == len(b):
            b += " calm"
        rows.append(
            {"sample_id": f"p{i}", "description_1": a, "description_2": b, "label": "1" if len(a) > len(b) else "2"}
        )
    return rows


def assert_finite_or_named(fit: dict, numbers: tuple[str, ...], flag: str) -> None:
    """THE separation relation on one fit's JSON: every number in ``numbers`` is finite, and ``flag`` names the
    separation (a non-empty value)."""
    for key in numbers:
        value = fit[key]
        values = value if isinstance(value, list) else [value]
        assert all(v is not None and math.isfinite(v) for v in values), f"{key}: {value} (null or not finite)"
        assert all(abs(v) < 50 for v in values), f"{key}: {value} (a huge estimate)"
    assert fit.get(flag), f"the fit does not name the separation ({flag!r} is {fit.get(flag)!r})"


def assert_intervals_overlap(lower: list, upper: list) -> None:
    """Every interval overlaps every other (a null end is open: -inf / +inf)."""
    lo = [-math.inf if v is None else v for v in lower]
    hi = [math.inf if v is None else v for v in upper]
    assert max(lo) <= min(hi), f"intervals that do not overlap: {list(zip(lo, hi))}"


def test_length_only_judge_gives_a_length_controlled_ranking_that_names_the_separation(
    table, length_judge_yaml, tmp_path, capsys
):
    out = tmp_path / "rank.json"
    argv = ["rank", "--judge", length_judge_yaml, "--data", table, "--output", out, "--n-boot", 40, "--no-cache"]
    printed = run_ok(capsys, [*argv, "--quiet"])  # (--method bpa fits no length-controlled model)
    lc = read_json(out)["length_controlled"]
    assert_finite_or_named(lc, ("scores",), "separation")
    assert_intervals_overlap(lc["ci_lower"], lc["ci_upper"])
    assert lc["covariates"]["log_length"]["coefficient"] is None  # infinite: null, and named
    assert any("separation" in w for w in lc["warnings"])
    markdown = out.with_suffix(".md").read_text(encoding="utf-8")
    for text in (markdown, printed):
        assert "infinite (separation)" in text and "separation: covariates ['log_length']" in text


@pytest.mark.parametrize("command", ["evaluate", "judge"])
def test_length_controlled_logit_is_finite_and_flagged_when_length_separates(
    command, rm_dir, length_judge_yaml, tmp_path, capsys
):
    data = write_jsonl(tmp_path / "pairs.jsonl", length_decided_pairs())
    if command == "evaluate":
        out = tmp_path / "eval.json"
        run_ok(capsys, ["evaluate", "--model", rm_dir, "--data", data, "--output", out])
        lcp = read_json(out)["judge"]["length_controlled"]
        assert "separated (Firth-penalised)" in out.with_suffix(".md").read_text(encoding="utf-8")
    else:
        out = tmp_path / "judged"
        run_ok(capsys, ["judge", "--judge", length_judge_yaml, "--data", data, "--output", out, "--no-progress"])
        lcp = read_json(out / "report.json")["strategies"]["S1"]["evaluation"]["judge"]["length_controlled"]
    assert_finite_or_named(lcp, ("coef_judge", "coef_length", "intercept", "se_length"), "separation")


def _verdicts(n_samples: int, verdict, seed: int = 0):
    """Records and per-description lengths of models Verbose, Mid, Terse on ``n_samples`` samples, every pair once
    per sample; ``verdict(a, b, len_a, len_b, sample)`` gives the outcome (lengths drawn at random: not ordered by
    model)."""
    r = random.Random(seed)
    features, records = {}, []
    for s in range(n_samples):
        length = {m: r.randint(10, 60) for m in ("Verbose", "Mid", "Terse")}
        features.update({(f"s{s}", m): np.array([math.log1p(v)]) for m, v in length.items()})
        for a, b in (("Verbose", "Mid"), ("Mid", "Terse"), ("Terse", "Verbose")):
            records.append(PairwiseRecord(a, b, verdict(a, b, length[a], length[b], s), sample=f"s{s}"))
    return records, features


def _fit(records, features):
    with warnings.catch_warnings():  # the notes are checked in the fit's warnings
        warnings.simplefilter("ignore", UserWarning)
        return fit_length_controlled(records, features, ["log_length"], n_boot=50, seed=0)


def test_model_separation_opens_the_length_controlled_ends_of_the_models_the_plain_fit_names():
    """Verbose always wins, Terse always loses, lengths at random: model identity separates the verdicts, the
    covariate does not. The length-controlled fit flags the same models as the plain fits (open ends, warning)."""
    order = {"Verbose": 0, "Mid": 1, "Terse": 2}
    records, features = _verdicts(12, lambda a, b, la, lb, s: "1" if order[a] < order[b] else "2")
    plain = separated_groups(PairwiseCounts.from_records(records, sorted(order)), get_model("davidson"))
    assert plain == {"Verbose": "never lost", "Terse": "never won"}
    fit = _fit(records, features)
    out = fit.to_dict()
    assert out["separation"]["models"] == plain and out["separation"]["covariates"] == []
    assert_finite_or_named(out, ("scores",), "separation")
    lower = dict(zip(out["items"], out["ci_lower"]))
    upper = dict(zip(out["items"], out["ci_upper"]))
    assert [m for m, v in lower.items() if v is None] == ["Terse"]
    assert [m for m, v in upper.items() if v is None] == ["Verbose"]
    assert out["covariates"]["log_length"]["coefficient"] is None  # every verdict decided: nothing left for it
    assert any("never lost: Verbose; never won: Terse" in w for w in out["warnings"])
    assert fit.ranking == ["Verbose", "Mid", "Terse"]
    table = comparison_markdown(fit_bradley_terry_ties(PairwiseCounts.from_records(records, sorted(order))), fit)
    row = {line.split("|")[2].strip(): line for line in table.splitlines() if line.count("|") > 5}
    assert "+inf]" in row["Verbose"] and "[-inf" in row["Terse"]


def test_covariate_with_model_identity_separating_nulls_the_coefficient():
    """Verbose beats everyone whatever the lengths; between Mid and Terse the longer wins: neither model identity
    nor length alone orders every verdict, both together do: the coefficient is infinite (null, named)."""
    records, features = _verdicts(
        12,
        lambda a, b, la, lb, s: ("1" if a == "Verbose" else "2") if "Verbose" in (a, b) else ("1" if la > lb else "2"),
    )
    out = _fit(records, features).to_dict()
    assert out["separation"]["covariates"] == ["log_length"]
    assert out["covariates"]["log_length"]["coefficient"] is None
    assert any("together with model identity" in w for w in out["warnings"])
    assert_finite_or_named(out, ("scores",), "separation")


def test_no_separation_leaves_the_length_controlled_fit_unchanged():
    """Mixed verdicts, no separation: the same numbers as before the full-design check (commit 958fcda)."""
    r = random.Random(1)
    records, features = _verdicts(12, lambda a, b, la, lb, s: r.choice(["1", "1", "2", "tie"]), seed=0)
    out = _fit(records, features).to_dict()
    assert out["separation"] is None and out["warnings"] == []
    before = {  # computed on 958fcda
        "scores": [-0.247505004725241, -0.013759039019131317, 0.26126404374437234],
        "ci_lower": [-0.7145556705911418, -0.9459496136008723, -0.22431369525263012],
        "ci_upper": [0.27777133303604223, 0.6213252101655514, 0.8119437913581826],
    }
    for key, values in before.items():
        assert out[key] == pytest.approx(values, abs=1e-9), key
    cov = out["covariates"]["log_length"]
    assert (cov["coefficient"], cov["std_error"]) == pytest.approx((0.118812125044065, 0.3636134685288913), abs=1e-9)
    assert out["tie_parameter"] == pytest.approx(1.151482398691379, abs=1e-9)


FIVE_LETTERS = ("happy", "tears", "smile", "frown", "angry", "quiet", "voice", "shout", "laugh", "sighs")


def _equal_length_rows(n_samples: int = 8) -> list[dict]:
    """4 models x ``n_samples``: on a sample every description has the same length (so the length covariate never
    differs within a compared pair and is dropped), the words differ (so the verdicts do)."""
    rows = []
    for s in range(n_samples):
        for m, name in enumerate(("alpha", "beta", "gamma", "delta")):
            r = random.Random(100 * s + m)
            rows.append({"sample": f"s{s}", "model": name, "description": " ".join(r.choices(FIVE_LETTERS, k=3 + s))})
    return rows


def _tied_records(n_samples: int = 40, seed: int = 0):
    """Verdicts with many ties among 4 models of different strength, and a covariate constant on each sample."""
    rng = np.random.default_rng(seed)
    models, strength = ["A", "B", "C", "D"], [0.9, 0.3, -0.2, -1.0]
    records, features = [], {}
    for s in range(n_samples):
        features.update({(f"s{s}", m): np.array([float(s)]) for m in models})
        for i in range(4):
            for j in range(i + 1, 4):
                d = strength[i] - strength[j] + rng.normal(0, 0.8)
                outcome = "tie" if abs(d) < 0.6 else ("1" if d > 0 else "2")
                records.append(PairwiseRecord(models[i], models[j], outcome, sample=f"s{s}"))
    return records, features, models


def test_the_length_controlled_fit_is_the_ranking_tie_model_with_a_covariate():
    """Without length differences the length-controlled fit is the ranking fit of `FitSpec.model`, under every tie
    model: scores, interval (the same resamples) and tie parameter; so its column follows `--tie-model`. The tie
    models disagree on these verdicts (many ties), so a controlled fit that ignored the tie model would fail."""
    from emoreward.ranking.fit import FitSpec
    from emoreward.ranking.rank import fit_ranking
    from emoreward.ranking.tie_models import TIE_MODELS

    records, features, models = _tied_records()
    scores = {}
    for name in TIE_MODELS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            fits = fit_ranking(records, models, FitSpec.resolve(name), n_boot=40, features=features, paper=False)
        ctrl, plain = fits.controlled, fits.ties
        assert ctrl.model == plain.estimate.model == name
        np.testing.assert_allclose(ctrl.scores, plain.estimate.scores, atol=1e-6)
        np.testing.assert_allclose(ctrl.ci_lower, plain.lower, atol=1e-6)
        np.testing.assert_allclose(ctrl.ci_upper, plain.upper, atol=1e-6)
        assert ctrl.tie_parameter == pytest.approx(plain.estimate.tie_parameter, rel=1e-6)
        scores[name] = ctrl.scores
    spread = max(float(np.abs(scores[a] - scores[b]).max()) for a in scores for b in scores)
    assert spread > 0.05  # the tie models' rankings differ: the check above has teeth


@pytest.mark.parametrize("tie_model", ["rao-kupper", "emoprefer"])
def test_rank_length_controlled_column_follows_the_tie_model(tie_model, rm_dir, tmp_path, capsys):
    """Through `emoreward rank`: the length-controlled column is fitted under `--tie-model` (named in the JSON and
    the Markdown), and where no length differs it equals the ranking column."""
    table = write_jsonl(tmp_path / "table.jsonl", _equal_length_rows())
    out = tmp_path / "rank.json"
    argv = ["rank", "--judge", rm_dir, "--data", table, "--output", out, "--n-boot", 30, "--no-cache"]
    run_ok(capsys, [*argv, "--quiet", "--tie-model", tie_model])
    report = read_json(out)
    lc, ties = report["length_controlled"], report["bradley_terry_ties"]
    assert lc["model"] == tie_model
    assert lc["covariates"]["log_length"]["coefficient"] is None  # dropped: no length differs
    lc_scores = dict(zip(lc["items"], lc["scores"]))
    tie_scores = dict(zip(ties["items"], ties["scores"]))
    assert lc_scores == pytest.approx(tie_scores, abs=1e-6)
    assert f"Length-controlled ranking ({tie_model} + log_length" in out.with_suffix(".md").read_text(encoding="utf-8")


class _RuleJudge:
    """A generative judge by rule on the models' names (each description starts with its model's name): ``rule(a, b,
    sample index)`` -> ``"1"``, ``"2"`` or ``"tie"``; the lengths of the descriptions are drawn at random, so length
    decides none of the verdicts."""

    name = "rule"

    def __init__(self, rule):
        self.rule = rule

    def judge(self, pairs, *, run=0):
        from emoreward.data.verdicts import Judgement, Verdict

        verdicts = {"1": Verdict.FIRST, "2": Verdict.SECOND, "tie": Verdict.TIE}
        out = []
        for p in pairs:
            a, b = p.description_1.split()[0], p.description_2.split()[0]
            out.append(Judgement(p.sample_id, verdicts[self.rule(a, b, int(p.sample_id[1:]))], run=run))
        return out


_ORDER = {"champ": 0, "mid1": 1, "mid2": 1, "dud": 2}


def _separated_no_ties(a, b, s):
    """champ beats everyone, everyone beats dud, mid1 and mid2 alternate by sample: no tie."""
    if _ORDER[a] != _ORDER[b]:
        return "1" if _ORDER[a] < _ORDER[b] else "2"
    return "1" if (s % 2 == 0) == (a == "mid1") else "2"


def _separated_with_ties(a, b, s):
    """As `_separated_no_ties`, but mid1 and mid2 tie on every third sample."""
    return "tie" if {a, b} == {"mid1", "mid2"} and s % 3 == 0 else _separated_no_ties(a, b, s)


def _mixed(a, b, s):
    """Wins every way round and ties: no edge."""
    return random.Random(f"{a}-{b}-{s}").choice(["1", "1", "2", "2", "tie"])


SEPARATED = "separation (never lost: champ; never won: dud"
EDGE_CASES = {
    # case: (rule, samples, the edges every fit of these verdicts meets: the opening of each sentence)
    "separated, no ties": (_separated_no_ties, 12, {SEPARATED, "no ties"}),
    "separated, ties": (_separated_with_ties, 12, {SEPARATED}),
    "only ties": (lambda a, b, s: "tie", 12, {"every verdict is a tie"}),
    "one sample, only ties": (lambda a, b, s: "tie", 1, {"every verdict is a tie", "1 resampling unit(s)"}),
    "none": (_mixed, 12, set()),
}
_OPENINGS = ("separation (", "no ties", "every verdict is a tie", "1 resampling unit(s)")


def _rule_table(n_samples: int) -> DescriptionTable:
    """The four models on ``n_samples`` samples, lengths at random; on one sample all of one length (there a length
    that differs is collinear with model identity: no length-controlled fit to compare)."""
    r = random.Random(7)

    def text(m: str) -> str:
        words = " ".join(r.choices(WORDS, k=r.randint(2, 12)))
        return f"{m} {words}" if n_samples > 1 else f"{m} {'y' * (30 - len(m))}"

    return DescriptionTable.from_rows(
        {"sample": f"s{s}", "model": m, "description": text(m)} for s in range(n_samples) for m in _ORDER
    )


@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_plain_and_length_controlled_fits_report_the_same_edges_under_every_tie_model(case):
    """The length-controlled fit meets the plain fit's edges (separation by model identity, a tie parameter with no
    ties or only ties to fit, one resampling unit) under every registered tie model, and reports them the same way:
    the same tie parameter at its bound (null), the same separated models (open ends), the same sentences. The owner
    is `emoreward.ranking.edges`; a length-controlled fit that decided an edge by itself (it once saw only the
    all-ties one, and printed 1e-13 as a fitted tie parameter without ties) fails here."""
    from emoreward.ranking.fit import FitSpec
    from emoreward.ranking.rank import rank_with_judge

    rule, n_samples, expected = EDGE_CASES[case]
    table = _rule_table(n_samples)
    for name in TIE_MODELS:
        report = rank_with_judge(_RuleJudge(rule), table, fit=FitSpec.resolve(name), n_boot=40)
        data = json.loads(json.dumps(report.to_dict()))
        plain, lc = data["bradley_terry_ties"], data["length_controlled"]
        assert lc["model"] == name and (lc["separation"] or {}).get("covariates", []) == []  # length decides nothing
        assert lc["tie_parameter_at_bound"] == plain["tie_parameter_at_bound"], name
        assert (lc["tie_parameter"] is None) == (plain["tie_parameter"] is None), (name, lc["tie_parameter"])
        assert (lc["separation"] or {}).get("models", {}) == plain["separated"], name
        for side in ("ci_lower", "ci_upper"):  # the ends only the prior bounds are open (null) in both
            open_plain = {m for m, v in zip(plain["items"], plain[side]) if v is None}
            assert {m for m, v in zip(lc["items"], lc[side]) if v is None} >= open_plain, (name, side)
        sentences = {
            fit: [w.split(": ", 1)[1] for w in report.warnings if w.startswith(f"{prefix}: ")]
            for fit, prefix in (("plain", f"BT-ties ({name})"), ("controlled", "length-controlled fit"))
        }
        for opening in _OPENINGS:
            said = {fit: [s for s in got if s.startswith(opening)] for fit, got in sentences.items()}
            assert said["plain"] == said["controlled"], (name, said)
        assert all(any(s.startswith(e) for s in sentences["plain"]) for e in expected), (name, sentences)
        # separation is the tie model's to decide (EmoPrefer's ties put the tie level above both models: with only
        # ties, every model "never won"); the other edges are the data's
        edges = {o for o in _OPENINGS[1:] if any(s.startswith(o) for s in sentences["plain"])}
        assert edges == {o for o in _OPENINGS[1:] if any(e.startswith(o) for e in expected)}, (name, edges)


@pytest.mark.parametrize("tie_model", sorted(TIE_MODELS))
def test_rank_without_ties_nulls_the_length_controlled_tie_parameter(tie_model, length_judge_yaml, tmp_path, capsys):
    """Through `emoreward rank`: the length-only judge on descriptions of four different lengths per sample gives no
    tie; the tie parameter of every fit is at its bound, null in the JSON, named, and warned about once per fit (the
    length-controlled fit's once read 9.4e-14, or 1.0000000000000935 for Rao-Kupper, as if estimated)."""
    r = random.Random(3)
    rows = [
        {"sample": f"s{s}", "model": m, "description": "y" * n}
        for s in range(8)
        for m, n in zip(("alpha", "beta", "gamma", "delta"), r.sample([12, 18, 24, 30], 4))
    ]
    out = tmp_path / "rank.json"
    argv = ["rank", "--judge", length_judge_yaml, "--data", write_jsonl(tmp_path / "t.jsonl", rows), "--output", out]
    run_ok(capsys, [*argv, "--n-boot", 20, "--no-cache", "--quiet", "--tie-model", tie_model])
    report = read_json(out)
    for key in ("bradley_terry_ties", "length_controlled"):
        assert report[key]["tie_parameter"] is None and report[key]["tie_parameter_at_bound"] == "no ties", key
    said = sorted(w.split(": no ties in the data")[0] for w in report["warnings"] if ": no ties in the data" in w)
    paper = [] if tie_model == "emoprefer" else ["BT-ties (emoprefer, paper)"]
    assert said == sorted([f"BT-ties ({tie_model})", "length-controlled fit", *paper])

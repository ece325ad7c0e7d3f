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

import math
import random

import pytest
from _inputs import read_json, run_ok, write_jsonl


COVERS = {"rank": ("*",), "evaluate": ("*",), "judge": ("*",)}


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

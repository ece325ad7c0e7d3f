"""Snapshot of `emoreward rank`'s reports on the bundled OV-MERD table, to show a refactor left them unchanged.

    python benchmarks/rank_snapshot.py run OUT_DIR          # every case below; reports (JSON + Markdown) into OUT_DIR
    python benchmarks/rank_snapshot.py compare BEFORE AFTER # byte for byte, durations excepted

Cheap annotators only: a tiny random-weight reward model (the tests' `save_tiny_bert_rm`), the scripted length
judge (`backend: scripted`), a committee of both; every run works in one fixed folder so paths in reports match.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import sys
from pathlib import Path


WORK = Path("/tmp/emoreward-rank-snapshot")  # fixed: reports name their score cache and judge paths
LENGTH_JUDGE = "name: lengthjudge\nmllm:\n  backend: scripted\n  model: length\n"
SUBSET = "Otter,SALMONN,Video-LLaVA,VideoChat2"


def cases(rm: str, length: str, calibration: str, ids: str) -> dict[str, list[str]]:
    """Case name -> `emoreward rank` arguments (``--output`` and ``--quiet`` added)."""
    rm_args = ["--judge", rm, "--data", "ovmerd", "--cache-dir", str(WORK / "cache"), "--n-boot", "200"]
    judge = ["--judge", length, "--data", "ovmerd", "--samples", "12", "--cache-dir", str(WORK / "cache")]
    return {
        "rm_full": rm_args,
        "rm_full_cached": rm_args,  # the same ranking again, from the score cache
        "rm_full_default_boot": rm_args[:-2],
        **{f"rm_tie_{t}": [*rm_args, "--tie-model", t] for t in ("davidson", "rao-kupper", "emoprefer")},
        "rm_no_length_control": [*rm_args, "--no-length-control"],
        "rm_models_samples": [*rm_args, "--models", SUBSET, "--samples", "40", "--seed", "3"],
        "rm_sample_ids": [*rm_args, "--sample-ids", ids, "--alpha", "0.1"],
        "rm_hierarchical_k": [*rm_args, "--hierarchical", "3"],
        "rm_hierarchical_groups": [*rm_args, "--method", "hierarchical", "--hierarchical", "Otter,SALMONN|VideoChat2,Video-LLaVA",
                                   "--models", SUBSET],
        "rm_bpa": ["--method", "bpa", *rm_args[:-2], "--budget", "300", "--seed", "1"],
        "rm_bpa_paper": ["--method", "bpa", *rm_args[:-2], "--budget", "200", "--policy", "paper"],
        "rm_tie_threshold": [*rm_args, "--tie-threshold", "0.05", "--models", SUBSET],
        "judge_full": [*judge, "--n-boot", "100"],
        "judge_consensus": [*judge, "--n-boot", "100", "--combine", "consensus", "--models", SUBSET],
        "judge_no_swap": [*judge, "--n-boot", "100", "--no-swap", "--tie-model", "emoprefer"],
        "judge_bpa": ["--method", "bpa", *judge, "--budget", "60"],
        "committee_equal": ["--judge", rm, *judge, "--n-boot", "100"],
        "committee_calibrated": ["--judge", rm, *judge, "--n-boot", "100", "--committee-calibration", calibration],
        "committee_accuracy": [
            "--judge", rm, *judge, "--n-boot", "100", "--committee-calibration", calibration,
            "--committee-weighting", "accuracy", "--tie-model", "rao-kupper",
        ],
        "committee_bpa": ["--method", "bpa", "--judge", rm, *judge, "--budget", "60"],
        # refusals: one line on stderr, exit 2, no report
        "refuse_unknown_model": [*rm_args, "--models", "Otter,Nobody"],
        "refuse_one_model": [*rm_args, "--models", "Otter"],
        "refuse_missing_ids": [*rm_args, "--sample-ids", str(WORK / "no-such-ids.txt")],
        "refuse_one_member_calibration": [*rm_args, "--committee-calibration", calibration],
        "refuse_same_member": [*rm_args, "--judge", rm],
        "refuse_committee_hierarchical": [*rm_args, "--judge", length, "--hierarchical", "2"],
        "refuse_weighting_alone": [*rm_args, "--judge", length, "--committee-weighting", "accuracy"],
        "refuse_bpa_option": [*rm_args, "--budget", "10"],
        "refuse_generative_option": [*rm_args, "--strategy", "S2"],
    }  # fmt: skip


def setup() -> tuple[str, str, str, str]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from _helpers import save_tiny_bert_rm

    if WORK.exists():
        shutil.rmtree(WORK)
    WORK.mkdir(parents=True)
    rm = save_tiny_bert_rm(WORK / "rm" / "model", max_length=64)
    (WORK / "len.yaml").write_text(LENGTH_JUDGE, encoding="utf-8")
    table = [json.loads(line) for line in (Path(__file__).resolve().parents[1] / "emoreward/data/files/ovmerd"
             / "ovmerd_descriptions_subtitle.jsonl").read_text(encoding="utf-8").splitlines()]  # fmt: skip
    ids = sorted({r["sample"] for r in table})[5:65:2]
    (WORK / "ids.txt").write_text("".join(f"{s}\n" for s in ids), encoding="utf-8")
    by_sample: dict[str, dict[str, str]] = {}
    for r in table:
        by_sample.setdefault(r["sample"], {})[r["model"]] = r["description"]
    rows = []
    for i, (sample, d) in enumerate(sorted(by_sample.items())[:8]):
        a, b = d["Otter"], d["VideoChat2"]
        rows.append({"sample_id": sample, "description_1": a, "description_2": b, "label": "12"[i % 2]})
    calibration = WORK / "calibration.jsonl"
    calibration.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(rm), str(WORK / "len.yaml"), str(calibration), str(WORK / "ids.txt")


def run(out_dir: Path) -> None:
    from emoreward.cli.main import main

    out_dir.mkdir(parents=True, exist_ok=True)
    for name, argv in cases(*setup()).items():
        report = WORK / "reports" / f"{name}.json"
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = main(["rank", *argv, "--output", str(report), "--quiet"])
            except SystemExit as err:  # argparse's refusal
                code = err.code
        print(f"{name}: exit {code}", file=sys.stderr)
        if code != 0:
            print(stderr.getvalue()[-2000:], file=sys.stderr)
        (out_dir / f"{name}.stderr.txt").write_text(stderr.getvalue(), encoding="utf-8")
        (out_dir / f"{name}.stdout.txt").write_text(_no_times(stdout.getvalue()), encoding="utf-8")
        for path in (report, report.with_suffix(".md")):
            if path.exists():
                shutil.copy(path, out_dir / path.name)


def _no_times(text: str) -> str:
    """Durations (``2.4 s``, ``wall time ...``) replaced by a placeholder: they change from run to run."""
    text = "\n".join("wall time <s>" if line.startswith("wall time ") else line for line in text.splitlines())
    return re.sub(r"\b\d+(\.\d+)? s\b", "<t> s", text)


def _drop_seconds(value):
    if isinstance(value, dict):
        return {k: _drop_seconds(v) for k, v in value.items() if "seconds" not in k}
    return [_drop_seconds(v) for v in value] if isinstance(value, list) else value


def _comparable(path: Path) -> str:
    if path.suffix == ".json":
        return json.dumps(_drop_seconds(json.loads(path.read_text(encoding="utf-8"))), indent=1, sort_keys=True)
    return _no_times(path.read_text(encoding="utf-8"))


def compare(before: Path, after: Path) -> int:
    names = sorted({p.name for p in before.iterdir()} | {p.name for p in after.iterdir()})
    differ = [n for n in names if not (before / n).exists() or not (after / n).exists()
              or _comparable(before / n) != _comparable(after / n)]  # fmt: skip
    for n in differ:
        print(f"differs: {n}")
    print(
        f"{len(names) - len(differ)} of {len(names)} files identical (durations excepted: keys naming seconds, 'N s' in text)"
    )
    return 1 if differ else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:
        run(Path(sys.argv[2]))
    elif sys.argv[1:2] == ["compare"]:
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)

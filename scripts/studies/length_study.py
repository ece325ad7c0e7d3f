"""Length-robust reward models: k-fold cross-validation of each `length_debias` variant on one recipe.

Usage:
    python scripts/studies/length_study.py [--recipe recipes/minilm/rm/config_lora.yaml] [--variants none reweight penalty disentangled]
                                           [--output-dir outputs/length-study/minilm] [--folds 5] [--probe]

Each variant is `emoreward train` with `length_debias` set, `final_fit: false` and W&B off; finished folds are
reused when the study is rerun (interrupt it at any time). With `--probe` the backbone stays frozen and only the
value head is trained on features computed once (`scripts/studies/probe.py`): minutes instead of hours on a CPU.
Prints and writes (`study.md`, `study.json`) a table of two-class WAF, length-debiased accuracy, accuracy on
length-counter pairs and reward-length Spearman correlation, mean ± std over folds, beside the length baseline.
Results: docs/training.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from emoreward.training.config import load_config
from emoreward.training.pipeline import run_training


COLUMNS = [
    ("two_class_waf", "2-class WAF"),
    ("two_class_acc", "2-class ACC"),
    ("length_debiased_acc", "length-debiased ACC"),
    ("acc_counter", "ACC length-counter"),
    ("prefers_longer_rate", "prefers longer"),
    ("reward_length_spearman", "reward-length Spearman"),
]


def cell(summary: dict, key: str) -> str:
    v = summary.get(key)
    return "-" if v is None else f"{v['mean']:.2f} ± {v['std']:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="recipes/minilm/rm/config_lora.yaml")
    parser.add_argument("--variants", nargs="+", default=["none", "reweight", "penalty", "disentangled"])
    parser.add_argument("--output-dir", default=None)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--probe", action="store_true", help="frozen backbone, value head only (cached features)")
    args = parser.parse_args()
    suffix = "-probe" if args.probe else ""
    out = Path(args.output_dir or f"outputs/length-study/{Path(args.recipe).parts[-3]}{suffix}")
    rows, raw = [], {}
    baseline = None
    if args.probe:
        summaries = probe_study(args, out)
    for variant in args.variants:
        if args.probe:
            summary = summaries[variant]
            raw[variant] = summary
            baseline = summary["length_baseline"]
            rows.append(f"| {variant} | " + " | ".join(cell(summary["judge"], k) for k, _ in COLUMNS) + " |")
            continue
        config = load_config(
            args.recipe,
            {
                "length_debias": variant,
                "cv_folds": args.folds,
                "final_fit": False,
                "report_to": ["none"],
                "output_dir": str(out / variant),
                "disable_tqdm": True,
            },
        )
        report = run_training(config)
        summary = report["cross_validation"]["summary"]
        raw[variant] = summary
        baseline = summary["length_baseline"]
        rows.append(f"| {variant} | " + " | ".join(cell(summary["judge"], k) for k, _ in COLUMNS) + " |")
    header = "| variant | " + " | ".join(label for _, label in COLUMNS) + " |\n|---|" + "---:|" * len(COLUMNS)
    rows.append("| *length baseline* | " + " | ".join(cell(baseline, k) for k, _ in COLUMNS) + " |")
    setup = f"{args.recipe}, frozen backbone + value head (probe)" if args.probe else args.recipe
    table = (
        f"{args.folds}-fold cross-validation, {setup} (mean ± std over folds)\n\n{header}\n" + "\n".join(rows) + "\n"
    )
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / "study.md").write_text(table)
    (out / "study.json").write_text(json.dumps(raw, indent=2))


def probe_study(args: argparse.Namespace, out: Path) -> dict[str, dict]:
    """Cross-validate value-head probes of every variant on the recipe's frozen backbone."""
    from probe import ProbeConfig, probe_cross_validation, recipe_model  # scripts/studies/probe.py, beside this

    from emoreward.data import load_pairs

    config = load_config(args.recipe, {"report_to": ["none"], "output_dir": str(out)})
    model = recipe_model(config)
    pairs = load_pairs(config.train_file, media_by_id=config.media_root is not None)  # as `train` reads it
    probe_config = ProbeConfig(
        ties=config.ties,
        tie_parameter=config.tie_parameter,
        odin_length_weight=config.odin_length_weight,
        odin_orthogonal_weight=config.odin_orthogonal_weight,
        seed=config.seed,
    )
    results = probe_cross_validation(
        model,
        pairs,
        args.variants,
        folds=args.folds,
        seed=config.seed,
        config=probe_config,
        cache_dir=out / "features",
        tie_policy=config.two_class_tie_policy,
    )
    return {variant: result["summary"] for variant, result in results.items()}


if __name__ == "__main__":
    main()

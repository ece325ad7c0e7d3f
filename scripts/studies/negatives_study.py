"""Controlled negatives on value-head probes: what each kind buys and costs, k-fold cross-validated (issue 38).

Usage:
    python scripts/studies/negatives_study.py [--recipe recipes/minilm/rm/config_lora.yaml] [--settings none all
        emotion_flip ... all@4] [--folds 5] [--epochs 200] [--weight-decay W ...] [--output-dir DIR] [--cache-dir DIR]

A setting is the negatives a fit trains on beside its human pairs (`none`, `all`, kinds joined by `+`), optionally
`@W` (each negative's pair counted W times). Every setting uses the same grouped folds (`stratified_folds`), the
recipe's front door (`training.negatives.training_pairs`), the tie threshold calibrated on the training folds' human
pairs, and is judged on the held-out human pairs and rules-engine negatives as `emoreward train` reports them
(`harness.controlled_errors`, pooled). The probe (`probe.py`) stands in for the LoRA run. Writes `study.md` and
`study.json`. Results: docs/training.md, "Controlled negatives".
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from probe import FeatureCache, ProbeConfig, ProbeJudge, fit_probe, recipe_model  # beside this script

from emoreward.data.negatives import KINDS, generate_negatives
from emoreward.data.pairs import canonical_pairs, read_pairs
from emoreward.evaluation import evaluate_judgements, run_judge
from emoreward.evaluation.controlled import pool_sections, wilson_interval
from emoreward.evaluation.harness import controlled_errors
from emoreward.evaluation.metrics import calibrate_tie_threshold, recognition
from emoreward.evaluation.report import aggregate
from emoreward.training.config import load_config
from emoreward.training.negatives import training_pairs
from emoreward.training.pipeline import CONTROLLED_SOURCE, stratified_folds


SETTINGS = ["none", "all", *KINDS, "all@4"]
SHORT = {"emotion_flip": "flip", "intensity_mismatch": "intensity", "evidence_contradiction": "evidence",
         "modality_omission": "omission"}  # fmt: skip


def parse_setting(spec: str) -> tuple[list[str], int]:
    """`KINDS[@W]` -> (kinds, weight); `none` -> ([], 1). Raises ValueError naming the setting."""
    name, _, weight = spec.partition("@")
    kinds = [] if name == "none" else list(KINDS) if name == "all" else name.split("+")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or (weight and not weight.isdigit()) or (weight and int(weight) < 1):
        raise ValueError(f"--settings {spec}: expected none, all or kinds of {list(KINDS)} joined by '+', then "
                         "optionally @W (a positive integer)")  # fmt: skip
    return kinds, int(weight or 1)


def oriented(pairs, table, n_human: int, weight: int) -> tuple[np.ndarray, ...]:
    """(chosen, rejected, tie, length_chosen, length_rejected) feature arrays of `pairs` (`n_human` human pairs, then
    negatives), each negative's pair repeated `weight` times."""
    rows = []
    for i, p in enumerate(pairs):
        a, b = (p.description_2, p.description_1) if str(p.label) == "2" else (p.description_1, p.description_2)
        rows += [(a, b, p.media.subtitle, str(p.label) == "tie")] * (1 if i < n_human else weight)
    return (np.array([table[(a, s)] for a, _, s, _ in rows]), np.array([table[(b, s)] for _, b, s, _ in rows]),
            np.array([float(t) for *_, t in rows]), np.array([len(a) for a, *_ in rows], float),
            np.array([len(b) for _, b, *_ in rows], float))  # fmt: skip


def margins(judge: ProbeJudge, negatives, threshold: float, scale: float, seen: set[str]) -> list[dict]:
    """Per held-out negative: its kind, d = r(original) - r(negative), the fold's tie threshold, `scale` (the
    median |r1 - r2| of the fold's held-out human pairs: the unit in which rewards of different folds compare) and
    `unseen`: its inserted words are none that a training negative inserted (`seen`; omissions insert none)."""
    r_orig, r_neg = judge.pair_rewards([n.pair(i + 1) for i, n in enumerate(negatives)])
    return [{"kind": n.kind, "d": float(d), "threshold": threshold, "scale": scale,
             "unseen": bool(n.replacement.strip()) and n.replacement.strip().lower() not in seen}
            for n, d in zip(negatives, r_orig - r_neg)]  # fmt: skip


def margin_summary(rows: list[dict], thresholds: list[float], scales: list[float]) -> dict:
    """Pooled over folds, per kind: median |d| / scale, the count below the fold's threshold (judged ties), the count
    with d > 0 (prefers the original when never tying); per fold the threshold / scale."""
    out: dict = {"threshold_over_scale": [t / s for t, s in zip(thresholds, scales)]}
    for kind in [*KINDS, "all"]:
        sel = [r for r in rows if kind in ("all", r["kind"])]
        out[kind] = {
            "n": len(sel),
            "median_abs_over_scale": float(np.median([abs(r["d"]) / r["scale"] for r in sel])) if sel else None,
            "below_threshold": sum(abs(r["d"]) < r["threshold"] or r["d"] == 0 for r in sel),
            "positive": sum(r["d"] > 0 for r in sel),
            # a lexical shortcut test: the edits whose inserted words no training negative inserted
            "unseen": sum(r["unseen"] for r in sel),
            "unseen_positive": sum(r["unseen"] and r["d"] > 0 for r in sel),
            "unseen_decided_positive": sum(r["unseen"] and r["d"] > 0 and r["d"] >= r["threshold"] for r in sel),
        }
    return out


def visibility(pairs, negatives, table) -> dict:
    """How far a negative moves the frozen features: per kind, the median Euclidean distance original-negative over
    the median distance between the two descriptions of a human pair (features standardised over the human texts)."""
    human = np.array([table[(d, p.media.subtitle)] for p in pairs for d in (p.description_1, p.description_2)])
    scale = human.std(0) + 1e-6

    def dist(a, b, s):
        return float(np.linalg.norm((table[(a, s)] - table[(b, s)]) / scale))

    base = float(np.median([dist(p.description_1, p.description_2, p.media.subtitle) for p in pairs]))
    out = {"human_pair_median_distance": base}
    for kind in KINDS:
        d = [dist(n.original, n.negative, n.media.subtitle if n.media else None) for n in negatives if n.kind == kind]
        out[kind] = {"n": len(d), "median_distance_over_human": float(np.median(d)) / base if d else None}
    return out


def run_study(recipe: str, overrides: dict, pairs, settings: list[str], *, folds: int, probe: dict,
              cache_dir: Path, log=print) -> dict:  # fmt: skip
    """Cross-validate one probe per setting on the frozen backbone of `recipe` (with `overrides`, the recipe's
    fields); returns the JSON-safe results (`markdown` formats them)."""
    config = load_config(recipe, overrides)
    by_id = config.media_root is not None
    splits = stratified_folds(pairs, folds, config.seed, media_by_id=by_id)
    parsed = {s: parse_setting(s) for s in settings}
    held_out = [generate_negatives([pairs[i] for i in te], media_by_id=by_id).negatives for _, te in splits]
    trained: dict[tuple[str, ...], list] = {}
    for kinds, _ in parsed.values():
        if tuple(kinds) not in trained:
            fields = {"controlled_negatives": kinds or None, "report_to": ["none"]}
            cfg = load_config(recipe, {**overrides, **fields})
            trained[tuple(kinds)] = [training_pairs(cfg, [pairs[i] for i in tr]) for tr, _ in splits]
    texts = list(dict.fromkeys((d, p.media.subtitle) for p in pairs for d in (p.description_1, p.description_2)))
    extra = [(n.negative, n.media.subtitle if n.media else None) for negs in held_out for n in negs]
    extra += [(d, p.media.subtitle) for runs in trained.values() for t in runs for p in t.pairs[t.n_human:]
              for d in (p.description_1, p.description_2)]  # fmt: skip
    texts += sorted(set(extra) - set(texts), key=lambda t: (t[0], t[1] or ""))
    model = recipe_model(config)
    table = dict(zip(texts, FeatureCache(cache_dir).features(model, texts, log=log)))
    decays = list(probe["weight_decay"])  # several: each outer fold picks one by an inner CV on its training folds
    probe_config = ProbeConfig(ties=config.ties, tie_parameter=config.tie_parameter, seed=config.seed,
                               epochs=probe["epochs"], weight_decay=decays[0])  # fmt: skip
    configs = {kinds: load_config(recipe, {**overrides, "controlled_negatives": list(kinds) or None})
               for kinds in trained}  # fmt: skip
    every_negative = [n for negs in held_out for n in negs]
    # what each fold's training negatives can insert (the same front door: `training_pairs` writes a subset)
    inserted = [generate_negatives([pairs[i] for i in tr], media_by_id=by_id).negatives for tr, _ in splits]
    out = {"n_pairs": len(pairs), "folds": folds, "seed": config.seed, "probe": probe,
           "n_texts": len(texts), "visibility": visibility(pairs, every_negative, table), "settings": {}}  # fmt: skip
    for spec, (kinds, weight) in parsed.items():
        evaluations, sections, sections_no_tie, rows, scales, thresholds, n_neg = [], [], [], [], [], [], []
        chosen = []
        for k, (tr, te) in enumerate(splits):
            fit = trained[tuple(kinds)][k]
            train, test = [pairs[i] for i in tr], [pairs[i] for i in te]
            decay = decays[0] if len(decays) == 1 else choose_decay(
                configs[tuple(kinds)], train, table, weight, probe_config, decays, probe["inner_folds"])  # fmt: skip
            chosen.append(decay)
            head = fit_probe(
                *oriented(fit.pairs, table, fit.n_human, weight), replace(probe_config, weight_decay=decay)
            )
            r1, r2 = ProbeJudge(head, table, 0.0).pair_rewards(train)  # calibrated on the human pairs alone
            threshold = calibrate_tie_threshold(r1 - r2, [p.label for p in train])
            judge = ProbeJudge(head, table, threshold)
            evaluation = evaluate_judgements(run_judge(judge, test), tie_policy=config.two_class_tie_policy,
                                             media_by_id=by_id)  # fmt: skip
            evaluations.append(evaluation)
            sections.append(controlled_errors(judge, held_out[k], source=CONTROLLED_SOURCE))
            sections_no_tie.append(controlled_errors(ProbeJudge(head, table, 0.0), held_out[k],
                                                     source=CONTROLLED_SOURCE))  # fmt: skip
            h1, h2 = judge.pair_rewards(test)
            scales.append(float(np.median(np.abs(h1 - h2))))
            seen = {p.description_2 for p in fit.pairs[fit.n_human :]}  # the training negatives' texts
            words = {n.replacement.strip().lower() for n in inserted[k] if n.negative in seen}
            rows += margins(judge, held_out[k], threshold, scales[-1], words)
            thresholds.append(threshold)
            n_neg.append(len(fit.pairs) - fit.n_human)
        out["settings"][spec] = {
            "kinds": kinds, "weight": weight, "negatives_per_fold": n_neg, "weight_decay_per_fold": chosen,
            "summary": aggregate(evaluations),
            "controlled_errors": pool_sections(sections, f"{CONTROLLED_SOURCE}, pooled over {folds} folds"),
            "controlled_errors_no_tie": pool_sections(sections_no_tie, "tie threshold 0 (the judge never ties)"),
            "margins": margin_summary(rows, thresholds, scales),
        }  # fmt: skip
        h = out["settings"][spec]["summary"]["judge"]
        log(f"{spec}: 2-class WAF {_cell(h, 'two_class_waf')}, length-debiased ACC {_cell(h, 'length_debiased_acc')} "
            f"({folds} folds, {np.mean(n_neg):.0f} negatives per fold)")  # fmt: skip
    return out


def choose_decay(config, train, table, weight: int, base: ProbeConfig, decays: list[float], k: int) -> float:
    """The weight decay of `decays` with the best mean two-class WAF over a k-fold CV on `train` alone (grouped folds,
    each inner fit on its own pairs and negatives, `training_pairs`, its threshold on its human pairs); the smaller on
    a tie. Nothing held out by the outer fold is read."""
    inner = stratified_folds(train, k, config.seed, media_by_id=config.media_root is not None)
    best, best_waf = decays[0], -1.0
    for decay in sorted(decays):
        wafs = []
        for tr, te in inner:
            fit = training_pairs(config, [train[i] for i in tr])
            head = fit_probe(*oriented(fit.pairs, table, fit.n_human, weight), replace(base, weight_decay=decay))
            r1, r2 = ProbeJudge(head, table, 0.0).pair_rewards(fit.pairs[: fit.n_human])
            threshold = calibrate_tie_threshold(r1 - r2, [p.label for p in fit.pairs[: fit.n_human]])
            test = [train[i] for i in te]
            verdicts = [j.verdict.value for j in ProbeJudge(head, table, threshold).judge(test)]
            wafs.append(
                recognition([p.label for p in test], verdicts, "two-class", config.two_class_tie_policy)["waf"]
            )
        if np.mean(wafs) > best_waf + 1e-12:
            best, best_waf = decay, float(np.mean(wafs))
    return best


def _cell(summary: dict, key: str) -> str:
    v = summary.get(key)
    return "-" if v is None else f"{v['mean']:.2f} ± {v['std']:.2f}"


def _share(cell: dict) -> str:
    if cell["rate"] is None:
        return "-"
    lo, hi = cell["ci95"]
    return f"{cell['rate']:.1f} [{lo:.0f}, {hi:.0f}] ({cell['ties']})"


def _decided(cell: dict) -> str:
    decided = cell["n"] - cell["ties"] - cell["invalid"]
    ci = wilson_interval(cell["prefers_original"], decided)
    return "-" if not decided else f"{100 * cell['prefers_original'] / decided:.1f} [{ci[0]:.0f}, {ci[1]:.0f}]"


def markdown(results: dict, title: str) -> str:
    """The study's tables: held-out human pairs and controlled errors per setting (calibrated threshold, then the
    judge that never ties), reward margins relative to the tie threshold, and how far negatives move the features."""
    settings = results["settings"]
    first = next(iter(settings.values()))
    kinds = [*KINDS, "all"]
    head = ("| setting | negatives per fold | 2-class WAF | length-debiased ACC | "
            + " | ".join(SHORT.get(k, "all kinds") for k in kinds) + " |\n|---|" + "---:|" * (3 + len(kinds)))  # fmt: skip
    lines = [f"## {title}", "",
             f"{results['folds']}-fold cross-validation grouped by sample on {results['n_pairs']} pairs (mean ± std "
             "over folds); controlled errors: the held-out folds' rules-engine negatives, pooled, the share where the "
             "probe prefers the original, %, [Wilson 95%] (ties, counted against).", "",
             "### With the tie threshold calibrated on the training folds' human pairs", "", head]  # fmt: skip
    for spec, s in settings.items():
        cells = [spec, f"{np.mean(s['negatives_per_fold']):.0f}", _cell(s["summary"]["judge"], "two_class_waf"),
                 _cell(s["summary"]["judge"], "length_debiased_acc")]  # fmt: skip
        section = s["controlled_errors"]
        cells += [_share(section["kinds"][k]["judge"] if k != "all" else section["all"]["judge"]) for k in kinds]
        lines.append("| " + " | ".join(cells) + " |")
    baseline, section = first["summary"]["length_baseline"], first["controlled_errors"]
    cells = ["*length baseline / length judge*", "-", _cell(baseline, "two_class_waf"),
             _cell(baseline, "length_debiased_acc")]  # fmt: skip
    cells += [_share((section["kinds"][k] if k != "all" else section["all"])["length_judge"]) for k in kinds]
    lines += [
        "| " + " | ".join(cells) + " |",
        "| *random* | - | - | 50.00 | " + " | ".join(["50"] * len(kinds)) + " |",
    ]
    lines += ["", "### Controlled errors when the probe never ties (tie threshold 0), and decided-only", "",
              "Share preferring the original with threshold 0 [Wilson 95%]; then, with the calibrated threshold, the "
              "share among the negatives it decides.", "",
              "| setting | " + " | ".join(f"{SHORT.get(k, 'all kinds')}: threshold 0" for k in kinds) + " | "
              + " | ".join(f"{SHORT.get(k, 'all kinds')}: decided" for k in kinds) + " |",
              "|---|" + "---:|" * (2 * len(kinds))]  # fmt: skip
    for spec, s in settings.items():
        zero, cal = s["controlled_errors_no_tie"], s["controlled_errors"]
        pick = lambda sec, k: sec["kinds"][k]["judge"] if k != "all" else sec["all"]["judge"]  # noqa: E731
        cells = [_share(pick(zero, k)).rsplit(" (", 1)[0] for k in kinds] + [_decided(pick(cal, k)) for k in kinds]
        lines.append(f"| {spec} | " + " | ".join(cells) + " |")
    lines += ["", "### Reward margins on held-out negatives", "",
              "Unit: the median |r1 - r2| of the fold's held-out human pairs. Per kind: median |r(original) - "
              "r(negative)| in that unit; the count below the fold's tie threshold (judged ties); the count with "
              "r(original) > r(negative) (what the probe that never ties gets right), of n. Thresholds: per fold.", "",
              "| setting | tie thresholds | " + " | ".join(
                  f"{SHORT.get(k, 'all kinds')}: median, ties, > 0 of n" for k in kinds) + " |",
              "|---|---|" + "---:|" * len(kinds)]  # fmt: skip
    for spec, s in settings.items():
        m = s["margins"]
        cells = [", ".join(f"{t:.2g}" for t in m["threshold_over_scale"])]
        for k in kinds:
            c = m[k]
            med = "-" if c["median_abs_over_scale"] is None else f"{c['median_abs_over_scale']:.2f}"
            cells.append(f"{med}, {c['below_threshold']}, {c['positive']} of {c['n']}")
        lines.append(f"| {spec} | " + " | ".join(cells) + " |")
    lines += ["", "### Held-out edits that insert a word no training negative inserted", "",
              "A probe may learn the rules engine's words instead of the contradiction. Held-out flips, intensity and "
              "cue edits whose inserted word is none of the words the setting's training negatives inserted (in that "
              "fold): the share preferring the original with threshold 0 and with the calibrated threshold (n).", "",
              "| setting | " + " | ".join(f"{SHORT[k]}: threshold 0, calibrated (n)" for k in KINDS[:3]) + " |",
              "|---|" + "---:|" * 3]  # fmt: skip
    for spec, s in settings.items():
        cells = []
        for k in KINDS[:3]:
            c = s["margins"][k]
            n = c["unseen"]
            cells.append("-" if not n else f"{100 * c['unseen_positive'] / n:.1f}, "
                         f"{100 * c['unseen_decided_positive'] / n:.1f} ({n})")  # fmt: skip
        lines.append(f"| {spec} | " + " | ".join(cells) + " |")
    vis = results["visibility"]
    lines += ["", "### How far one edit moves the frozen features", "",
              "Median distance original-negative over the median distance between the two descriptions of a human "
              f"pair ({vis['human_pair_median_distance']:.2f}, standardised features).", "",
              "| " + " | ".join(SHORT[k] for k in KINDS) + " |", "|" + "---:|" * len(KINDS),
              "| " + " | ".join("-" if vis[k]["median_distance_over_human"] is None
                                else f"{vis[k]['median_distance_over_human']:.3f} (n {vis[k]['n']})"
                                for k in KINDS) + " |"]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="recipes/minilm/rm/config_lora.yaml")
    parser.add_argument("--settings", nargs="+", default=SETTINGS, help="none | all | KIND[+KIND], each [@W]")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=ProbeConfig.epochs, help="L-BFGS iterations of each probe")
    parser.add_argument("--weight-decay", type=float, nargs="+", default=[ProbeConfig.weight_decay],
                        help="the probe's L2 penalty; several: each outer fold picks one by an inner CV on its "
                        "training folds (two-class WAF)")  # fmt: skip
    parser.add_argument("--inner-folds", type=int, default=3, help="folds of that inner CV")
    parser.add_argument("--cache-dir", default=None, help="the feature cache (default: OUTPUT_DIR/features)")
    parser.add_argument("--output-dir", default=None, help="where study.md, study.json and the features go")
    parser.add_argument("--model", default=None, help="another backbone than the recipe's (a tiny one in tests)")
    parser.add_argument("--train-file", default=None, help="other pairs than the recipe's")
    args = parser.parse_args(argv)
    try:
        for spec in args.settings:
            parse_setting(spec)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    overrides = {"report_to": ["none"]}
    overrides.update({"model_name_or_path": args.model} if args.model else {})
    overrides.update({"train_file": args.train_file} if args.train_file else {})
    config = load_config(args.recipe, overrides)
    out = Path(args.output_dir or f"outputs/negatives-study/{Path(args.recipe).parts[-3]}-probe")
    by_id = config.media_root is not None
    pairs = canonical_pairs(read_pairs(config.train_file, media_by_id=by_id).pairs)  # as `train` reads them
    probe = {"epochs": args.epochs, "weight_decay": args.weight_decay, "inner_folds": args.inner_folds}
    results = run_study(args.recipe, overrides, pairs, args.settings, folds=args.folds, probe=probe,
                        cache_dir=Path(args.cache_dir) if args.cache_dir else out / "features")  # fmt: skip
    results["command"] = " ".join(["python scripts/studies/negatives_study.py", *(argv or sys.argv[1:])])
    title = f"Controlled negatives on value-head probes: {args.recipe}, backbone {config.model_name_or_path}"
    table = markdown(results, title)
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / "study.md").write_text(table)
    (out / "study.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

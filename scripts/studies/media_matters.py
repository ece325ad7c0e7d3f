"""Does a multimodal reward model use its video and audio? Train one on a task only the media decide, blank the
media, and judge controlled negatives that contradict the clip.

Usage:
    python scripts/studies/media_matters.py [--clips 256] [--held-out 128] [--work DIR] [--threads 1] \
        [--set KEY=VALUE ...] [--output media_matters.json]

1. Data (tests/multimodal/tiny_media.py::media_task_rows): 1 s clips (warm / cold frames, rising / falling tone);
   a description names the emotion one medium shows and a cue of the other; text alone scores 50% by construction.
2. Train: `emoreward train --config tests/multimodal/config_media_matters.yaml` (a random-weight tiny Omni thinker).
3. `emoreward augment`: emotion flips, contradicted cues and omissions of the held-out clips' right descriptions.
4. `emoreward evaluate --controlled-negatives` on the held-out clips with their media and blanked: accuracy (exact
   95% interval) per kind; per kind of negative, the share preferring the original (Wilson 95%) beside the length
   judge, random and the text-only ceiling. `--work DIR` keeps the files; a rerun reuses them. docs/multimodal.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests" / sub) for sub in ("multimodal", "")]

RECIPE = ROOT / "tests" / "multimodal" / "config_media_matters.yaml"
# the kinds of controlled negatives the task's descriptions allow (no intensity word in them)
NEGATIVE_KINDS = ("emotion_flip", "evidence_contradiction", "modality_omission")
# held-out media variants: name -> media removed
VARIANTS = {"media": (), "blank": ("video", "audio"), "no_video": ("video",), "no_audio": ("audio",)}


def write_set(root: Path, rows: list[dict], blank: tuple[str, ...]) -> Path:
    """The clips and pairs of one set; reused when `root/pairs.jsonl` (written last) already holds these rows."""
    from tiny_media import write_media_task

    pairs = root / "pairs.jsonl"
    if pairs.exists() and [json.loads(line) for line in pairs.read_text().splitlines()] == rows:
        return pairs
    return write_media_task(root, rows, blank=blank)


def text_only_ceiling(rows: list[dict]) -> float:
    """The best two-class accuracy any text-only scorer can reach: per ordered pair of texts, the majority label."""
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for r in rows:
        counts.setdefault((r["description_1"], r["description_2"]), {"1": 0, "2": 0})[r["label"]] += 1
    return sum(max(c.values()) for c in counts.values()) / len(rows)


def negatives_text_only_ceiling(negatives: list) -> dict[str, float]:
    """Per kind, the best share of (original, negative) pairs any text-only scorer can prefer the original on: per
    unordered pair of texts, the side that is the original more often (a text that is the original for one clip
    and the negative for another cannot be told apart without the clip)."""
    out = {}
    for kind in NEGATIVE_KINDS:
        counts: dict[frozenset, Counter] = {}
        of_kind = [n for n in negatives if n.kind == kind]
        for n in of_kind:
            counts.setdefault(frozenset((n.original, n.negative)), Counter())[n.original] += 1
        out[kind] = sum(max(c.values()) for c in counts.values()) / len(of_kind) if of_kind else None
    return out


def controlled(evaluation: dict) -> dict:
    """Per kind of negative, from the report's controlled-error section: n, the share preferring the original and its
    Wilson 95% interval (percent), ties, the length judge's share and interval, random."""
    section = evaluation["controlled_errors"]
    out = {}
    for kind in NEGATIVE_KINDS:
        row = section["kinds"][kind]
        out[kind] = {"n": row["n"], "rate": row["judge"]["rate"], "ci95": row["judge"]["ci95"],
                     "prefers_original": row["judge"]["prefers_original"], "ties": row["judge"]["ties"],
                     "length_judge": row["length_judge"]["rate"], "length_judge_ci95": row["length_judge"]["ci95"],
                     "random": row["random"]}  # fmt: skip
    return out


def accuracy(rows: list[dict], evaluation: dict) -> dict:
    """Two-class accuracy of an `emoreward evaluate` report (ties count wrong), overall and per kind, with exact
    95% intervals and the 95% interval of chance for the same count."""
    from scipy.stats import beta, binom, binomtest

    rewards = evaluation["pair_rewards"]
    if rewards["sample_id"] != [r["sample_id"] for r in rows]:
        raise ValueError("the evaluation's pairs are not the task's rows (sample ids differ)")

    def figures(idx: list[int]) -> dict:
        n = len(idx)
        k = sum(
            (rewards["reward_1"][i] > rewards["reward_2"][i]) == (rows[i]["label"] == "1")
            and rewards["reward_1"][i] != rewards["reward_2"][i]
            for i in idx
        )
        low = beta.ppf(0.025, k, n - k + 1) if k > 0 else 0.0
        high = beta.ppf(0.975, k + 1, n - k) if k < n else 1.0
        return {
            "n": n,
            "correct": int(k),
            "acc": k / n,
            "ci95": [float(low), float(high)],
            "chance_ci95": [float(binom.ppf(0.025, n, 0.5) / n), float(binom.ppf(0.975, n, 0.5) / n)],
            "p_vs_chance": float(binomtest(int(k), n, 0.5).pvalue),
        }

    out = {"all": figures(list(range(len(rows))))}
    for kind in ("colour", "tone"):
        out[kind] = figures([i for i, r in enumerate(rows) if r["kind"] == kind])
    for slot in ("emotion", "cue"):
        out[slot] = figures([i for i, r in enumerate(rows) if r["slot"] == slot])
    out["harness_two_class_acc"] = evaluation["judge"]["two_class"]["acc"]
    out["length_baseline_two_class_acc"] = evaluation["length_baseline"]["two_class"]["acc"]
    out["n_in_sample_pairs"] = evaluation["n_in_sample_pairs"]  # held-out clips: 0 (same texts, other clips)
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=256, help="training clips (pairs), a multiple of 8")
    parser.add_argument("--held-out", type=int, default=128, help="held-out clips (pairs), a multiple of 8")
    parser.add_argument("--work", help="folder for the checkpoint, clips, model and reports (default: temporary)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (tiny models: 1 is fastest)")
    parser.add_argument("--config", default=str(RECIPE), help="the recipe (default: config_media_matters.yaml)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="recipe override")
    parser.add_argument("--output", help="also write the figures as JSON here")
    args = parser.parse_args(argv)

    import torch
    from tiny_media import build_media_task_backbone, media_task_rows

    from emoreward.cli import main as emoreward
    from emoreward.data.negatives import read_negatives

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        # ---- 1. tiny checkpoint and data
        checkpoint = work / "tiny-omni"
        if not (checkpoint / "config.json").exists():
            build_media_task_backbone(checkpoint)
        train_rows = media_task_rows(args.clips, seed=1, prefix="train")
        held_rows = media_task_rows(args.held_out, seed=2, prefix="test")
        train_pairs = write_set(work / "train", train_rows, ())
        held = {name: write_set(work / f"held-out-{name}", held_rows, blank) for name, blank in VARIANTS.items()}
        # controlled negatives of the held-out right descriptions, by the project's generator (one file, every variant)
        negatives = work / "negatives.jsonl"
        kinds = ",".join(NEGATIVE_KINDS)
        argv = ["augment", "--data", str(held["media"]), "--output", str(negatives), "--kinds", kinds]
        if emoreward(argv) != 0:
            raise SystemExit("emoreward augment failed")
        data_seconds = time.perf_counter() - start

        # ---- 2. train through the normal recipe path
        out = work / "run"
        argv = ["train", "--config", args.config, "--output-dir", str(out)]
        for key, value in {
            "model_name_or_path": checkpoint,
            "media_root": work / "train",
            "train_file": train_pairs,
        }.items():
            argv += ["--set", f"{key}={value}"]
        for item in args.set:
            argv += ["--set", item]
        t0 = time.perf_counter()
        if emoreward(argv) != 0:
            raise SystemExit("emoreward train failed")
        train_seconds = time.perf_counter() - t0
        report = json.loads((out / "report.json").read_text())
        log = [e for e in report["final"]["train_log"] if "loss" in e]

        # ---- 3. evaluate on the held-out clips, with and without their media
        result = {
            "train_clips": args.clips,
            "held_out_clips": args.held_out,
            "text_only_ceiling": {"train": text_only_ceiling(train_rows), "held_out": text_only_ceiling(held_rows)},
            "negatives_text_only_ceiling": negatives_text_only_ceiling(read_negatives(negatives)),
            "recipe": args.config,
            "overrides": args.set,
            "train_steps": report["final"]["train_log"][-1]["step"],
            # (step, training loss, batch reward accuracy) every `logging_steps` steps
            "train_log": [(e["step"], e["loss"], e.get("accuracy")) for e in log],
            "seconds": {"data": data_seconds, "train": train_seconds},
        }
        t0 = time.perf_counter()
        for name, pairs in held.items():
            target = out / f"eval-{name}.json"
            # float32: in bf16 (what `auto` picks on an AMX CPU) the blanked clips' tiny reward differences round to
            # exact ties, which count as wrong, and chance would read as below chance
            argv = ["evaluate", "--model", str(out / "model"), "--data", str(pairs), "--media-root", str(pairs.parent),
                    "--controlled-negatives", str(negatives), "--dtype", "float32", "--output", str(target)]  # fmt: skip
            if emoreward(argv) != 0:
                raise SystemExit(f"emoreward evaluate failed on {pairs}")
            evaluation = json.loads(target.read_text())
            result[name] = {**accuracy(held_rows, evaluation), "controlled": controlled(evaluation)}
        result["seconds"]["evaluate"] = time.perf_counter() - t0
    result["seconds"]["total"] = time.perf_counter() - start
    result["torch_threads"] = torch.get_num_threads()
    result["load_average"] = os.getloadavg()

    print()
    print(
        f"{args.clips} training clips, {args.held_out} held-out clips; text-only ceiling "
        f"{result['text_only_ceiling']['held_out']:.0%} (balanced by construction); trained "
        f"{result['train_steps']} steps" + (f", loss {log[0]['loss']:.3f} -> {log[-1]['loss']:.3f}" if log else "")
    )
    for name in VARIANTS:
        a = result[name]
        print(
            f"held-out, {name:9s}: two-class accuracy {a['all']['acc']:.1%} ({a['all']['correct']}/{a['all']['n']}, "
            f"95% CI {a['all']['ci95'][0]:.1%}-{a['all']['ci95'][1]:.1%}; chance interval "
            f"{a['all']['chance_ci95'][0]:.1%}-{a['all']['chance_ci95'][1]:.1%}); colour pairs {a['colour']['acc']:.1%}, "
            f"tone pairs {a['tone']['acc']:.1%}"
        )
    ceiling = result["negatives_text_only_ceiling"]
    for kind in NEGATIVE_KINDS:
        cells = []
        for name in VARIANTS:
            c = result[name]["controlled"][kind]
            cells.append(f"{name} {c['rate']:.1f} [{c['ci95'][0]:.1f}, {c['ci95'][1]:.1f}]")
        length = result["media"]["controlled"][kind]["length_judge"]
        print(
            f"{kind} ({result['media']['controlled'][kind]['n']}): prefers the original, %: {'; '.join(cells)}; "
            f"length judge {length:.1f}, random 50, text-only ceiling {100 * ceiling[kind]:.0f}"
        )
    s = result["seconds"]
    print(
        f"wall time {s['total']:.0f} s (data {s['data']:.0f} s, train {s['train']:.0f} s, evaluate {s['evaluate']:.0f} s); "
        f"load average {result['load_average'][0]:.1f}"
    )
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()

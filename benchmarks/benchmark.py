"""Speed of the reward-model paths as a share of this machine's matrix-multiply peak, measured in the same process.

Usage:
    python benchmarks/benchmark.py [--model DIR] [--paths scoring,smollm2,rank_scoring,rank,train,agreement,main]
        [--short 230] [--threads N] [--n-texts N] [--smollm2-n 64] [--train-steps 8] [--train-profile]
        [--main-args "--set bf16=true"] [--output benchmark.json]

Paths (default: scoring, rank, train, agreement with --model; scoring and train without): scoring (MiniLM, cold and
warm, per scoring mode), smollm2, rank_scoring (rank's cold scoring of OV-MERD), rank (cold, from the cache, and the
CLI with --rank-cli), train (seconds per optimizer step, fp32 and bf16), agreement (bf16 vs fp32 verdicts) and main
(`emoreward train` with the default recipe). Each reports wall time, its precision (`dtype`) and its FLOP rate as a
share of that precision's peak and of the fp32 peak, measured around it. What each path measures: docs/speed.md
("How to measure").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmark_common import (  # noqa: E402
    Peak,
    engine_forward_flops,
    forward_flops,
    load_average,
    peak_rss_gib,
    rate,
    shape_setup_ms,
    step_profiler,
    step_timer,
    training_flops,
)


def fresh_model_dir(work: Path, backbone: str = "minilm") -> Path:
    """A LoRA reward model of the default recipe's shape (fresh adapter and head, seeded), saved like a trained one."""
    import torch
    from peft import LoraConfig

    from emoreward.models.text import TextRewardModel

    torch.manual_seed(0)
    lora = LoraConfig(task_type="SEQ_CLS", r=16, lora_alpha=32, lora_dropout=0.0, init_lora_weights=False)
    model = TextRewardModel.from_backbone(backbone, lora_config=lora)
    return model.save_pretrained(work / f"fresh-{backbone}")


def _texts(n: int | None = None) -> list[str]:
    from emoreward.data import load_pairs

    pairs = load_pairs("emoprefer")
    texts = list(dict.fromkeys(d for p in pairs for d in (p.description_1, p.description_2)))
    return texts[:n] if n else texts


def _flops(model, texts) -> tuple[float, float, int]:
    """Forward FLOPs of scoring `texts` with the merged network (the useful work, whatever the mode): every layer for
    every token (the network's own forward), what the fast forward executes (`engine_forward_flops`; the same where
    the network has none), and the tokens."""
    from emoreward.models.packed import packed_encoder

    merged = model.inference_copy("float32").model
    lengths = [len(model.encode(t).input_ids) for t in texts]
    full = forward_flops(merged, merged.config, lengths, causal=model.settings.input_format == "chat")
    executed = engine_forward_flops(merged, merged.config, lengths) if packed_encoder(merged.eval()) else full
    return full, executed, sum(lengths)


def score_path(model_dir: Path, texts: list[str], short: int, force_bf16: bool) -> dict:
    """Cold short run and warm full run per scoring mode (docs/speed.md, "How to measure")."""
    import torch

    from emoreward.models import load_reward_model
    from emoreward.models.precision import dtype_name, has_bf16_matrix_units

    modes = {"adapter_fp32": None, "auto": "auto", "merged_fp32": "float32"}
    if has_bf16_matrix_units("cpu") or force_bf16:
        modes = {"merged_bf16": "bfloat16", **modes}  # bf16 first: its cold start is measured in a fresh process
    out: dict = {"n_texts": len(texts), "short": short}
    dtypes = [torch.float32] + ([torch.bfloat16] if has_bf16_matrix_units("cpu") or force_bf16 else [])
    out["new_shape_setup"] = {dtype_name(d): shape_setup_ms(d) for d in dtypes}
    reference = load_reward_model(model_dir, dtype=None)
    flops_all, engine_all, tokens_all = _flops(reference, texts)
    flops_short, engine_short, tokens_short = _flops(reference, texts[:short])
    out["tokens"], out["tokens_short"] = tokens_all, tokens_short
    out["gflop_per_token"] = flops_all / tokens_all / 1e9
    results, rewards_of = {}, {}
    for name, dtype in modes.items():
        model = load_reward_model(model_dir, dtype=dtype)
        used = model.scoring_precision
        start = time.perf_counter()
        model.score(texts[:short])  # cold: scoring copy, kernel set-up for new shapes
        cold = time.perf_counter() - start
        rewards, wall, peak = Peak.around(lambda m=model: m.score(texts))
        fast = (
            getattr(model, "scoring_engine", None) is not None
        )  # the fast forward executes less work for the same rewards
        results[name] = {
            "dtype": dtype_name(used),
            "engine": "PackedEncoder" if fast else "network forward",
            "cold_short_seconds": cold,
            "cold_short_descriptions_per_second": short / cold,
            "warm_seconds": wall,
            "descriptions_per_second": len(texts) / wall,
            **rate(engine_all if fast else flops_all, wall, peak, used),
            "cold_rate": rate(engine_short if fast else flops_short, cold, peak, used),
        }
        rewards_of[name] = rewards
    ref = results["adapter_fp32"]
    for name, r in results.items():
        r["speedup_vs_adapter_fp32"] = r["descriptions_per_second"] / ref["descriptions_per_second"]
        r["cold_speedup_vs_adapter_fp32"] = ref["cold_short_seconds"] / r["cold_short_seconds"]
        r["max_abs_reward_diff_vs_adapter_fp32"] = float(abs(rewards_of[name] - rewards_of["adapter_fp32"]).max())
    out["modes"] = results
    return out


def table_forward_flops(model, table) -> tuple[list[int], float, float]:
    """Token counts of a table's distinct (description, subtitle) items, the full forward's FLOPs over them and the
    FLOPs the scoring engine runs (the full count where the model has no engine)."""
    from emoreward.ranking.scoring import table_context

    items = dict.fromkeys((text, table_context(table, s).subtitle) for (s, _), text in table.descriptions.items())
    lengths = [len(model.encode(t, c).input_ids) for t, c in items]
    network, engine = model.scoring_network, getattr(model, "scoring_engine", None)  # (None before the engine)
    full = forward_flops(network, network.config, lengths, causal=model.settings.input_format == "chat")
    executed = engine_forward_flops(network, network.config, lengths) if engine is not None else None
    return lengths, full, executed or full


def cold_table_run(model_dir: Path, cache_file: Path, run) -> dict:
    """The bundled OV-MERD table and `model_dir` loaded (timed), then `run(model, table, ScoreCache(cache_file))`
    into an empty score cache, timed with the peaks around it: what both `rank` paths measure."""
    from emoreward.data.tables import bundled_ovmerd_path, load_description_table
    from emoreward.models import load_reward_model
    from emoreward.ranking.score_cache import ScoreCache

    table = load_description_table(bundled_ovmerd_path())
    wall0, cpu0 = time.perf_counter(), time.process_time()
    model = load_reward_model(model_dir)
    load_wall, load_cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    cache_file.unlink(missing_ok=True)

    def cold():
        start = time.process_time()
        return run(model, table, ScoreCache(cache_file)), time.process_time() - start

    (result, cpu), wall, peak = Peak.around(cold)
    return {"table": table, "model": model, "load_wall": load_wall, "load_cpu": load_cpu, "result": result,
            "cpu": cpu, "wall": wall, "peak": peak, "engine": getattr(model, "scoring_engine", None)}  # fmt: skip


def rank_scoring_path(model_dir: Path, work: Path) -> dict:
    """`rank`'s cold scoring (docs/speed.md, "How to measure")."""
    from emoreward.models.precision import dtype_name
    from emoreward.ranking.scoring import score_table

    run = cold_table_run(model_dir, work / "rank-scoring-cache.jsonl", score_table)
    table, model, scores, cpu, wall, peak = (run[k] for k in ("table", "model", "result", "cpu", "wall", "peak"))
    load_wall, load_cpu, engine = run["load_wall"], run["load_cpu"], run["engine"]
    lengths, full, executed = table_forward_flops(model, table)
    dtype = model.scoring_precision
    return {
        "descriptions": len(table.descriptions),
        "scored": scores.n_scored,
        "tokens": sum(lengths),
        "dtype": dtype_name(dtype),
        "engine": type(engine).__name__ if engine is not None else "network forward",
        "model_load_seconds": load_wall,
        "model_load_cpu_seconds": load_cpu,
        "scoring_seconds": wall,
        "scoring_cpu_seconds": cpu,
        "descriptions_per_second": scores.n_scored / wall,
        "descriptions_per_cpu_second": scores.n_scored / cpu,
        "executed_tflop": executed / 1e12,
        "full_forward_tflop": full / 1e12,
        "full_forward_gflops": full / wall / 1e9,
        **rate(executed, wall, peak, dtype),
    }


def rank_path(model_dir: Path, work: Path, cli: bool) -> dict:
    from emoreward.models.precision import dtype_name
    from emoreward.ranking.rank import rank_with_reward_model
    from emoreward.ranking.score_cache import ScoreCache
    from emoreward.utils.processes import popen_with_parent

    cache_file = work / "rank-cache.jsonl"
    run = cold_table_run(model_dir, cache_file, rank_with_reward_model)
    table, model, result, cpu, wall, peak = (run[k] for k in ("table", "model", "result", "cpu", "wall", "peak"))
    load_seconds, engine = run["load_wall"], run["engine"]
    lengths, _, flops = table_forward_flops(model, table)
    rerun_start = time.perf_counter()
    rank_with_reward_model(model, table, ScoreCache(cache_file))
    rerun = time.perf_counter() - rerun_start
    scoring = result.cost["scoring_seconds"]
    out = {
        "models": table.n_models,
        "samples": table.n_samples,
        "distinct_texts": len(lengths),
        "tokens": sum(lengths),
        "dtype": dtype_name(model.scoring_precision),
        "engine": type(engine).__name__ if engine is not None else "network forward",
        "model_load_seconds": load_seconds,
        "rank_seconds": wall,
        "rank_cpu_seconds": cpu,
        "scoring_seconds": scoring,
        "scoring_descriptions_per_second": result.cost["n_scored"] / scoring,
        "scoring_rate": rate(flops, scoring, peak, model.scoring_precision),
        "fit_seconds": result.cost["fit_seconds"],
        "rerun_from_cache_seconds": rerun,
        **rate(flops, wall, peak, model.scoring_precision),
    }
    if cli:
        for label in ("cli_seconds", "cli_rerun_seconds"):
            start = time.perf_counter()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run(
                [sys.executable, "-m", "emoreward.cli", "rank", "--judge", str(model_dir), "--data", "ovmerd",
                 "--cache-dir", str(work / "cli-cache"), "--output", str(work / "rank.json")],
                check=True, capture_output=True, **popen_with_parent(),
            )  # fmt: skip
            out[label] = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            out[label.replace("seconds", "cpu_seconds")] = (
                after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            )
    return out


def train_path(steps: int, bf16: bool, split: bool = True, profile: bool = False) -> dict:
    """Optimizer steps of the default recipe (MiniLM + LoRA, 16 pairs per step) in one precision, through
    `EmoRewardTrainer` as `emoreward train` runs them: `bf16` is CPU bf16 training (`--set bf16=true`:
    `emoreward.training.cpu_bf16`), else float32; `split`: forward passes in length groups (`LengthSplitAdapter`, as
    `fit_reward_model` runs them), else one padded batch (TRL's way).

    The rate is the useful FLOPs of the timed steps (all but the first: `training_flops` over the real length of
    every sequence they trained on) over their wall time, as a share of the peak of that precision measured around
    the run (`rate`); `padded_share` is the share of padding in the tokens the forward passes computed. `profile`:
    steps 3.. run under `torch.profiler` (so they are slower) and `profile_shares` gives where their time went."""
    import torch

    from emoreward.data import load_pairs
    from emoreward.training.adapters import adapter_for
    from emoreward.training.config import load_config
    from emoreward.training.preprocess import LengthSplitAdapter
    from emoreward.training.step_plan import padded_width, plan_forward_groups
    from emoreward.training.trainer import EmoRewardTrainer

    with tempfile.TemporaryDirectory() as tmp:
        config = load_config(
            overrides={
                "report_to": ["none"],
                "output_dir": tmp,
                "disable_tqdm": True,
                "max_steps": steps,
                "cv_folds": 0,
                "bf16": bf16,
            }
        )
        adapter = adapter_for(config)
        model = adapter.build_model(config)
        dataset, _ = adapter.build_dataset(load_pairs(config.train_file), model, config)
        multiple = config.pad_to_multiple_of or 1
        if split:
            adapter = LengthSplitAdapter(adapter, multiple=multiple)
        collate, batches = adapter.collator(model, config), []

        def recording_collator(examples):  # the real collator; keeps each micro-batch's real sequence lengths
            batch = collate(examples)
            batches.append(batch["attention_mask"].sum(-1).tolist())
            return batch

        timer, profiler = step_timer(), step_profiler() if profile else None
        trainer = EmoRewardTrainer(
            adapter=adapter, model=model.model, args=config, train_dataset=dataset, processing_class=model.tokenizer,
            data_collator=recording_collator, callbacks=[timer] + ([profiler] if profile else []),
        )  # fmt: skip
        _, _, peak = Peak.around(trainer.train)
    accumulation = config.gradient_accumulation_steps
    timed = [n for batch in batches[accumulation : steps * accumulation] for n in batch]  # steps 2..steps
    computed = 0
    for batch in batches[accumulation : steps * accumulation]:
        width = padded_width(max(batch), multiple)
        groups = plan_forward_groups(batch, 3, multiple=multiple) if split else [list(range(len(batch)))]
        computed += sum(len(g) * min(width, padded_width(max(batch[i] for i in g), multiple)) for g in groups)
    seconds = timer.seconds[1:] or timer.seconds
    cpu_seconds = timer.cpu_seconds[1:] or timer.cpu_seconds
    dtype = torch.bfloat16 if config.bf16 else torch.float32
    flops = training_flops(model.model, model.model.config, timed, causal=False)
    return {
        "length_groups": split,
        "steps": steps,
        "pairs_per_step": config.per_device_train_batch_size * accumulation,
        "torch_threads": torch.get_num_threads(),
        "seconds_per_step_median": sorted(seconds)[len(seconds) // 2],
        "first_step_seconds": timer.seconds[0],
        "cpu_seconds_per_step_mean": statistics.mean(cpu_seconds),
        "tokens_timed": sum(timed),
        "padded_share": 1 - sum(timed) / computed if computed else 0.0,
        "pad_to_multiple_of": multiple,
        "bf16": bool(config.bf16),
        "dtype": "bfloat16" if config.bf16 else "float32",  # the matmuls' precision (bf16: autocast)
        **rate(flops, sum(seconds), peak, dtype),
        # the same over CPU seconds per thread: what the steps got of the cores on a loaded machine
        "by_cpu_time": rate(flops, sum(cpu_seconds) / torch.get_num_threads(), peak, dtype),
        **({"profile_shares": profiler.shares()} if profile else {}),
    }


def agreement_path(model_dir: Path) -> dict:
    import torch

    from emoreward.data import load_pairs
    from emoreward.evaluation.judge import RewardModelJudge
    from emoreward.models import load_reward_model
    from emoreward.models.precision import EmulatedBf16Matmuls, has_bf16_matrix_units, verdict_agreement

    pairs = load_pairs("emoprefer")
    model = load_reward_model(model_dir, dtype=None)
    emulate = not has_bf16_matrix_units("cpu")
    rewards = {}
    for dtype in (torch.float32, torch.bfloat16):
        copy = model.inference_copy(dtype)
        with EmulatedBf16Matmuls() if (emulate and dtype == torch.bfloat16) else torch.no_grad():
            rewards[dtype] = RewardModelJudge(copy).pair_rewards(pairs)
    out = verdict_agreement(rewards[torch.float32], rewards[torch.bfloat16], model.settings.tie_threshold)
    out["tie_threshold"] = model.settings.tie_threshold
    out["bf16"] = "emulated (float32 products of bf16 values)" if emulate else "real"
    return out


def main_path(work: Path, extra: str) -> dict:
    """`emoreward train` (default recipe) in a subprocess; useful FLOPs estimated from the data: every fit trains
    `epochs` passes over its pairs (k folds at (k-1)/k of them plus the final fit: k passes over all tokens per
    epoch) and scores every description once (calibration on its training pairs, evaluation of its test fold)."""
    from emoreward.data import load_pairs
    from emoreward.training.adapters import adapter_for
    from emoreward.training.config import load_config
    from emoreward.utils.processes import popen_with_parent

    out_dir = work / "main"
    cmd = [sys.executable, "-m", "emoreward.cli", "train", "--output-dir", str(out_dir), "--set", "report_to=[none]"]
    cmd += shlex.split(extra)
    config = load_config(overrides={"report_to": ["none"], "output_dir": str(out_dir)})
    model = adapter_for(config).build_model(config)
    lengths = [
        len(model.encode(d).input_ids)
        for p in load_pairs(config.train_file)
        for d in (p.description_1, p.description_2)
    ]
    folds = max(config.cv_folds, 1)
    network = model.model
    flops = config.num_train_epochs * folds * training_flops(network, network.config, lengths, causal=False)
    flops += (folds + 1) * forward_flops(network, network.config, lengths, causal=False)
    before = peak_rss_gib(children=True)
    peak_before = Peak.measure()
    start, children = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, capture_output=True, text=True, **popen_with_parent())  # ends with this script
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_seconds = (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime)
    peak_after = Peak.measure()
    if done.returncode:
        raise RuntimeError(f"emoreward train failed:\n{done.stderr[-3000:]}")
    report = json.loads((out_dir / "report.json").read_text())
    summary = report.get("cross_validation", {}).get("summary", {}).get("judge", {})
    peak = Peak((peak_before.fp32 + peak_after.fp32) / 2, (peak_before.bf16 + peak_after.bf16) / 2)
    bf16 = bool(report["recipe"].get("bf16"))  # the resolved value (`auto` resolved by the run)
    dtype = __import__("torch").bfloat16 if bf16 else __import__("torch").float32
    folds = report.get("cross_validation", {}).get("folds", [])
    waf = [f["judge"]["two_class"]["waf"] for f in folds]
    return {
        "command": " ".join(cmd[1:]),
        "dtype": "bfloat16" if bf16 else "float32",
        "wall_seconds": wall,
        "cpu_seconds": cpu_seconds,
        "peak_rss_gib": max(peak_rss_gib(children=True), before),
        "fold_train_seconds": [f.get("train_seconds") for f in folds],
        "final_train_seconds": report.get("final", {}).get("train_seconds"),
        "fold_two_class_waf": waf,
        "two_class_waf_sample_std": statistics.stdev(waf) if len(waf) > 1 else None,
        "useful_tflops": flops / 1e12,
        **rate(flops, wall, peak, dtype),
        "cv_summary": {k: summary.get(k) for k in ("two_class_waf", "two_class_acc", "three_class_waf")},
    }


def share(result: dict) -> str:
    """`"<dtype>, 41% of the bfloat16 peak (130% of the fp32 peak)"`: a path's rate against the peak of the precision
    it computed in (`result["dtype"]`, `rate`'s `of_dtype_peak`), and against the fp32 peak for comparison."""
    dtype = result["dtype"]
    text = f"{dtype}, {100 * result['of_dtype_peak']:.0f}% of the {dtype} peak"
    return text if dtype == "float32" else f"{text} ({100 * result['of_fp32_peak']:.0f}% of the fp32 peak)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a trained reward-model directory (rank, agreement; scoring uses it too)")
    parser.add_argument("--paths", help="comma-separated: scoring,smollm2,rank_scoring,rank,train,agreement,main")
    parser.add_argument("--short", type=int, default=230, help="descriptions of the cold short run")
    parser.add_argument(
        "--n-texts", type=int, help="scoring path: the first N bundled descriptions (default: all 918)"
    )
    parser.add_argument("--smollm2-n", type=int, default=64, help="descriptions scored with SmolLM2")
    parser.add_argument("--train-steps", type=int, default=8)
    parser.add_argument(
        "--train-one-padded-batch", action="store_true", help="train path: also fp32 in one padded batch (TRL's way)"
    )
    parser.add_argument(
        "--train-profile",
        action="store_true",
        help="train path: where the step's time goes (torch.profiler, steps 3..)",
    )
    parser.add_argument("--rank-cli", action="store_true", help="also time `emoreward rank` in a subprocess")
    parser.add_argument("--force-bf16", action="store_true", help="time bf16 scoring even without bf16 units")
    parser.add_argument("--main-args", default="", help="extra arguments of the `main` path's `emoreward train`")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's, one per core)")
    parser.add_argument("--output", default="benchmark.json")
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)  # 1: CPU seconds that a loaded machine leaves comparable

    from emoreward.models.precision import cpu_flags, has_bf16_matrix_units

    default = "scoring,rank,train,agreement" if args.model else "scoring,train"
    paths = (args.paths or default).split(",")
    units = sorted({"amx_bf16", "avx512_bf16", "bf16"} & cpu_flags())
    peak = Peak.measure()
    results: dict = {
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "bf16_matrix_units": has_bf16_matrix_units("cpu"),
        "bf16_cpu_flags": units,
        "load_before": load_average(),
        "peak_fp32_gflops": peak.fp32,
        "peak_bf16_gflops": peak.bf16,
    }
    print(
        f"{torch.get_num_threads()} torch threads on {os.cpu_count()} CPUs, load {results['load_before']}; matmul "
        f"peak fp32 {peak.fp32:.0f} GFLOP/s, bf16 {peak.bf16:.0f} GFLOP/s; bf16 matrix units: "
        f"{results['bf16_matrix_units']} ({', '.join(units) or 'no amx_bf16 / avx512_bf16 / bf16 flag'})"
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = Path(args.model) if args.model else None
        if "scoring" in paths:
            r = results["scoring_minilm"] = score_path(
                model_dir or fresh_model_dir(work),
                _texts(args.n_texts),
                min(args.short, args.n_texts or args.short),
                args.force_bf16,
            )
            for dt, setup in r["new_shape_setup"].items():
                print(f"new matrix shape, {dt}: {setup['mean_first_call_extra_ms']:.1f} ms extra on its first use")
            for name, m in r["modes"].items():
                print(
                    f"scoring MiniLM [{name}, {m['dtype']}]: {m['descriptions_per_second']:.1f} descriptions/s warm "
                    f"({m['gflops']:.1f} GFLOP/s = {share(m)}), x{m['speedup_vs_adapter_fp32']:.2f} "
                    f"vs adapter fp32; cold {r['short']} descriptions {m['cold_short_seconds']:.2f} s "
                    f"(x{m['cold_speedup_vs_adapter_fp32']:.2f}); max |reward diff| "
                    f"{m['max_abs_reward_diff_vs_adapter_fp32']:.1e}"
                )
        if "smollm2" in paths:
            texts = _texts(args.smollm2_n)
            r = results["scoring_smollm2"] = score_path(
                fresh_model_dir(work, "smollm2"), texts, min(args.short, len(texts) // 2), args.force_bf16
            )
            for name, m in r["modes"].items():
                print(
                    f"scoring SmolLM2 [{name}, {m['dtype']}]: {m['descriptions_per_second']:.2f} descriptions/s "
                    f"({share(m)}), x{m['speedup_vs_adapter_fp32']:.2f}"
                )
        if "rank_scoring" in paths and model_dir:
            r = results["rank_scoring_ovmerd"] = rank_scoring_path(model_dir, work)
            print(
                f"rank scoring 10 x 332, cold [{r['dtype']}, {r['engine']}]: {r['scored']} descriptions in "
                f"{r['scoring_seconds']:.2f} s wall / {r['scoring_cpu_seconds']:.2f} s CPU = "
                f"{r['descriptions_per_second']:.0f} descriptions/s ({r['gflops']:.0f} GFLOP/s executed = {share(r)}; "
                f"{r['full_forward_gflops']:.0f} GFLOP/s of full-forward work); model load {r['model_load_seconds']:.2f} s "
                f"wall / {r['model_load_cpu_seconds']:.2f} s CPU"
            )
        if "rank" in paths and model_dir:
            r = results["rank_ovmerd"] = rank_path(model_dir, work, args.rank_cli)
            sr = r["scoring_rate"]
            print(
                f"rank 10 x 332 [{r['dtype']}, {r['engine']}]: {r['rank_seconds']:.1f} s for {r['distinct_texts']} "
                f"texts ({r['gflops']:.1f} GFLOP/s = {share(r)}); scoring {r['scoring_seconds']:.1f} s = "
                f"{r['scoring_descriptions_per_second']:.0f} descriptions/s ({sr['gflops']:.0f} GFLOP/s = "
                f"{share({**sr, 'dtype': r['dtype']})}), fits {r['fit_seconds']:.2f} s; rerun from cache "
                f"{r['rerun_from_cache_seconds']:.2f} s, model load {r['model_load_seconds']:.1f} s"
                + (
                    f"; CLI {r['cli_seconds']:.1f} s ({r['cli_cpu_seconds']:.1f} s CPU), CLI rerun "
                    f"{r['cli_rerun_seconds']:.1f} s ({r['cli_rerun_cpu_seconds']:.1f} s CPU)"
                    if "cli_seconds" in r
                    else ""
                )
            )
        if "train" in paths:
            precisions = [False] + ([True] if has_bf16_matrix_units("cpu") else [])
            runs = [(bf16, True) for bf16 in precisions] + ([(False, False)] if args.train_one_padded_batch else [])
            for bf16, split in runs:
                name = f"train_step_{'bf16' if bf16 else 'fp32'}" + ("" if split else "_one_padded_batch")
                r = results[name] = train_path(args.train_steps, bf16, split, args.train_profile)
                print(
                    f"training step [{r['dtype']}] (16 pairs, {'length groups' if split else 'one padded batch'}, "
                    f"{r['torch_threads']} threads): {r['seconds_per_step_median']:.2f} s median wall, "
                    f"{r['cpu_seconds_per_step_mean']:.2f} s CPU ({r['gflops']:.1f} GFLOP/s useful = {share(r)}; "
                    f"by CPU time {100 * r['by_cpu_time']['of_dtype_peak']:.0f}%); "
                    f"padding {100 * r['padded_share']:.1f}% of the computed tokens"
                )
                if "profile_shares" in r:
                    print("  profile: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in r["profile_shares"].items()))
        if "agreement" in paths and model_dir:
            r = results["bf16_agreement"] = agreement_path(model_dir)
            print(
                f"bf16 vs fp32 ({r['bf16']}): {100 * r['agreement']:.2f}% of {r['n_pairs']} verdicts agree "
                f"({r['n_changed']} change), max |reward diff| {r['max_abs_reward_diff']:.2e}"
            )
        if "main" in paths:
            r = results["main_job"] = main_path(work, args.main_args)
            print(
                f"main job [{r['dtype']}] (5-fold CV + final fit): {r['wall_seconds']:.0f} s wall, "
                f"{r['cpu_seconds']:.0f} s CPU, peak RSS {r['peak_rss_gib']:.2f} GiB, folds trained in "
                f"{', '.join(f'{s:.0f}' for s in r['fold_train_seconds'])} s, "
                f"final fit {r['final_train_seconds']:.0f} s, "
                f"{r['useful_tflops']:.0f} TFLOP useful = {r['gflops']:.1f} GFLOP/s = {share(r)} "
                f"(peaks measured before and after only); CV {r['cv_summary']}"
            )
    results["load_after"] = load_average()
    results["peak_rss_gib"] = peak_rss_gib()
    Path(args.output).write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"load after {results['load_after']}; wrote {args.output}")


if __name__ == "__main__":
    main()

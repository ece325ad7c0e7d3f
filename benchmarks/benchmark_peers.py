"""This project's paths side by side with what a user would pick instead, on the same work, in one run: the ratio of
each path's speed to each peer's, and what each gives (held-out accuracy, reward agreement, estimate agreement).

Usage:
    python benchmarks/benchmark_peers.py [--sections train,score,rank] [--threads 2] [--dtype auto]
        [--train-pairs 360] [--heldout 90] [--epochs 1] [--score-n 256] [--clients 16] [--requests-per-client 4]
        [--vllm-venv .venv-vllm] [--n-boot 200] [--tables ovmerd,synthetic] [--synthetic 40x400x20]
        [--time-limit 900] [--output peers.json] [--markdown peers.md]

Sections (every case runs or prints why it cannot): train (`emoreward train`'s fit against plain TRL RewardTrainer
+ peft), score (`load_reward_model(...).score` against plain transformers, `emoreward serve` against vLLM's CPU
build) and rank (the Bradley-Terry fits and bootstrap against `choix`). Servers run on 127.0.0.1 only; every
section is bounded by its counts and by `--time-limit`. What each case runs: docs/speed.md ("How to
measure"); figures: docs/speed.md ("What to expect") and benchmarks/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from benchmark_common import load_average, median_time  # noqa: E402


RECIPE = ROOT / "recipes" / "minilm" / "rm" / "config_lora.yaml"
DEFAULT_VLLM_VENV = ".venv-vllm"  # `make install-vllm` makes it


def load1() -> float:
    return round(os.getloadavg()[0], 2)


# ---------------------------------------------------------------------------------------------- training
def split_pairs(train_n: int, heldout_n: int, seed: int = 0):
    """The bundled EmoPrefer pairs with a decided label, shuffled with `seed`: (`train_n` to train on, the next
    `heldout_n` held out). The same split for every path."""
    from emoreward.data import load_pairs

    pairs = [p for p in load_pairs("emoprefer") if p.label in ("1", "2")]
    random.Random(seed).shuffle(pairs)
    if train_n + heldout_n > len(pairs):
        raise SystemExit(f"--train-pairs + --heldout = {train_n + heldout_n} > the {len(pairs)} decided pairs")
    return pairs[:train_n], pairs[train_n : train_n + heldout_n]


def chosen_rejected(pair) -> tuple[str, str]:
    return (pair.description_1, pair.description_2) if pair.label == "1" else (pair.description_2, pair.description_1)


def heldout_accuracy(rewards_chosen, rewards_rejected) -> float:
    return float(sum(c > r for c, r in zip(rewards_chosen, rewards_rejected)) / len(rewards_chosen))


def worker_ours(args, out_dir: Path) -> dict:
    """`fit_reward_model` as `emoreward train` runs one fit (no folds), then the held-out accuracy with the saved
    model's own scoring; the model is saved for the scoring section."""
    import torch

    from emoreward.models import load_reward_model
    from emoreward.training.config import load_config
    from emoreward.training.pipeline import fit_reward_model

    train, heldout = split_pairs(args.train_pairs, args.heldout)
    overrides = {"report_to": ["none"], "output_dir": str(out_dir / "ours-run"), "disable_tqdm": True,
                 "cv_folds": 0, "num_train_epochs": args.epochs, "bf16": args.dtype_resolved == "bfloat16",
                 "calibrate_tie_threshold": False}  # fmt: skip
    config = load_config(RECIPE, overrides=overrides)
    cpu = time.process_time()  # the fit: model built, pairs encoded, trained (no save, no tie calibration)
    fit = fit_reward_model(config, train, output_dir=out_dir / "ours-run", run_name="peers-ours", save=False)
    cpu = time.process_time() - cpu
    steps = max(h.get("step", 0) for h in fit.log_history)
    trained = fit.exclusions.n_kept * args.epochs
    model_dir = fit.model.save_pretrained(out_dir / "ours-model")
    model = load_reward_model(model_dir)
    chosen, rejected = zip(*map(chosen_rejected, heldout))
    rc, rr = model.score(list(chosen)), model.score(list(rejected))
    return {
        "path": "emoreward (fit_reward_model: EmoRewardTrainer)",
        "torch_threads": torch.get_num_threads(),
        "dtype": args.dtype_resolved,
        "pairs_trained": trained,
        "optimizer_steps": steps,
        "train_seconds": fit.train_seconds,
        "pairs_per_second": trained / fit.train_seconds,
        "fit_cpu_seconds": cpu,
        "pairs_per_cpu_second": trained / cpu,
        "heldout_accuracy": heldout_accuracy(rc, rr),
        "heldout_scoring_dtype": str(model.scoring_precision).replace("torch.", ""),
        "final_loss": next((h["train_loss"] for h in reversed(fit.log_history) if "train_loss" in h), None),
        "model_dir": str(model_dir),
        "load_1min": load1(),
    }


def worker_trl(args, out_dir: Path) -> dict:
    """Plain TRL: `RewardTrainer` + `peft.LoraConfig` on the MiniLM weights, pre-tokenized pairs (the tokenizer's own
    `[CLS] description [SEP]`: TRL's text path appends `eos_token`, which a BERT tokenizer does not have), the
    recipe's hyper-parameters, TRL's defaults otherwise (random batches, one padded forward per batch)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    from emoreward.models.backbones import get_backbone
    from emoreward.training.config import load_config

    recipe = load_config(RECIPE, overrides={"report_to": ["none"], "output_dir": str(out_dir / "trl-run")})
    spec = get_backbone(recipe.model_name_or_path)
    path = spec.resolve()
    tokenizer = AutoTokenizer.from_pretrained(path)
    train, heldout = split_pairs(args.train_pairs, args.heldout)
    ids = [chosen_rejected(p) for p in train]
    data = {"chosen_ids": [tokenizer(c)["input_ids"] for c, _ in ids],
            "rejected_ids": [tokenizer(r)["input_ids"] for _, r in ids]}  # fmt: skip
    config = RewardConfig(
        output_dir=str(out_dir / "trl-run"), report_to=[], disable_tqdm=True, save_strategy="no",
        num_train_epochs=args.epochs, per_device_train_batch_size=recipe.per_device_train_batch_size,
        gradient_accumulation_steps=recipe.gradient_accumulation_steps, learning_rate=recipe.learning_rate,
        lr_scheduler_type=recipe.lr_scheduler_type, warmup_steps=recipe.warmup_steps,
        weight_decay=recipe.weight_decay, max_length=recipe.max_length, seed=recipe.seed,
        bf16=args.dtype_resolved == "bfloat16", use_cpu=True, logging_steps=recipe.logging_steps,
    )  # fmt: skip
    lora = LoraConfig(task_type="SEQ_CLS", r=recipe.lora_r, lora_alpha=recipe.lora_alpha,
                      lora_dropout=recipe.lora_dropout,
                      target_modules=list(recipe.lora_target_modules or spec.lora_target_modules))  # fmt: skip
    cpu = time.process_time()  # the fit: model built, pairs prepared, trained
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=torch.float32)
    trainer = RewardTrainer(model=model, args=config, train_dataset=Dataset.from_dict(data),
                            processing_class=tokenizer, peft_config=lora)  # fmt: skip
    kept = len(trainer.train_dataset)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu
    network = trainer.model.eval()
    chosen, rejected = zip(*map(chosen_rejected, heldout))

    def rewards(texts) -> list[float]:
        out = []
        with torch.inference_mode():
            for k in range(0, len(texts), 32):
                batch = tokenizer(list(texts[k : k + 32]), padding=True, return_tensors="pt")
                out += network(**batch).logits[:, 0].float().tolist()
        return out

    return {
        "path": "plain TRL RewardTrainer + PEFT LoRA",
        "torch_threads": torch.get_num_threads(),
        "dtype": args.dtype_resolved + (" (autocast)" if args.dtype_resolved == "bfloat16" else ""),
        "pairs_trained": kept * args.epochs,
        "optimizer_steps": trainer.state.global_step,
        "train_seconds": seconds,
        "pairs_per_second": kept * args.epochs / seconds,
        "fit_cpu_seconds": cpu,
        "pairs_per_cpu_second": kept * args.epochs / cpu,
        "heldout_accuracy": heldout_accuracy(rewards(chosen), rewards(rejected)),
        "heldout_scoring_dtype": "float32",
        "final_loss": next((h["train_loss"] for h in reversed(trainer.state.log_history) if "train_loss" in h), None),
        "load_1min": load1(),
    }


def run_worker(kind: str, args, work: Path, dtype: str) -> dict:
    """One training path in a fresh process (no state shared between the two paths)."""
    work.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--work", str(work),
           "--threads", str(args.threads), "--dtype", dtype, "--train-pairs", str(args.train_pairs),
           "--heldout", str(args.heldout), "--epochs", str(args.epochs)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(args.threads)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode:
        return {"error": f"{kind} worker exited {done.returncode}: {done.stderr.strip()[-2000:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def train_section(args, work: Path) -> dict:
    """Both training paths in each of `--train-dtypes` (default: the run's precision), ours first."""
    out = {}
    for dtype in args.train_dtypes:
        row = {"ours": run_worker("ours", args, work / f"train-{dtype}", dtype),
               "trl": run_worker("trl", args, work / f"train-{dtype}", dtype)}  # fmt: skip
        ours, trl = row["ours"], row["trl"]
        if "error" not in ours and "error" not in trl:
            row["ratio_pairs_per_second"] = ours["pairs_per_second"] / trl["pairs_per_second"]
            row["ratio_pairs_per_cpu_second"] = ours["pairs_per_cpu_second"] / trl["pairs_per_cpu_second"]
            row["heldout_accuracy_difference"] = ours["heldout_accuracy"] - trl["heldout_accuracy"]
        out[dtype] = row
    return out


# ---------------------------------------------------------------------------------------------- scoring
def cpu_timed(run) -> tuple[object, float, float]:
    """(`run()`, its wall seconds, the CPU seconds of this process during it, all threads)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = run()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def rate_row(n: int, seconds: float, cpu: float, **extra) -> dict:
    return {"descriptions": n, "seconds": seconds, "descriptions_per_second": n / seconds, "cpu_seconds": cpu,
            "descriptions_per_cpu_second": n / cpu if cpu > 0 else None, **extra, "load_1min": load1()}  # fmt: skip


def plain_transformers_rewards(
    export_dir: Path, texts: list[str], dtype, max_length: int
) -> tuple[list, float, float]:
    """What a user writes with transformers alone: the export read by `AutoModelForSequenceClassification`, batches
    of 32 in the given order, padded, truncated at `max_length`. (rewards, wall and CPU seconds of the timed pass)"""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(export_dir)
    model = AutoModelForSequenceClassification.from_pretrained(export_dir, dtype=dtype).eval()

    def run(batch_texts):
        out = []
        with torch.inference_mode():
            for k in range(0, len(batch_texts), 32):
                enc = tokenizer(batch_texts[k : k + 32], padding=True, truncation=True, max_length=max_length,
                                return_tensors="pt")  # fmt: skip
                out += model(**enc).logits[:, 0].float().tolist()
        return out

    run(texts[:32])  # warm-up
    return cpu_timed(lambda: run(texts))


async def plain_per_sample(host: str, port: int, path: str, payloads: list[dict], clients: int) -> dict:
    """`clients` clients, each posting its share of `payloads` one request at a time on a new connection
    (OpenRLHF's pattern, `benchmark_server.post_once`); the replies and the wall time."""
    from benchmark_server import post_once

    replies: list = [None] * len(payloads)

    async def client(c: int) -> None:
        for k in range(c, len(payloads), clients):
            replies[k] = await post_once(host, port, path, json.dumps(payloads[k]).encode())

    start = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return {"replies": replies, "seconds": time.perf_counter() - start}


def serve_rows(model_dir: Path, texts: list[str], args, reference) -> dict:
    """`emoreward serve` on `model_dir` (a subprocess, `--threads` torch threads): OpenRLHF's per-sample client, verl's
    `compute_score_async`, and the plain per-sample client on `/v1/rewards` (rewards compared with `reference`)."""
    import benchmark_server as bs

    proc, port = bs.start_server(ROOT, model_dir, [], args.threads)
    rows = {}
    try:
        asyncio.run(bs.per_sample("127.0.0.1", port, list(texts[:64]), 8, 2))  # warm-up
        n = args.clients * args.requests_per_client
        for name, run in (
            ("openrlhf", lambda: bs.per_sample("127.0.0.1", port, list(texts), args.clients, args.requests_per_client)),
            ("verl", lambda: bs.verl_per_sample(f"http://127.0.0.1:{port}", list(texts), args.clients,
                                                args.requests_per_client)),
        ):  # fmt: skip
            cpu, calls = bs.tree_cpu_seconds(proc.pid), asyncio.run(bs.model_calls("127.0.0.1", port))
            r = asyncio.run(run())
            cpu = bs.tree_cpu_seconds(proc.pid) - cpu
            calls = asyncio.run(bs.model_calls("127.0.0.1", port)) - calls
            rows[name] = rate_row(r["descriptions"], r["wall_s"], cpu, lost=r["lost"], p50_ms=r["p50_ms"],
                                  descriptions_per_model_call=r["descriptions"] / max(calls, 1))  # fmt: skip
        payloads = [{"descriptions": [texts[k % len(texts)]]} for k in range(n)]
        cpu, calls = bs.tree_cpu_seconds(proc.pid), asyncio.run(bs.model_calls("127.0.0.1", port))
        r = asyncio.run(plain_per_sample("127.0.0.1", port, "/v1/rewards", payloads, args.clients))
        cpu = bs.tree_cpu_seconds(proc.pid) - cpu
        calls = asyncio.run(bs.model_calls("127.0.0.1", port)) - calls
        got = [reply["rewards"][0] for reply in r["replies"]]
        want = [reference[k % len(texts)] for k in range(n)]
        rows["plain"] = rate_row(n, r["seconds"], cpu, descriptions_per_model_call=n / max(calls, 1),
                                 max_abs_reward_diff=max(abs(a - b) for a, b in zip(got, want)))  # fmt: skip
    finally:
        bs.stop_server(proc)
    return rows


def vllm_rows(export_dir: Path, texts: list[str], args, reference, dtype_name: str) -> dict:
    """vLLM's CPU build serving the export (`--runner pooling`), the plain per-sample client on `/classify`
    (`use_activation: false`: the raw value-head output) and one request of every description. Says why when the
    venv is missing or the server does not start."""
    import benchmark_server as bs

    python = Path(args.vllm_venv) / "bin" / "python"
    # the stamp `make install-vllm` writes once the venv is complete (Makefile: VLLM_STAMP)
    if not (Path(args.vllm_venv) / ".emoreward-vllm").exists() or not python.exists():
        return {
            "error": f"vLLM venv not found at {args.vllm_venv} (no bin/python or install stamp: make install-vllm)"
        }
    port = bs.free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": str(args.threads),
           "VLLM_CPU_OMP_THREADS_BIND": "nobind"}  # fmt: skip
    env.pop("PYTHONPATH", None)
    log = open(Path(args.work_dir) / "vllm.log", "w")  # noqa: SIM115 (closed below)
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(export_dir), "--runner",
           "pooling", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype_name,
           "--max-model-len", "512"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + args.vllm_start_timeout
        while time.time() < deadline:
            if proc.poll() is not None:
                return {"error": f"vLLM server exited {proc.returncode}: "
                                 + (Path(args.work_dir) / "vllm.log").read_text()[-1500:]}  # fmt: skip
            try:
                asyncio.run(bs.get_json("127.0.0.1", port, "/v1/models"))
                break
            except (OSError, ValueError, IndexError):
                time.sleep(1)
        else:
            return {"error": f"vLLM server not up within {args.vllm_start_timeout} s"}
        model = str(export_dir)
        n = args.clients * args.requests_per_client
        one = [{"model": model, "input": [texts[k % len(texts)]], "use_activation": False} for k in range(n)]
        asyncio.run(plain_per_sample("127.0.0.1", port, "/classify", one[:16], 8))  # warm-up
        cpu = bs.tree_cpu_seconds(proc.pid)
        r = asyncio.run(plain_per_sample("127.0.0.1", port, "/classify", one, args.clients))
        cpu = bs.tree_cpu_seconds(proc.pid) - cpu
        got = [reply["data"][0]["probs"][0] for reply in r["replies"]]
        want = [reference[k % len(texts)] for k in range(n)]
        rows = {
            "plain": rate_row(n, r["seconds"], cpu, max_abs_reward_diff=max(abs(a - b) for a, b in zip(got, want)))
        }
        whole = [{"model": model, "input": list(texts), "use_activation": False}]
        cpu = bs.tree_cpu_seconds(proc.pid)
        r = asyncio.run(plain_per_sample("127.0.0.1", port, "/classify", whole, 1))
        rows["one_request"] = rate_row(len(texts), r["seconds"], bs.tree_cpu_seconds(proc.pid) - cpu)
        return rows
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def ratios(ours: dict, peer: dict) -> dict:
    """Ours / the peer's descriptions per second: wall clock, and per CPU-second (what a loaded machine moves less)."""
    cpu = ours["descriptions_per_cpu_second"], peer["descriptions_per_cpu_second"]
    return {"wall": ours["descriptions_per_second"] / peer["descriptions_per_second"],
            "cpu": cpu[0] / cpu[1] if None not in cpu else None}  # fmt: skip


def score_section(args, work: Path, model_dir: Path | None) -> dict:
    import torch
    from benchmark import _texts, fresh_model_dir

    from emoreward.export.hf import export_hf
    from emoreward.models import load_reward_model

    torch.set_num_threads(args.threads)
    model_dir = model_dir or fresh_model_dir(work)
    texts = _texts(args.score_n)
    export_dir = work / "export"
    export_hf(model_dir, export_dir)
    dtype = getattr(torch, args.dtype_resolved)
    model = load_reward_model(model_dir, dtype=args.dtype_resolved)
    model.score(texts[:32])  # warm-up: the scoring copy, kernel set-up
    rewards, seconds, cpu = cpu_timed(lambda m=model: m.score(texts))
    reference = [float(r) for r in rewards]
    out: dict = {"descriptions": len(texts), "dtype": args.dtype_resolved, "torch_threads": args.threads}
    out["ours_in_process"] = rate_row(len(texts), seconds, cpu)
    plain, seconds, cpu = plain_transformers_rewards(export_dir, texts, dtype, model.settings.max_length)
    out["transformers"] = rate_row(len(texts), seconds, cpu,
                                   max_abs_reward_diff=max(abs(a - b) for a, b in zip(plain, reference)))  # fmt: skip
    out["ratio_in_process_vs_transformers"] = ratios(out["ours_in_process"], out["transformers"])
    del model
    out["serve"] = serve_rows(model_dir, texts, args, reference)
    out["vllm"] = vllm_rows(export_dir, texts, args, reference, args.dtype_resolved)
    if "error" not in out["vllm"]:
        v = out["vllm"]
        out["ratio_serve_vs_vllm_per_sample"] = ratios(out["serve"]["plain"], v["plain"])
        out["ratio_in_process_vs_vllm_one_request"] = ratios(out["ours_in_process"], v["one_request"])
    return out


# ---------------------------------------------------------------------------------------------- ranking
def length_judge_records(tie_share: float = 0.05):
    """Pairwise records of the bundled OV-MERD table judged by length alone: for every sample and pair of models the
    longer description wins, lengths within `tie_share` of the longer one tie."""
    from itertools import combinations

    from emoreward.data.tables import bundled_ovmerd_path, load_description_table
    from emoreward.data.verdicts import Verdict
    from emoreward.ranking.records import PairwiseRecord

    table = load_description_table(bundled_ovmerd_path())
    by_sample: dict = {}
    for (sample, model), text in table.descriptions.items():
        by_sample.setdefault(sample, {})[model] = len(text)
    records = []
    for sample, lengths in by_sample.items():
        for a, b in combinations(sorted(lengths), 2):
            la, lb = lengths[a], lengths[b]
            verdict = Verdict.TIE if abs(la - lb) <= tie_share * max(la, lb) else (
                Verdict.FIRST if la > lb else Verdict.SECOND)  # fmt: skip
            records.append(PairwiseRecord(a, b, verdict, sample=sample))
    return records


def choix_data(wins, scale: int = 1) -> list[tuple[int, int]]:
    """choix's pairwise data (winner, loser) from a win matrix of integer (after x `scale`) counts."""
    import numpy as np

    counts = np.rint(np.asarray(wins) * scale).astype(int)
    if not np.allclose(counts, np.asarray(wins) * scale):
        raise ValueError("counts are not integers after scaling")
    return [(i, j) for i, j in zip(*np.nonzero(counts)) for _ in range(counts[i, j])]


def gauge(x):
    import numpy as np

    x = np.asarray(x, dtype=float)
    return x - x.mean()


def compare_fit(name: str, ours_fn, peer_fn, repeats: int) -> dict:
    """Both fits timed (median of `repeats`; a peer fit over a second runs once), and the largest difference of
    their mean-zero log-strengths."""
    import numpy as np

    ours, t_ours = median_time(ours_fn, repeats)
    peer, t_peer = median_time(peer_fn, 1)
    if t_peer < 1.0 and repeats > 1:
        peer, t_peer = median_time(peer_fn, repeats)
    return {"case": name, "ours_seconds": t_ours, "peer_seconds": t_peer, "ratio": t_peer / t_ours,
            "max_abs_diff": float(np.abs(gauge(ours) - gauge(peer)).max()), "load_1min": load1()}  # fmt: skip


def bootstrap_compare(records, n_boot: int) -> dict:
    """`bootstrap_ci` of the MLE (every resample fitted at once) against `choix.ilsr_pairwise_dense` refitted on
    each of the same resamples (the resample weights of `emoreward.ranking.bootstrap.resample_unit_weights`,
    seed 0; ties dropped)."""
    import choix
    import numpy as np

    from emoreward.ranking.bootstrap import bootstrap_ci, resample_unit_weights, sample_units
    from emoreward.ranking.bradley_terry import fit_bradley_terry
    from emoreward.ranking.counts import encode_records

    fit = functools.partial(fit_bradley_terry, prior_variance=None)
    start = time.perf_counter()
    ci = bootstrap_ci(records, fit, n_boot=n_boot, seed=0)
    t_ours = time.perf_counter() - start
    start = time.perf_counter()
    encoded = encode_records(records)
    units, n_units = sample_units([r.sample for r in records])
    weights = resample_unit_weights(n_units, n_boot, 0)
    m = len(encoded.items)
    decided = encoded.outcome != 2
    first_won = encoded.outcome == 0
    winner = np.where(first_won, encoded.a, encoded.b)[decided]
    loser = np.where(first_won, encoded.b, encoded.a)[decided]
    unit = units[decided]
    peer = np.empty((n_boot, m))
    for b in range(n_boot):
        wins = np.zeros((m, m))
        np.add.at(wins, (winner, loser), weights[b, unit])
        peer[b] = gauge(choix.ilsr_pairwise_dense(wins, alpha=0.0, tol=1e-12, max_iter=10000))
    t_peer = time.perf_counter() - start
    ours = ci.scores - ci.scores.mean(axis=1, keepdims=True)
    return {"case": f"bootstrap of the MLE, {n_boot} resamples, vs ilsr_pairwise_dense per resample",
            "ours_seconds": t_ours, "peer_seconds": t_peer, "ratio": t_peer / t_ours,
            "max_abs_diff": float(np.abs(ours - peer).max()), "load_1min": load1()}  # fmt: skip


def rank_section(args) -> dict:
    import choix
    from benchmark_ranking import simulate

    from emoreward.ranking.bradley_terry import fit_binarized_bradley_terry, fit_bradley_terry
    from emoreward.ranking.counts import PairwiseCounts

    prior = 10.0
    alpha = 1 / (2 * prior)  # choix's penalty alpha * ||s||^2 = a Gaussian prior of variance 1 / (2 alpha)
    m_syn, s_syn, per = (int(x) for x in args.synthetic.split("x"))
    chosen = args.tables.split(",")
    unknown = set(chosen) - {"ovmerd", "synthetic"}
    if unknown:
        raise SystemExit(f"--tables: unknown {sorted(unknown)}; choose from ovmerd,synthetic")
    tables = {}
    if "ovmerd" in chosen:
        tables["OV-MERD length judge"] = length_judge_records()
    if "synthetic" in chosen:
        tables[f"synthetic {m_syn}x{s_syn}x{per}"] = None
    out: dict = {"prior_variance": prior, "choix_alpha": alpha, "tables": {}}
    for label in list(tables):
        records = tables[label] if tables[label] is not None else simulate(m_syn, s_syn, per)[1]
        counts = PairwiseCounts.from_records(records)
        m = counts.n_items
        data = choix_data(counts.wins)
        half = counts.wins + 0.5 * counts.ties
        w = counts.binarized("half").wins
        r = args.repeats
        rows = [
            compare_fit("BT MAP (ties dropped) vs opt_pairwise",
                        lambda c=counts: fit_bradley_terry(c, prior_variance=prior).scores,
                        lambda d=data, m=m: choix.opt_pairwise(m, d, alpha=alpha, tol=1e-10), r),
            compare_fit("BT MLE vs ilsr_pairwise",
                        lambda c=counts: fit_bradley_terry(c, prior_variance=None).scores,
                        lambda d=data, m=m: choix.ilsr_pairwise(m, d, alpha=0.0, tol=1e-12, max_iter=10000), r),
            compare_fit("BT MLE vs ilsr_pairwise_dense (the counts matrix)",
                        lambda c=counts: fit_bradley_terry(c, prior_variance=None).scores,
                        lambda c=counts: choix.ilsr_pairwise_dense(c.wins, alpha=0.0, tol=1e-12, max_iter=10000), r),
            compare_fit("BT MLE vs mm_pairwise",
                        lambda c=counts: fit_bradley_terry(c, prior_variance=None).scores,
                        lambda d=data, m=m: choix.mm_pairwise(m, d, alpha=0.0, tol=1e-12, max_iter=100000), r),
            compare_fit("BT MAP, ties as half wins vs opt_pairwise (x2 data, 2 alpha)",
                        lambda c=counts: fit_bradley_terry(c, prior_variance=prior, ties="half").scores,
                        lambda h=half, m=m: choix.opt_pairwise(m, choix_data(h, 2), alpha=2 * alpha, tol=1e-10), r),
            compare_fit("binarized W (EMER-Ranker) MAP vs opt_pairwise (x2 data, 2 alpha)",
                        lambda c=counts: fit_binarized_bradley_terry(c, prior_variance=prior).scores,
                        lambda w=w, m=m: choix.opt_pairwise(m, choix_data(w, 2), alpha=2 * alpha, tol=1e-10), r),
        ]  # fmt: skip
        rows.append(bootstrap_compare(records, args.n_boot))
        for model in ("davidson", "rao-kupper", "emoprefer"):
            rows.append({"case": f"{model} tie model", "error": "choix has no tie model (its pairwise fits are "
                         "Bradley-Terry on (winner, loser) data only): not compared"})  # fmt: skip
        out["tables"][label] = {"items": m, "records": len(records), "ties": int(counts.ties.sum() / 2), "rows": rows}
    return out


# ---------------------------------------------------------------------------------------------- report
def fmt(x, digits=2) -> str:
    return "-" if x is None else f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def markdown(results: dict) -> str:
    lines = [f"Measured {results['date']}, {results['machine']}, {results['torch_threads']} torch threads, "
             f"{results['dtype']}; load {results['load_before']} before, {results['load_after']} after.", "",
             "| section | this project's path | peer | ours | peer | ratio (ours / peer speed) | what it shows | load |",
             "|---|---|---|---:|---:|---:|---|---:|"]  # fmt: skip
    for dtype, t in (results.get("train") or {}).items():
        o, p = t["ours"], t["trl"]
        if "error" in o or "error" in p:
            lines.append(f"| train, {dtype} | `emoreward train` | TRL `RewardTrainer` | - | - | - | "
                         f"{o.get('error') or p.get('error')} | - |")  # fmt: skip
            continue
        lines.append(
            f"| train, {dtype} | `emoreward train` fit, pairs/s of the training loop (per CPU-s of the fit) | "
            f"TRL `RewardTrainer` + PEFT LoRA | {o['pairs_per_second']:.2f} ({o['pairs_per_cpu_second']:.2f}) | "
            f"{p['pairs_per_second']:.2f} ({p['pairs_per_cpu_second']:.2f}) | **{t['ratio_pairs_per_second']:.2f}** "
            f"({t['ratio_pairs_per_cpu_second']:.2f}) | held-out accuracy {o['heldout_accuracy']:.3f} vs "
            f"{p['heldout_accuracy']:.3f} ({o['pairs_trained']} vs {p['pairs_trained']} pairs, "
            f"{o['optimizer_steps']} vs {p['optimizer_steps']} steps) | {o['load_1min']} / {p['load_1min']} |"
        )
    s = results.get("score")
    if s:

        def pair(row: dict) -> str:  # "desc/s (desc per CPU-s)"
            return f"{row['descriptions_per_second']:.1f} ({fmt(row['descriptions_per_cpu_second'], 1)})"

        def ratio(r: dict) -> str:
            return f"**{r['wall']:.2f}** ({fmt(r['cpu'])})"

        ours, tr, sv, v = s["ours_in_process"], s["transformers"], s["serve"], s["vllm"]
        lines.append(
            f"| score | `load_reward_model(...).score`, desc/s (per CPU-s) | transformers "
            f"`AutoModelForSequenceClassification` on the export, batches of 32 | {pair(ours)} | {pair(tr)} | "
            f"{ratio(s['ratio_in_process_vs_transformers'])} | max reward diff {tr['max_abs_reward_diff']:.1e} | "
            f"{tr['load_1min']} |"
        )
        if "error" in v:
            lines.append(f"| score, serve | `score`; `emoreward serve`, per-sample `/v1/rewards` | vLLM `/classify` | "
                         f"{pair(ours)}; {pair(sv['plain'])} | - | - | {v['error']} | - |")  # fmt: skip
        else:
            lines.append(
                f"| score | `score` in process, desc/s (per CPU-s) | vLLM CPU `/classify`, every description in one "
                f"request | {pair(ours)} | {pair(v['one_request'])} | "
                f"{ratio(s['ratio_in_process_vs_vllm_one_request'])} | | {v['one_request']['load_1min']} |"
            )
            lines.append(
                f"| serve | `emoreward serve`, per-sample `/v1/rewards`, desc/s (per server CPU-s) | vLLM CPU "
                f"`/classify`, per-sample | {pair(sv['plain'])} | {pair(v['plain'])} | "
                f"{ratio(s['ratio_serve_vs_vllm_per_sample'])} | "
                f"{sv['plain']['descriptions_per_model_call']:.1f} descriptions per model call; "
                f"max reward diff from in-process: ours "
                f"{sv['plain']['max_abs_reward_diff']:.1e}, vLLM {v['plain']['max_abs_reward_diff']:.1e} | "
                f"{v['plain']['load_1min']} |"
            )
        for name, label in (("openrlhf", "OpenRLHF's per-sample client (`/get_reward`)"),
                            ("verl", "verl's `compute_score_async`")):  # fmt: skip
            r = sv[name]
            lines.append(f"| serve | `emoreward serve`, {label}, desc/s (per server CPU-s) | vLLM serves neither "
                         f"route | {pair(r)} | - | - | {r['lost']} lost | {r['load_1min']} |")  # fmt: skip
    k = results.get("rank")
    if k:
        for label, table in k["tables"].items():
            for r in table["rows"]:
                if "error" in r:
                    lines.append(f"| rank, {label} | {r['case']} | choix | - | - | - | {r['error']} | - |")
                else:
                    lines.append(
                        f"| rank, {label} ({table['items']} items, {table['records']} verdicts) | {r['case']}, s | "
                        f"choix | {r['ours_seconds']:.4f} | {r['peer_seconds']:.4f} | **{r['ratio']:.2f}** | "
                        f"max estimate diff {r['max_abs_diff']:.1e} | {r['load_1min']} |"
                    )
    return "\n".join(lines) + "\n"


def machine() -> str:
    from emoreward.models.precision import cpu_flags, has_bf16_matrix_units

    model = "unknown CPU"
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            model = line.split(":", 1)[1].strip()
    units = sorted({"amx_bf16", "avx512_bf16", "bf16"} & cpu_flags())
    return (f"`{model}`, {os.cpu_count()} CPUs, bf16 matrix units: {has_bf16_matrix_units('cpu')} "
            f"({', '.join(units) or 'no bf16 flag'})")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default="train,score,rank", help="comma-separated: train,score,rank")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of every path (default 2)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                        help="precision of every path (auto: the project's rule on this machine)")  # fmt: skip
    parser.add_argument("--train-pairs", type=int, default=360, help="EmoPrefer pairs to train on (of 450 decided)")
    parser.add_argument("--heldout", type=int, default=90, help="held-out pairs for the accuracy")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--train-dtypes", help="comma-separated precisions of the train section (default: --dtype)")
    parser.add_argument("--score-n", type=int, default=256, help="descriptions scored")
    parser.add_argument("--clients", type=int, default=16, help="per-sample clients in flight at once")
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--vllm-venv", default=DEFAULT_VLLM_VENV, help="a venv with vLLM's CPU build")
    parser.add_argument("--vllm-start-timeout", type=int, default=300)
    parser.add_argument("--n-boot", type=int, default=200, help="bootstrap resamples of the ranking comparison")
    parser.add_argument("--synthetic", default="40x400x20", help="synthetic counts: MODELSxSAMPLESxPER_SAMPLE")
    parser.add_argument("--tables", default="ovmerd,synthetic", help="ranking counts: ovmerd,synthetic")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of each ranking fit (median)")
    parser.add_argument("--time-limit", type=float, default=900, help="a section is not started past this (s)")
    parser.add_argument("--output", default="peers.json")
    parser.add_argument("--markdown", help="also write the Markdown table here")
    parser.add_argument("--worker", choices=["ours", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    if args.worker:
        args.dtype_resolved = args.dtype
        fn = worker_ours if args.worker == "ours" else worker_trl
        print(json.dumps(fn(args, Path(args.work))))
        return 0
    from emoreward.models.precision import resolve_dtype

    args.dtype_resolved = (
        str(resolve_dtype("auto", torch.device("cpu"))).replace("torch.", "") if args.dtype == "auto" else args.dtype
    )
    args.train_dtypes = (args.train_dtypes or args.dtype_resolved).split(",")
    sections = args.sections.split(",")
    began = time.perf_counter()
    results: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "torch_threads": args.threads,
        "dtype": args.dtype_resolved,
        "load_before": load_average(),
    }
    print(f"{results['machine']}; {args.threads} torch threads, {args.dtype_resolved}; load {results['load_before']}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        args.work_dir = str(work)
        model_dir = None
        for section in sections:
            if time.perf_counter() - began > args.time_limit:
                results[section] = {"error": f"not started: past --time-limit {args.time_limit} s"}
                print(f"{section}: not started (past --time-limit {args.time_limit} s)")
                continue
            if section == "train":
                results["train"] = train_section(args, work)
                ours = results["train"].get(args.dtype_resolved, {}).get("ours", {})
                model_dir = Path(ours["model_dir"]) if "model_dir" in ours else None
            elif section == "score":
                results["score"] = score_section(args, work, model_dir)
            elif section == "rank":
                results["rank"] = rank_section(args)
            else:
                raise SystemExit(f"unknown section {section!r}; choose from train,score,rank")
    results["load_after"] = load_average()
    results["seconds"] = time.perf_counter() - began
    table = markdown(results)
    print(table)
    Path(args.output).write_text(json.dumps(results, indent=2, default=str) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(table)
    print(f"wrote {args.output}; {results['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

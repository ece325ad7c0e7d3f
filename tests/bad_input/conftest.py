"""Fixtures of the bad-input catalogue: one tiny saved text reward model, one tiny multimodal (Qwen2.5-VL) reward
model with a media folder, a scripted judge YAML and well-formed data files, each built once per session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _helpers import save_tiny_bert_rm
from bad_input_helpers import GOOD_PAIRS, TABLE_ROWS, jsonl, write


@pytest.fixture(scope="session", autouse=True)
def libraries_loaded():
    """Import the ML stack once, before any case runs: import-time notices of the libraries (accelerator probes and
    the like) must not land in the one line a case captures."""
    from emoreward.cli.options import quiet_libraries

    quiet_libraries()
    import peft  # noqa: F401
    import trl  # noqa: F401

    import emoreward.models  # noqa: F401
    import emoreward.training.pipeline  # noqa: F401


@pytest.fixture(scope="session")
def rm_dir(tmp_path_factory) -> Path:
    """A saved 2-layer BERT reward model (hidden 16, 64 positions) reading at most 32 tokens, as
    `tests/ranking/conftest.py::tiny_rm_dir` builds it."""
    return save_tiny_bert_rm(tmp_path_factory.mktemp("bad-input-rm") / "model", initializer_range=None)


@pytest.fixture(scope="session")
def media_root(tmp_path_factory) -> Path:
    """A media folder: one clip, a 0-byte clip, a file that is not a video, and a symlink to a clip outside it."""
    pytest.importorskip("av", reason="writing and decoding clips needs PyAV (media extra)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "multimodal"))
    from tiny_media import write_video

    base = tmp_path_factory.mktemp("bad-input-media")
    root = base / "root"
    write_video(root / "video" / "s0.mp4", seconds=1.0, seed=0, audio=False)
    write(root / "video" / "empty.mp4", b"")
    write(root / "video" / "junk.mp4", b"not a video")
    write_video(base / "outside" / "secret.mp4", seconds=1.0, seed=1, audio=False)
    (root / "video" / "link.mp4").symlink_to(base / "outside" / "secret.mp4")
    return root


@pytest.fixture(scope="session")
def vl_dir(tmp_path_factory, media_root) -> Path:
    """A saved tiny Qwen2.5-VL reward model (random weights; reads video), built from `tiny_media.build_tiny`."""
    import torch
    from tiny_media import build_tiny

    from emoreward.data.media import MediaOptions
    from emoreward.models.media import MediaRewardModel

    backbone = build_tiny("qwen2.5-vl", tmp_path_factory.mktemp("bad-input-vl-backbone"))
    torch.manual_seed(0)
    options = MediaOptions(None, fps=2.0, max_frames=4)
    model = MediaRewardModel.from_backbone("qwen2.5-vl", str(backbone), media_options=options, max_length=256)
    path = tmp_path_factory.mktemp("bad-input-vl") / "model"
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def judge_yaml(tmp_path_factory) -> Path:
    """A zero-shot judge on the scripted backend (no model)."""
    path = tmp_path_factory.mktemp("bad-input-judge") / "judge.yaml"
    return write(path, "name: scripted-judge\nmllm: {backend: scripted, model: m}\n")


@pytest.fixture(scope="session")
def good_pairs(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("bad-input-data") / "pairs.csv", GOOD_PAIRS)


@pytest.fixture(scope="session")
def good_table(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("bad-input-table") / "table.jsonl", jsonl(TABLE_ROWS))


@pytest.fixture(scope="session")
def tiny_adapter_dir(tmp_path_factory, tiny_bert_dir) -> Path:
    """A saved LoRA reward model (adapter + value head) on the tiny BERT backbone of `tests/conftest.py`."""
    from peft import LoraConfig

    from emoreward.models import TextRewardModel

    lora = LoraConfig(r=2, lora_alpha=4, target_modules=["query", "value"], task_type="SEQ_CLS")
    model = TextRewardModel.from_backbone(str(tiny_bert_dir), lora_config=lora, max_length=32)
    path = tmp_path_factory.mktemp("bad-input-adapter") / "model"
    model.save_pretrained(path)
    return path

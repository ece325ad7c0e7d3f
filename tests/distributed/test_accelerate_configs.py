"""Every shipped accelerate config and DeepSpeed JSON loads with the real loaders and says what the docs promise.

The launches themselves are in `test_launch.py` (DDP in the default run, ZeRO-2 / ZeRO-3 marked slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml


ROOT = Path(__file__).resolve().parents[2]
ACCELERATE_CONFIGS = sorted((ROOT / "recipes" / "accelerate_configs").glob("*.yaml"))
DEEPSPEED_CONFIGS = sorted((ROOT / "configs" / "deepspeed").glob("*.json"))
# what each shipped config is and which launch test runs it; a new config file must be added here
EXPECTED = {
    "ddp.yaml": ("MULTI_GPU", None),
    "zero2.yaml": ("DEEPSPEED", "configs/deepspeed/zero2.json"),
    "zero3.yaml": ("DEEPSPEED", "configs/deepspeed/zero3.json"),
}


def test_every_shipped_config_is_covered():
    assert sorted(p.name for p in ACCELERATE_CONFIGS) == sorted(EXPECTED)
    referenced = {ds for _, ds in EXPECTED.values() if ds}
    assert {str(p.relative_to(ROOT)) for p in DEEPSPEED_CONFIGS} == referenced


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=lambda p: p.name)
def test_accelerate_config_loads(path):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(path))
    distributed_type, deepspeed_file = EXPECTED[path.name]
    assert config.distributed_type.value == distributed_type
    assert config.num_machines == 1 and config.num_processes == 8 and not config.use_cpu
    raw = yaml.safe_load(path.read_text())
    if deepspeed_file is None:
        assert not raw.get("deepspeed_config")
        return
    ds = raw["deepspeed_config"]
    assert ds["deepspeed_config_file"] == deepspeed_file and (ROOT / deepspeed_file).is_file()
    # with a DeepSpeed JSON, accelerate refuses these keys beside it (mixed precision, stage, clipping, ...)
    assert set(ds) <= {"deepspeed_config_file", "deepspeed_multinode_launcher", "zero3_init_flag"}
    assert "mixed_precision" not in raw
    assert ds["zero3_init_flag"] is (path.name == "zero3.yaml")


@pytest.mark.parametrize("path", DEEPSPEED_CONFIGS, ids=lambda p: p.name)
def test_deepspeed_json_is_valid(path):
    config = json.loads(path.read_text())
    stage = config["zero_optimization"]["stage"]
    assert path.stem == f"zero{stage}"
    # batch sizes, accumulation, clipping and precision come from the recipe (the HF Trainer fills "auto")
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        assert config[key] == "auto"
    assert config["bf16"]["enabled"] == "auto" and config["fp16"]["enabled"] == "auto"
    # no "optimizer" / "scheduler": the Trainer's AdamW and schedule are used (DeepSpeed's fused Adam needs
    # compiled ops, which a CPU-only or DS_BUILD_OPS=0 install lacks)
    assert "optimizer" not in config and "scheduler" not in config
    if stage == 3:
        assert config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    deepspeed = pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    zero = {k: (10_000 if v == "auto" else v) for k, v in config["zero_optimization"].items()}
    parsed = DeepSpeedZeroConfig(**zero)  # unknown or misspelled keys are errors here
    assert parsed.stage == stage
    if stage == 3:
        assert parsed.gather_16bit_weights_on_model_save is True
    assert deepspeed.__version__

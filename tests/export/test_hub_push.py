"""Push to the Hub: an exported reward model lands in a Hub model repository (a Hub imitation on loopback, never the
real Hub) with its model card's front matter, and loads back from there with the same rewards."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from hub_mock import MockHub, hub_env

from emoreward.data import HubPushError
from emoreward.export.hub import push_reward_model
from emoreward.models.cards import reward_model_card
from emoreward.models.precision import reward_tolerance
from emoreward.models.text import TextRewardModel


PUSH = r"""
import json, sys
from emoreward.cli import main
model_dir, out = sys.argv[1:3]
assert main(["export", "--model", model_dir, "--output", out, "--push-to-hub", "me/emotion-rm"]) == 0
from huggingface_hub import snapshot_download
from emoreward.models import load_reward_model
local = snapshot_download("me/emotion-rm")
model = load_reward_model(local)
from emoreward.models.precision import dtype_name, model_precision
scores = model.score(["She is delighted.", "He is furious."], "oh").tolist()
print("RESULT " + json.dumps({"scores": scores, "dtype": dtype_name(model_precision(model))}))
"""


@pytest.mark.precision  # depends on the scoring precision: `make test-precision` runs it in the other one
def test_export_push_and_load_back_through_a_hub_on_loopback(tiny_bert_dir, tmp_path):
    model = TextRewardModel.from_backbone(str(tiny_bert_dir), max_length=64)
    model.save_pretrained(tmp_path / "model", model_card=reward_model_card(model.settings))
    hub = MockHub()
    try:
        run = subprocess.run(
            [sys.executable, "-c", PUSH, str(tmp_path / "model"), str(tmp_path / "export")],
            env=hub_env(tmp_path, hub.url),
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        hub.close()
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert (
        "both scored in float32 (atol 1e-05: reward_tolerance(float32) at max |reward| " in run.stdout
    )  # float32 both
    got = json.loads(run.stdout.split("RESULT ", 1)[1])
    dtype = getattr(torch, got["dtype"])  # the precision the model loaded from the Hub scores in on this machine
    expected = model.inference_copy(dtype).score(["She is delighted.", "He is furious."], "oh")  # like with like
    np.testing.assert_allclose(got["scores"], expected, atol=reward_tolerance(dtype), rtol=0)
    repo = hub.repos["me/emotion-rm"]
    files = repo["commits"][repo["refs"]["main"]]
    assert {"model.safetensors", "config.json", "emoreward_config.json", "README.md", "tokenizer.json"} <= set(files)
    assert not any(name.startswith(".") or name == "finished.json" for name in files)
    card = files["README.md"].decode()
    front = card.split("---\n")[1]
    # a model built from a backbone alone: no training data, so no licence claimed (emoreward.models.cards)
    for key in ("library_name: transformers", "license: unknown", "pipeline_tag: text-classification", "tags:"):
        assert key in front
    assert hub.auth == {"Bearer hf_test_token"}  # the token from the environment, sent as a header only
    assert "hf_test_token" not in run.stdout + run.stderr


def test_push_refuses_offline_and_directories_without_a_card(tiny_bert_dir, tmp_path):
    model = TextRewardModel.from_backbone(str(tiny_bert_dir), max_length=64)
    model.save_pretrained(tmp_path / "bare")  # no model card
    with pytest.raises(ValueError, match="no model card with Hub front matter"):
        push_reward_model(tmp_path / "bare", "me/x")
    model.save_pretrained(tmp_path / "carded", model_card=reward_model_card(model.settings))
    with pytest.raises(HubPushError, match="^cannot push to the Hub model 'me/x': offline mode is on"):
        push_reward_model(tmp_path / "carded", "me/x")
    with pytest.raises(FileNotFoundError, match="not an emoreward model directory"):
        push_reward_model(tmp_path, "me/x")

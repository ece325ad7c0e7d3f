"""Export a trained reward model (text or multimodal) as a merged checkpoint for RL pipelines, and verify it:
`export_hf` merges LoRA into the backbone, writes the input recipe (`emoreward_config.json`) and a model card that
says how to read the checkpoint, reloads the export and checks it gives the original's rewards (text: plain
`AutoModelForSequenceClassification` on ids from the exported files alone; multimodal: the engine layout of
`emoreward.models.media.export_layout`, on a synthetic clip). See docs/serving.md#export-for-rl.
"""

from __future__ import annotations

import json
import shutil
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from emoreward.models.base import (
    TRAINING_DATA_FILE,
    RewardContext,
    RewardModel,
    TextSettings,
    apply_score_transform,
    as_context,
    load_reward_model,
    load_settings,
)
from emoreward.models.loading import record_export_origin
from emoreward.models.precision import dtype_name, reward_tolerance
from emoreward.utils.io import output_lock, recover_dir, replace_dir


DEFAULT_PROBES = (
    "The speaker smiles broadly and her voice rises: she is happy, and the joy grows stronger towards the end.",
    "He frowns, speaks slowly in a low voice and looks away; he seems sad and tired.",
    "  Neutral.",
    "",
)


def card_tokenizer_kwargs(paired: bool) -> dict:
    """THE tokenizer arguments of a text-encoder export's plain-transformers recipe: what its card prints
    (`tokenizer(CONTEXTS, DESCRIPTIONS, **these)`, and the `pipeline('text-classification')` line's call arguments)
    and what the export's self-check runs (`export_hf`, on a probe longer than `max_length`). `paired`: a context
    is given (only the description is cut, as `emoreward.models.layout.text_input_ids` cuts; the length limit is
    the exported tokenizer's `model_max_length`, the model's `max_length`). transformers has no default-truncation
    setting a tokenizer's files could carry (`tokenizer_config.json` holds `model_max_length` and
    `truncation_side`, which the export writes; a `tokenizer.json` truncation is switched off by every call that does
    not ask, transformers 5), so the recipe names it."""
    return {"padding": True, "truncation": "only_second" if paired else True}


def chat_reader_ids(tokenizer, context: str, description: str, max_length: int, keep: int) -> list[int]:
    """THE plain-transformers recipe of a decoder (`"chat"` layout) export, as its card prints it (`_chat_recipe`):
    the chat template rendered on `[user: context, assistant: description]` (both in Unicode NFC, the normal form
    every route reads, `emoreward.data.text.normal_text`; no user turn without context), the whitespace after the
    end-of-turn token dropped, tokenized whole with `add_special_tokens=False`; a sequence
    longer than `max_length` keeps its first `max_length - keep` tokens and its last `keep` (the closing tokens the
    value head reads; `emoreward.models.layout.kept_end_tokens`). Only tokenizer calls: what a reader without
    emoreward runs, and what `export_hf` checks on descriptions longer than `max_length`.

    Returns:
        `list[int]`: the token ids, at most `max_length` of them when the sequence was cut."""
    messages = [{"role": "assistant", "content": unicodedata.normalize("NFC", description)}]
    if context:
        messages.insert(0, {"role": "user", "content": unicodedata.normalize("NFC", context)})
    text = tokenizer.apply_chat_template(messages, tokenize=False).rstrip()
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if len(ids) > max_length:
        ids = ids[: max_length - keep] + ids[len(ids) - keep :]
    return ids


def _chat_recipe(max_length: int, keep: int) -> str:
    """`chat_reader_ids` as the card's Python block writes it (PATH, CONTEXT and DESCRIPTION the reader's)."""
    cut = f"ids[:{max_length - keep}] + ids[-{keep}:]" if keep else f"ids[:{max_length}]"
    return f"""```python
import unicodedata

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(PATH)
model = AutoModelForSequenceClassification.from_pretrained(PATH).eval()
nfc = lambda text: unicodedata.normalize("NFC", text)  # the Unicode form the model was trained and checked on
messages = [{{"role": "user", "content": nfc(CONTEXT)}}, {{"role": "assistant", "content": nfc(DESCRIPTION)}}]  # no user turn without CONTEXT
text = tokenizer.apply_chat_template(messages, tokenize=False).rstrip()
ids = tokenizer(text, add_special_tokens=False)["input_ids"]
if len(ids) > {max_length}:  # cut the description's end; keep the {keep} closing token(s) the value head reads
    ids = {cut}
with torch.no_grad():
    reward = model(input_ids=torch.tensor([ids])).logits[0, 0]
```"""


def _kwargs_text(kwargs: dict) -> str:
    """`card_tokenizer_kwargs` as the card writes them: `padding=True, truncation='only_second'`."""
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def long_probe(max_length: int) -> str:
    """A probe description longer than `max_length` tokens (every word is at least one token), so the export's
    self-check reads the cut that a reader's recipe must make."""
    sentence = DEFAULT_PROBES[0].split()
    return " ".join((sentence * (max_length // len(sentence) + 2))[: max_length + 1])


class ExportMismatchError(RuntimeError):
    """The exported checkpoint does not reproduce the original model's rewards."""


@dataclass
class ExportReport:
    """Outcome of :func:`export_hf`.

    Attributes:
        path (`Path`): the export directory.
        kind (`str`): `"text"` or `"media"`.
        max_abs_diff (`float`): largest |reward difference| between the original model and the reloaded export
            (text: `AutoModelForSequenceClassification` on the model's own ids; media: `load_reward_model`).
        max_abs_diff_plain (`float`): text: the same with ids built from the exported tokenizer and settings alone
            and through the card's plain recipe (a text encoder: `card_tokenizer_kwargs`; a decoder:
            `chat_reader_ids`), the largest of these;
            media: the export's remote-code class (`modeling_emoreward.py`, what `trust_remote_code=True` runs) on a
            right-padded batch of the probes, against the original's raw head output.
        n_probes (`int`): probe descriptions compared (text: with two longer than `max_length`, `long_probe`).
        ids_match (`bool`): text: the exported recipe reproduced the model's own input ids on every probe.
        dtype (`str`): the precision both sides of the check computed in (`"float32"`: the original's float32
            master weights against the export reloaded in float32; a model whose weights are bf16 is compared with
            its export reloaded in bf16).
        atol (`float`): the tolerance the check used: the one given, else "the same reward"
            (`emoreward.models.precision.reward_tolerance(dtype, magnitude=max |reward|)`: 1e-5 x max(1, max |reward|)
            in float32).
        atol_from (`str`): how ``atol`` was decided, as `summary` prints it (``", given"`` or
            ``": reward_tolerance(float32) at max |reward| 3.05"``).
        loads_as (`str`): how this export's own family is read (text: `AutoModelForSequenceClassification`; a
            native multimodal classifier: transformers' own class, no remote code; else the remote-code class).
        measured (`tuple[str, str]`): what ``max_abs_diff`` and ``max_abs_diff_plain`` were measured through.
    """

    path: Path
    kind: str
    max_abs_diff: float
    max_abs_diff_plain: float
    n_probes: int
    ids_match: bool
    dtype: str = "float32"
    atol: float = 1e-5
    atol_from: str = ", given"
    loads_as: str = "loads with AutoModelForSequenceClassification"
    measured: tuple[str, str] = ("same ids", "ids from the exported recipe")

    def summary(self) -> str:
        """The one line `emoreward export` prints: how the export is read and what was checked, only what applies
        to its backbone family."""
        return (
            f"{self.path} {self.loads_as}; max |reward difference| {self.max_abs_diff:.2e} ({self.measured[0]}), "
            f"{self.max_abs_diff_plain:.2e} ({self.measured[1]}); {self.n_probes} probes, original and export both "
            f"scored in {self.dtype} (atol {self.atol:.3g}{self.atol_from})"
        )


@torch.inference_mode()
def score_with_transformers(model: torch.nn.Module, sequences: list[list[int]]) -> np.ndarray:
    """Rewards from a plain sequence-classification model, one sequence per forward pass (no padding at all).

    Returns:
        `np.ndarray` of shape `(len(sequences),)`, float64: ``logits[:, 0]``.
    """
    model.eval()
    out = np.empty(len(sequences), dtype=np.float64)
    for k, ids in enumerate(sequences):
        mask = torch.ones(1, len(ids), dtype=torch.long)
        out[k] = float(model(input_ids=torch.tensor([ids]), attention_mask=mask).logits[0, 0])
    return out


def synthetic_context(model: RewardModel, seconds: float = 2.0, seed: int = 0) -> RewardContext:
    """A context with decoded media made in memory (random frames at the model's fps, a voiced tone), to compare a
    multimodal model with its export without any media file."""
    from emoreward.data.media import SampleMedia

    settings = model.settings
    rng = np.random.default_rng(seed)
    media = SampleMedia()
    if "video" in model.modalities:
        n = max(2, min(settings.max_frames, int(round(seconds * settings.fps))))
        n += n % 2
        media.frames = rng.integers(0, 256, size=(n, 64, 64, 3), dtype=np.uint8)
        media.fps = settings.fps
    if "audio" in model.modalities:
        t = np.arange(int(seconds * settings.sampling_rate)) / settings.sampling_rate
        media.audio = (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    return RewardContext(subtitle="I can't believe it.", sample_id="export-probe", decoded=media)


def export_hf(
    model: RewardModel | str | Path,
    directory: str | Path,
    probes: list[str] | None = None,
    contexts: list[RewardContext | None] | None = None,
    atol: float | None = None,
) -> ExportReport:
    """Merge, save and verify a reward model (text or multimodal) for RL pipelines.

    Args:
        model (`RewardModel` or path): the model, or a directory written by `emoreward train`.
        directory (`str` or `Path`): the export folder (created; must not be the model's own directory).
        probes (`list[str]`, *optional*): descriptions compared before and after (default: a few fixed ones).
        contexts (`list[RewardContext | None]`, *optional*): contexts aligned with ``probes`` (default: none for text
            models, a synthetic clip for multimodal ones).
        atol (`float`, *optional*): largest allowed |reward difference| (default: "the same reward",
            `emoreward.models.precision.reward_tolerance` of the check's precision at the largest |reward| of the
            probes: 1e-5 x max(1, max |reward|) in float32).

    The check compares like with like: the master weights' dtype (float32 for a path) on both sides. The export
    (with the model's `training_data.json`, so in-sample pairs stay flagged) is written and checked in a sibling
    folder and swapped into ``directory`` only when the check passes (`emoreward.utils.io.replace_dir`); a failed
    one is kept as ``<directory>.failed-check``. ``directory`` may be new, empty or an earlier export
    (`check_export_target`).

    Returns:
        `ExportReport`.

    Raises:
        ValueError: ``directory`` is the model's own directory, an existing file or a folder that holds anything but
            an earlier export, or ``atol`` is negative.
        ExportMismatchError: the loaded export has missing / unexpected keys or its rewards differ by more than
            ``atol``.
        OutputBusyError: another process is writing ``directory`` (`emoreward.utils.io.hold_output`).
    """
    with output_lock(directory, "export folder"):  # one writer per export folder, held until the swap is done
        return _export_hf(model, Path(directory), probes, contexts, atol)


def _export_hf(model, directory: Path, probes, contexts, atol) -> ExportReport:
    if atol is not None and not atol >= 0:
        raise ValueError(f"atol must be a number >= 0 (reward units), got {atol}")
    if isinstance(model, (str, Path)) and directory.resolve() == Path(model).resolve():
        raise ValueError(
            f"export into the model's own directory {directory} would overwrite it; choose another --output"
        )
    recover_dir(directory)  # what a kill inside an earlier export's last step left: the old export back in place
    check_export_target(directory)  # before any work
    if isinstance(model, (str, Path)):
        model = load_reward_model(model, dtype=torch.float32)  # the master weights as saved: a float32 export
    probes = list(DEFAULT_PROBES if probes is None else probes)
    if contexts is None:
        contexts = [synthetic_context(model) if model.kind == "media" else None] * len(probes)
    contexts = [as_context(c) for c in contexts]
    if model.kind == "text":  # the cut a reader's recipe must make, always checked (with and without a subtitle)
        probes += [long_probe(model.settings.max_length)] * 2
        contexts += [as_context(None), as_context(RewardContext(subtitle="I can't believe it."))]
    dtype = model.dtype  # the master weights' dtype: the original scores in it, the export is reloaded in it
    expected = _reference(model, dtype).score(probes, contexts)
    staging = directory.with_name(f".{directory.name}.exporting")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        model.export_merged(staging, model_card=export_card(model))
        record_export_origin(staging, model)  # the model it holds: its source's identity (a committee's member)
        source = getattr(model, "source_dir", None)
        if source is not None and (Path(source) / TRAINING_DATA_FILE).is_file():  # which pairs are in-sample
            shutil.copy2(Path(source) / TRAINING_DATA_FILE, staging / TRAINING_DATA_FILE)
        if model.kind == "media":
            from emoreward.models.media.export_layout import (
                REQUEST_FILE,
                remote_class,
                remote_rewards,
                request_spec,
                whole_text_difference,
            )

            again = load_reward_model(staging, media_root=getattr(model, "media_root", None), dtype=dtype)
            got = again.score(probes, contexts)
            raw = _network_output(expected, probes, model.settings.score_transform)
            again.model = None  # its inputs are still built from the export's files; one more copy of the weights
            native = model.spec.native_classifier
            if native:  # a plain checkpoint: transformers' own class reads it, no remote code
                from transformers import AutoModelForSequenceClassification

                net = AutoModelForSequenceClassification.from_pretrained(staging, dtype=dtype).eval()
                remote = np.array(remote_rewards(net, again, probes, contexts))
                del net
                (staging / "README.md").write_text(native_media_card(again, dtype=dtype), encoding="utf-8")
                loads_as = (f"is a plain {native} checkpoint that transformers reads with its own class (no remote "
                            "code; `emoreward serve` serves it)")  # fmt: skip
                checked = ("load_reward_model", f"transformers' {native}, on a synthetic clip")
            else:
                net = remote_class(staging).from_pretrained(staging, dtype=dtype).eval()
                remote = np.array(remote_rewards(net, again, probes, contexts))
                measured = [whole_text_difference(net, again, probes, contexts[0])]
                del net
                request = request_spec(again, measured, dtype=dtype)
                (staging / REQUEST_FILE).write_text(json.dumps(request, indent=2) + "\n", encoding="utf-8")
                (staging / "README.md").write_text(media_card(again, measured=measured, dtype=dtype), encoding="utf-8")
                loads_as = ("is <X>ForSequenceClassification for vLLM's pooling runner and transformers "
                            "(trust_remote_code; the README gives the vllm serve line and the request)")  # fmt: skip
                checked = ("load_reward_model", "its remote-code class, on a synthetic clip")
            report = ExportReport(
                directory,
                "media",
                float(np.max(np.abs(got - expected))),
                float(np.max(np.abs(remote - raw))),
                len(probes),
                True,
                loads_as=loads_as,
                measured=checked,
            )
        else:
            report = _check_text_export(model, staging, probes, contexts, expected, dtype)
        report.path = directory
        report.dtype = dtype_name(dtype)
        if atol is None:  # "the same reward": the precision module's one rule, at the rewards compared
            magnitude = float(np.max(np.abs(expected)))
            report.atol = reward_tolerance(dtype, magnitude=magnitude)
            report.atol_from = f": reward_tolerance({report.dtype}) at max |reward| {magnitude:.3g}"
        else:
            report.atol, report.atol_from = atol, ", given"
        if report.max_abs_diff > report.atol or report.max_abs_diff_plain > report.atol:
            raise ExportMismatchError(
                f"exported rewards differ from the original model by {report.max_abs_diff:.3g} "
                f"(recipe ids: {report.max_abs_diff_plain:.3g}) > atol {report.atol:.3g}, both computed in "
                f"{report.dtype}"
            )
    except ExportMismatchError as err:
        failed = directory.with_name(f"{directory.name}.failed-check")
        shutil.rmtree(failed, ignore_errors=True)
        staging.rename(failed)
        raise ExportMismatchError(f"{directory}: {err}; nothing was written there (the export that failed the check "
                                  f"is kept for inspection in {failed})") from None  # fmt: skip
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    replace_dir(staging, directory)  # a previous export replaced whole; a kill leaves the old one or the new one
    return report


def check_export_target(directory: str | Path) -> None:
    """Refuse an export folder that holds anything but an earlier export: it must not exist, be empty, or hold a
    merged export (its `emoreward_config.json` says ``"merged": true``), which the new export then replaces whole.

    Raises:
        ValueError: ``directory`` is a file, or a folder with other content (a model being trained, a run folder,
            a user's files), naming a few of its entries.
    """
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"--output {directory} is a file; give a directory for the export")
    if not directory.is_dir():
        return
    entries = sorted(item.name for item in directory.iterdir())
    if not entries:
        return
    try:
        merged = bool(load_settings(directory).merged)
    except (OSError, ValueError):  # no settings, or unreadable: not an export of ours
        merged = False
    if not merged:
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise ValueError(
            f"--output {directory} is not empty and holds no earlier export ({shown}): the export would overwrite "
            "or mix with these files; give a new or empty folder"
        )


def _reference(model: RewardModel, dtype: torch.dtype) -> RewardModel:
    """The original model scoring in `dtype`: a text model on its master weights as they are (adapter live, no
    copy), a multimodal model as loaded (its weights are in `dtype`)."""
    if model.kind == "text" and model.scoring_precision != dtype:
        from emoreward.models.text import TextRewardModel

        return TextRewardModel(model.model, model.tokenizer, model.settings, batch_size=model.batch_size)
    return model


def _network_output(rewards: np.ndarray, probes: list[str], transform) -> np.ndarray:
    """The network's raw output behind ``rewards`` of ``probes``: the score transform (not part of the weights)
    taken off."""
    return rewards - apply_score_transform(np.zeros(len(probes)), [len(d) for d in probes], transform)


def _check_text_export(
    model, directory: Path, probes, contexts, expected: np.ndarray, dtype: torch.dtype
) -> ExportReport:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from emoreward.models.layout import context_text, kept_end_tokens, text_input_ids

    loaded, info = AutoModelForSequenceClassification.from_pretrained(directory, dtype=dtype, output_loading_info=True)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise ExportMismatchError(f"AutoModelForSequenceClassification loading problems {bad}")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    settings = load_settings(directory)
    assert isinstance(settings, TextSettings)
    own_ids = [model.encode(d, c).input_ids for d, c in zip(probes, contexts)]
    recipe_ids = [text_input_ids(tokenizer, settings, d, c.subtitle).input_ids for d, c in zip(probes, contexts)]
    expected = _network_output(expected, probes, model.settings.score_transform)
    got = score_with_transformers(loaded, own_ids)
    got_plain = score_with_transformers(loaded, recipe_ids)
    plain_diff = float(np.max(np.abs(got_plain - expected)))
    if settings.input_format == "chat":  # the card's plain recipe itself (tokenizer calls only), long probes included
        keep = kept_end_tokens(tokenizer, settings)
        card_ids = [
            chat_reader_ids(tokenizer, context_text(settings.instruction, c.subtitle), d, settings.max_length, keep)
            for d, c in zip(probes, contexts)
        ]
        card = score_with_transformers(loaded, card_ids)
        plain_diff = max(plain_diff, float(np.max(np.abs(card - expected))))
    else:  # the card's plain recipe itself, long probes included
        try:
            card = _card_recipe_rewards(loaded, tokenizer, settings, probes, contexts)
        except (RuntimeError, IndexError, ValueError) as err:  # e.g. a long probe past the position embeddings
            raise ExportMismatchError(f"the card's plain-transformers recipe fails on the probes: {err}") from None
        plain_diff = max(plain_diff, float(np.max(np.abs(card - expected))))
    return ExportReport(
        directory,
        "text",
        float(np.max(np.abs(got - expected))),
        plain_diff,
        len(probes),
        own_ids == recipe_ids,
    )


def _card_recipe_rewards(net, tokenizer, settings: TextSettings, probes, contexts) -> np.ndarray:
    """The rewards a text-encoder export's card recipe gives (`net`'s `logits[:, 0]`): `tokenizer(CONTEXTS,
    DESCRIPTIONS, **card_tokenizer_kwargs(True))` over the probes with a context, `tokenizer(DESCRIPTIONS,
    **card_tokenizer_kwargs(False))` over those without, one batch each; shape `(len(probes),)`."""
    from emoreward.models.layout import context_text

    texts = [context_text(settings.instruction, c.subtitle) for c in contexts]
    out = np.zeros(len(probes))
    for paired in (False, True):
        rows = [i for i, t in enumerate(texts) if bool(t) == paired]
        if not rows:
            continue
        args = ([texts[i] for i in rows], [probes[i] for i in rows]) if paired else ([probes[i] for i in rows],)
        enc = tokenizer(*args, return_tensors="pt", **card_tokenizer_kwargs(paired))
        enc = {k: v for k, v in enc.items() if k in tokenizer.model_input_names}
        with torch.no_grad():
            out[rows] = net(**enc).logits[:, 0].float().numpy()
    return out


def media_card(
    model: RewardModel, head: str | None = None, transform: str | None = None, *, measured=None, dtype=None
) -> str:
    """The card of a multimodal export (engine layout, `emoreward.models.media.export_layout`): what the checkpoint is, the exact
    `vllm serve` line and `/classify` request (from `emoreward_request.json`, the one source of both), how to read
    it with transformers alone, and the inputs an engine cannot be made to see as emoreward does."""
    from emoreward.models.cards import front_matter
    from emoreward.models.media.export_layout import ARCHITECTURES, request_spec

    s, spec = model.settings, model.spec
    head = front_matter(s, library="transformers") if head is None else head
    transform = _transform_note(s) if transform is None else transform
    request = request_spec(model, measured, dtype=dtype)
    serve = " ".join(f"'{a}'" if a.startswith("{") and a != "{export}" else a for a in request["vllm"]["serve"])
    serve = serve.replace("{export}", "PATH")
    messages = json.dumps(request["messages"], indent=1)
    for name in ("context", "description", "video", "audio"):
        messages = messages.replace("{" + name + "}", name.upper())
    body = {"model": "PATH", "messages": "MESSAGES", "use_activation": False}
    if spec.sees_video:
        body["media_io_kwargs"] = {"video": {"fps": "FPS"}}
        body["mm_processor_kwargs"] = {"fps": "FPS"}
    body_text = json.dumps(body)
    video = ""
    if spec.sees_video:
        v = request["video"]
        video = (
            f"- Video: sample frames at {v['fps']} fps, at most {v['max_frames']}, evenly spread, the last repeated to an "
            f"even count; resize each with PIL bicubic to Qwen's `smart_resize` size (factor {v['resize_factor']}, "
            f"{v['min_pixels']}..{v['max_pixels']} pixels) and send them as `data:video/jpeg;base64,<PNG>,<PNG>,...` "
            "(vLLM decodes each with PIL); FPS is the rate of the frames sent. A video URL instead lets vLLM sample "
            "its own frames and resize with torchvision: other rewards.\n"
        )
    audio = ""
    if spec.hears_audio:
        a = request["audio"]
        audio = (
            f"- Audio: {a['source']}, mono at {a['sampling_rate']} Hz, as its own `audio_url` part (a WAV data "
            "URL); the server needs `soundfile` installed (without it a WAV arrives unscaled).\n"
        )
        if a["interleaved_with_video"]:
            audio += (
                "- **Not reproducible in vLLM `/classify`:** this model reads the video's audio interleaved with its "
                "frames (`use_audio_in_video`), an option `/classify` does not take; sent as its own part, the audio "
                "lands after the video and the rewards differ. Use transformers (below) or `emoreward serve`.\n"
            )
    measured = "".join(
        f"- {d['what']}: max |reward difference| {d['max_abs_reward_diff']:.3g} ({d['why']})\n"
        for d in request["differences"]
    )
    return f"""{head}
# emoreward multimodal reward model ({s.backbone}, merged export)

A scalar reward r(description | media, subtitle): `{ARCHITECTURES[spec.name]}`, the merged `{spec.model_class}`
weights (LoRA folded in) read at the last token by a bias-free head `score` (`language_model.score.weight`,
`[1, hidden]`, `num_labels: 1`). The reward is output 0, raw (no sigmoid). `emoreward_request.json` holds, as data,
everything below: the messages, frame sampling, audio rate and engine options.

## vLLM (pooling runner)

```
{serve}
```

`POST /classify` with `{body_text}`, MESSAGES being

```
{messages}
```

with CONTEXT = `{s.instruction.replace(chr(10), " ")}` plus a line `Subtitle: <subtitle>` when the sample has one
(stripped; none when empty), DESCRIPTION the text to score. The reward is `data[0].probs[0]`.

{video}{audio}- The chat template (`chat_template.jinja`) renders the parts in order with no generation prompt and ends at the
  assistant's end-of-turn token; emoreward tokenizes the description apart from the prompt, so a description that
  starts with a space can tokenize differently in an engine that tokenizes the whole text.
- Rotary positions of text after a video follow the original Qwen release (and vLLM), as emoreward trains and
  scores.
{measured}
## transformers alone

```python
from transformers import AutoModelForSequenceClassification
model = AutoModelForSequenceClassification.from_pretrained(PATH, trust_remote_code=True)
reward = model(**processor_outputs).logits[:, 0]   # input_ids, attention_mask and the media tensors
```

`modeling_emoreward.py` imports nothing but transformers and torch; either padding side.

## emoreward

`emoreward.models.load_reward_model(PATH, media_root=...)`, `emoreward serve --model PATH --media-root DIR`,
`emoreward.export.EmotionReward(PATH, media_root=...)` (TRL GRPO).

Max length {s.max_length} tokens, tie threshold {s.tie_threshold:.4g}.
{transform}"""


def native_media_card(model, *, dtype: torch.dtype | None = None) -> str:
    """The card of a multimodal export that transformers reads natively (`BackboneSpec.native_classifier`)."""
    spec, s = model.spec, model.settings
    return f"""---
library_name: transformers
tags: [reward-model, emotion, emoreward, {spec.name}]
---
# Emotion reward model ({spec.name})

A scalar reward r(description | video frames, subtitle): a plain `{spec.native_classifier}` checkpoint
(the merged `{spec.model_class}` decoder and the value head `score`, {dtype_name(dtype or model.dtype)}), read by
transformers without remote code. The reward is `logits[:, 0]`, pooled at the last token that is not the
tokenizer's pad token (so either padding side gives the same reward).

```python
from transformers import AutoModelForSequenceClassification
model = AutoModelForSequenceClassification.from_pretrained(PATH)
reward = model(**processor_outputs).logits[:, 0]   # input_ids, attention_mask, mm_token_type_ids, video tensors
```

Inputs: the chat template of this folder, user turn = the video then `{{instruction}}\\nSubtitle: {{subtitle}}`,
assistant turn = the description, ending at its end-of-turn token; frames sampled at {s.fps} fps (at most
{s.max_frames}), per-frame timestamps as `Qwen3VLProcessor` writes them. The description and its end-of-turn
token are tokenized apart from the prompt. `emoreward.models.load_reward_model(PATH, media_root=...)` builds exactly
these inputs; `emoreward serve --model PATH --media-root DIR` serves it.
"""


def export_card(model: RewardModel) -> str:
    """The export's model card: what the checkpoint is, exactly how to build its input and read the reward, and
    which RL stacks read it directly (each claim is tested in tests/export)."""
    from emoreward.models.cards import front_matter

    s = model.settings
    transform = _transform_note(s)
    head = front_matter(s, library="transformers")
    instruction = s.instruction.replace("\n", " ") or "(none)"
    if model.kind == "media":
        if model.spec.native_classifier:
            return native_media_card(model)
        return media_card(model, head, transform)
    return _text_card(model, head, transform, instruction)


def _transform_note(s) -> str:
    """The card's note on a score transform that is not part of the weights ("" without one)."""
    if s.score_transform:
        return (
            f"\n**Score transform not in the weights.** This model was trained with `length_debias: {s.objective}`: "
            f"its reward is the network output minus a length penalty ({s.score_transform}). Readers that run the "
            "network alone get the untransformed output; emoreward's `score`, `serve` and `EmotionReward` apply it.\n"
        )
    return ""


def _text_card(model: RewardModel, head: str, transform: str, instruction: str) -> str:
    """The card of a text export (see `export_card`)."""
    s = model.settings
    assert isinstance(s, TextSettings)
    if s.input_format == "chat":
        from emoreward.models.layout import kept_end_tokens

        keep = kept_end_tokens(model.tokenizer, s)
        layout = (
            "Render `[{'role': 'user', 'content': CONTEXT}, {'role': 'assistant', 'content': DESCRIPTION}]` with the "
            "tokenizer's chat template (no user turn without context), drop the whitespace the template writes "
            "after the assistant's end-of-turn token, and tokenize the whole text with `add_special_tokens=False`: "
            "the sequence ends at the end-of-turn token, where the value head `score` reads it (the last non-pad "
            "token; either padding side, with position ids from the attention mask). A sequence longer than "
            f"{s.max_length} tokens is cut at the description's end as the model read it: its first "
            f"{s.max_length - keep} tokens and its last {keep} (the closing token(s) the head reads). Neither the whole "
            "text nor the tokenizer's own `truncation=True` (it cuts the end-of-turn token) gives that reward."
        )
        readers = (
            "- `transformers.AutoModelForSequenceClassification` (TRL's reward models): reads `logits[:, 0]` at the "
            "last non-pad token; right or left padding. The whole recipe, one description:\n\n"
            f"{_chat_recipe(s.max_length, keep)}\n\n"
            "- OpenRLHF (`--reward_pretrain PATH`): its reward model reads the value head `score` at the last "
            "non-pad token; send the sequence ending at the end-of-turn token, cut as above.\n"
            "- verl's reward-model worker (`AutoModelForTokenClassification`, read at the last non-pad token): the "
            "same rewards (the token-classification head's bias, absent here, loads as zero).\n"
            "- OpenRLHF and verl feed the policy's own prompt as CONTEXT; the rewards above hold when the RL prompt "
            "is built as CONTEXT is here (instruction and subtitle). Otherwise use `emoreward serve` "
            "(`/get_reward`, or verl's custom reward function `emoreward.export.verl`), which rebuilds the context.\n"
        )
    else:
        layout = (
            "Token ids `[CLS] CONTEXT [SEP] DESCRIPTION [SEP]` (`[CLS] DESCRIPTION [SEP]` without context): what "
            "the batched `tokenizer(CONTEXTS, DESCRIPTIONS)` gives (an empty description keeps its `[SEP]`). The "
            "tokenizer returns what the model reads, `input_ids` and `attention_mask` (its `model_input_names`: no "
            "`token_type_ids`, the model was trained without them), so `model(**tokenizer(CONTEXTS, DESCRIPTIONS, "
            f"{_kwargs_text(card_tokenizer_kwargs(True))}, return_tensors='pt'))` gives the reward "
            f"(`tokenizer(DESCRIPTIONS, {_kwargs_text(card_tokenizer_kwargs(False))}, return_tensors='pt')` "
            f"without context): the truncation cuts a description longer than {s.max_length} tokens (the "
            "tokenizer's `model_max_length`) as the model read it, and without it a long description gets another "
            "reward; pad on the RIGHT (absolute position embeddings). The reward is `logits[:, 0]` of BERT's pooled "
            "`[CLS]` head."
        )
        readers = (
            "- `transformers.AutoModelForSequenceClassification` with right padding, fed the tokenizer's output.\n"
            "- transformers' `pipeline('text-classification', model=PATH)` called on `{'text': CONTEXT, "
            f"'text_pair': DESCRIPTION}}` with `truncation={card_tokenizer_kwargs(True)['truncation']!r}` (on a "
            f"bare DESCRIPTION: `truncation={card_tokenizer_kwargs(False)['truncation']!r}`): its `score` is the "
            "reward (`problem_type: regression`, no sigmoid).\n"
            "- Not OpenRLHF or verl directly: both read a decoder's value head at the last token, while this encoder's "
            "reward is pooled at `[CLS]`. Use `emoreward serve` (OpenRLHF `--remote_rm_url`, verl's custom reward "
            "function `emoreward.export.verl`) or `emoreward.export.EmotionReward` (TRL GRPO).\n"
        )
    return f"""{head}
# emoreward emotion reward model ({s.backbone}, merged export)

A scalar reward r(description | context) for emotion descriptions: `AutoModelForSequenceClassification` with one
output (`logits[:, 0]`, unnormalised), LoRA merged in.

- Input: {layout}
- CONTEXT = the instruction, plus a line `Subtitle: <subtitle>` when the sample has one; instruction: {instruction}
- Max length: {s.max_length} tokens (longer descriptions were cut, and counted, in training); tie threshold:
  {s.tie_threshold:.4g}.
- `emoreward.models.text.text_input_ids(tokenizer, settings, description, subtitle)` builds the ids from this
  folder alone (`load_settings(path)`): the same function training and every emoreward route use.

Readers:
{readers}{transform}"""


__all__ = [
    "DEFAULT_PROBES",
    "card_tokenizer_kwargs",
    "chat_reader_ids",
    "long_probe",
    "ExportMismatchError",
    "ExportReport",
    "check_export_target",
    "export_card",
    "export_hf",
    "score_with_transformers",
    "synthetic_context",
]

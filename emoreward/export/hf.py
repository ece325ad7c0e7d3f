"""Export a text reward model as a plain `transformers` checkpoint that verl and OpenRLHF load.

:func:`export_hf` merges LoRA into the backbone (:meth:`EmoRewardModel.export_merged`), writes a model card that
says how to build the input text, loads the result back with ``AutoModelForSequenceClassification`` (no missing
or unexpected keys allowed) and checks that it gives the same rewards as the original model on probe
descriptions. :func:`hf_input_ids` builds the input ids with nothing but the exported tokenizer, the way an RL
framework does, and :func:`score_with_transformers` scores with nothing but `transformers`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedTokenizerBase

from emoreward.models import EmoRewardModel, RewardModelSettings


DEFAULT_PROBES = (
    "The speaker smiles broadly and her voice rises: she is happy, and the joy grows stronger towards the end.",
    "He frowns, speaks slowly in a low voice and looks away; he seems sad and tired.",
    "Neutral.",
    "",
)


class ExportMismatchError(RuntimeError):
    """The exported checkpoint does not reproduce the original model's rewards."""


@dataclass
class ExportReport:
    """Outcome of :func:`export_hf`.

    Attributes:
        path (`Path`): the export directory.
        max_abs_diff (`float`): largest |reward difference| between the original model and the export loaded
            with ``AutoModelForSequenceClassification`` (same input ids).
        max_abs_diff_plain (`float`): the same with ids built by :func:`hf_input_ids` (tokenizer only).
        n_probes (`int`): probe descriptions compared.
        ids_match (`bool`): whether :func:`hf_input_ids` reproduced the model's own input ids on every probe.
    """

    path: Path
    max_abs_diff: float
    max_abs_diff_plain: float
    n_probes: int
    ids_match: bool


def hf_input_ids(
    tokenizer: PreTrainedTokenizerBase,
    settings: RewardModelSettings,
    description: str,
    subtitle: str | None = None,
) -> list[int]:
    """Input ids of one (context, description) sequence built from the tokenizer alone (no emoreward model).

    - ``"pair"`` (encoders): ``[CLS] context [SEP] description [SEP]`` (``[CLS] description [SEP]`` without
      context); feed them with all-zero ``token_type_ids`` (or none), as the reward model was trained.
    - ``"chat"`` (decoders): the chat template on ``[user: context, assistant: description]`` (no user turn
      without context); the value head reads the last token.

    The context is the settings' instruction plus ``"Subtitle: ..."`` when a subtitle is known. No truncation:
    keep sequences within ``settings.max_length``.
    """
    parts = [settings.instruction] if settings.instruction else []
    if subtitle:
        parts.append(f"Subtitle: {subtitle}")
    context = "\n".join(parts)
    if settings.input_format == "chat":
        messages = [{"role": "assistant", "content": description}]
        if context:
            messages.insert(0, {"role": "user", "content": context})
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    # [CLS] context [SEP] description [SEP]: what `tokenizer(context, description)` gives, spelled out so that an
    # empty description keeps its closing [SEP] as in training
    cls_ids = [tokenizer.cls_token_id] if tokenizer.cls_token_id is not None else []
    sep_ids = [tokenizer.sep_token_id] if tokenizer.sep_token_id is not None else []
    body = tokenizer(description, add_special_tokens=False)["input_ids"]
    if context:
        return cls_ids + tokenizer(context, add_special_tokens=False)["input_ids"] + sep_ids + body + sep_ids
    return cls_ids + body + sep_ids


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


def export_hf(
    model: EmoRewardModel | str | Path,
    directory: str | Path,
    probes: list[str] | None = None,
    subtitles: list[str | None] | None = None,
    atol: float = 1e-5,
) -> ExportReport:
    """Merge, save and verify a text reward model for `AutoModelForSequenceClassification`.

    Args:
        model (`EmoRewardModel` or path): the model, or a directory written by `emoreward train`.
        directory (`str` or `Path`): the export folder (created).
        probes (`list[str]`, *optional*): descriptions compared before and after (default: a few fixed ones).
        subtitles (`list[str | None]`, *optional*): subtitles aligned with ``probes``.
        atol (`float`): largest allowed |reward difference|.

    Returns:
        `ExportReport`.

    Raises:
        ExportMismatchError: if the loaded export has missing / unexpected keys or its rewards differ by more
            than ``atol``.
    """
    if isinstance(model, (str, Path)) and Path(directory).resolve() == Path(model).resolve():
        raise ValueError(
            f"export into the model's own directory {directory} would overwrite it; choose another --output"
        )
    if not isinstance(model, EmoRewardModel):
        model = EmoRewardModel.from_pretrained(model)
    probes = list(DEFAULT_PROBES if probes is None else probes)
    subtitles = [None] * len(probes) if subtitles is None else list(subtitles)
    directory = Path(directory)
    card = model_card(model.settings)
    model.export_merged(directory, model_card=card)
    (directory / "reward_input_format.json").write_text(
        json.dumps({"input_format": model.settings.input_format, "instruction": model.settings.instruction}, indent=2)
        + "\n"
    )

    loaded, info = AutoModelForSequenceClassification.from_pretrained(
        directory, dtype=torch.float32, output_loading_info=True
    )
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise ExportMismatchError(f"{directory}: AutoModelForSequenceClassification loading problems {bad}")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    expected = model.score(probes, subtitles)
    own_ids = [model.encode(d, s).input_ids for d, s in zip(probes, subtitles)]
    plain_ids = [hf_input_ids(tokenizer, model.settings, d, s) for d, s in zip(probes, subtitles)]
    got = score_with_transformers(loaded, own_ids)
    got_plain = score_with_transformers(loaded, plain_ids)
    report = ExportReport(
        directory,
        float(np.max(np.abs(got - expected))),
        float(np.max(np.abs(got_plain - expected))),
        len(probes),
        own_ids == plain_ids,
    )
    if report.max_abs_diff > atol or report.max_abs_diff_plain > atol:
        raise ExportMismatchError(
            f"{directory}: exported rewards differ from the original model by {report.max_abs_diff:.3g} "
            f"(tokenizer-only ids: {report.max_abs_diff_plain:.3g}) > atol {atol}"
        )
    return report


def model_card(settings: RewardModelSettings) -> str:
    """A short model card: what the checkpoint is and how to build its input text."""
    if settings.input_format == "chat":
        layout = (
            "Render `[{'role': 'user', 'content': CONTEXT}, {'role': 'assistant', 'content': DESCRIPTION}]` with "
            "the tokenizer's chat template; the value head `score` is read at the last non-pad token."
        )
    else:
        layout = (
            "Tokenize `tokenizer(CONTEXT, DESCRIPTION)` (or `tokenizer(DESCRIPTION)` without context) and pass "
            "`input_ids` and `attention_mask` only (no `token_type_ids`, as in training)."
        )
    instruction = settings.instruction.replace("\n", " ") or "(none)"
    return (
        "# emoreward emotion reward model (merged export)\n\n"
        "A scalar reward r(description | context) for emotion descriptions: "
        "`AutoModelForSequenceClassification` with one output (`logits[:, 0]`, unnormalised).\n\n"
        f"- input layout: `{settings.input_format}`; {layout}\n"
        f"- CONTEXT = instruction, plus a line `Subtitle: <subtitle>` when the sample has a subtitle; "
        f"instruction: {instruction}\n"
        f"- max length: {settings.max_length} tokens; calibrated tie threshold: {settings.tie_threshold:.4g}\n"
        "- `emoreward.export.hf.hf_input_ids` builds the ids from the tokenizer alone.\n"
    )


__all__ = [
    "DEFAULT_PROBES",
    "ExportMismatchError",
    "ExportReport",
    "export_hf",
    "hf_input_ids",
    "model_card",
    "score_with_transformers",
]

"""The emotion reward model: a scalar reward r(description | context) from a value head on a transformers backbone.

The model is a `transformers` sequence-classification model with one output (`num_labels=1`), the convention
TRL's RewardTrainer trains and verl / OpenRLHF load: for decoders the value head `score` (Linear(hidden, 1,
bias=False)) is read at the last non-pad token; for BERT-style encoders the model's own head reads the pooled
`[CLS]` token. LoRA adapters (peft) adapt the backbone; the head is a `modules_to_save` module, so it is saved
with the adapter.

A saved model directory holds the adapter (`adapter_model.safetensors`, head included), the tokenizer,
`emoreward_config.json` (backbone, input layout, length limit, calibrated tie threshold) and a model card.
"""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from emoreward.models.backbones import BackboneSpec, get_backbone


logger = logging.getLogger(__name__)

SETTINGS_FILE = "emoreward_config.json"
_SENTINEL = "\u2063EMOREWARD_DESCRIPTION\u2063"


@dataclass
class RewardModelSettings:
    """What a reward model needs besides its weights to turn text into the inputs it was trained on.

    Attributes:
        backbone: registry name or path / hub id of the base model.
        gguf_file: GGUF file name when the base weights are a GGUF file.
        input_format: `"pair"` (encoders: context and description as one sequence) or `"chat"` (decoders).
        instruction: the user turn / context prefix; the subtitle, when a sample has one, is appended.
        max_length: length limit in tokens of one (context, description) sequence.
        tie_threshold: |r1 - r2| below this is a predicted tie (calibrated on the training split; 0 = never).
        merged: True for a merged export (full weights, no adapter).
        num_heads: 1, or 2 for a disentangled reward (head 0 = quality, the reward; head 1 = length, ODIN).
        length_penalty: `{"alpha", "mean", "std"}`: the reward is r - alpha * (chars - mean) / std (the
            length-penalised baseline of `length_debias: penalty`), or None.
    """

    backbone: str = "minilm"
    gguf_file: str | None = None
    input_format: Literal["pair", "chat"] = "pair"
    instruction: str = ""
    max_length: int = 512
    tie_threshold: float = 0.0
    merged: bool = False
    num_heads: int = 1
    length_penalty: dict | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def load(cls, directory: str | Path) -> RewardModelSettings:
        if not Path(directory).is_dir():
            raise FileNotFoundError(f"model directory not found: {directory}")
        path = Path(directory) / SETTINGS_FILE
        if not path.exists():
            raise FileNotFoundError(f"{directory} is not an emoreward model directory: {SETTINGS_FILE} is missing")
        data = json.loads(path.read_text())
        data.pop("emoreward_version", None)
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"{path}: unknown keys {sorted(unknown)}")
        return cls(**data)

    def save(self, directory: str | Path) -> None:
        from emoreward import __version__

        data = {"emoreward_version": __version__, **asdict(self)}
        (Path(directory) / SETTINGS_FILE).write_text(json.dumps(data, indent=2) + "\n")


@dataclass
class Encoded:
    """One tokenized (context, description) sequence."""

    input_ids: list[int]
    truncated: bool


def load_backbone(
    spec: BackboneSpec,
    *,
    dtype: torch.dtype = torch.float32,
    trust_remote_code: bool = False,
    model_kwargs: dict | None = None,
    num_heads: int = 1,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a backbone as a sequence-classification model with `num_heads` outputs (1: the reward; 2: the
    quality and length heads of a disentangled reward) and its tokenizer, pad token set.

    The new value head is initialised by transformers (normal, std = `initializer_range`), after the caller's
    `set_seed`. `trust_remote_code` stays off unless asked for.

    Raises:
        ImportError: if the package that carries the weights is not installed.
    """
    from trl.trainer.reward_trainer import suppress_seqcls_warning

    path = spec.resolve()
    kwargs = dict(model_kwargs or {})
    if spec.gguf_file:
        kwargs["gguf_file"] = spec.gguf_file
    tokenizer = (
        AutoTokenizer.from_pretrained(path, gguf_file=spec.gguf_file, trust_remote_code=trust_remote_code)
        if spec.gguf_file
        else AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    )
    with suppress_seqcls_warning():
        model = AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=num_heads, dtype=dtype, trust_remote_code=trust_remote_code, **kwargs
        )
    if spec.gguf_file:
        _forget_gguf_quantization(model)
    set_pad_token(model, tokenizer)
    return model, tokenizer


def _forget_gguf_quantization(model: PreTrainedModel) -> None:
    """transformers dequantizes GGUF weights to plain float tensors on load but keeps a GGUF quantizer on the
    model, which the Trainer refuses to train and which a saved export would carry. The tensors are ordinary
    weights: drop the marker."""
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if getattr(model, "is_quantized", False) and not isinstance(type(model).__dict__.get("is_quantized"), property):
        model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def set_pad_token(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Give the tokenizer and the model config the same pad token id.

    A decoder's value head is read at the last token that is not padding, so a pad token equal to EOS would
    hide a trailing EOS: prefer an existing special token distinct from EOS (`<|endoftext|>`, `<pad>`, unk).
    """
    eos = tokenizer.eos_token_id
    if tokenizer.pad_token_id is None or (eos is not None and tokenizer.pad_token_id == eos):
        vocab = tokenizer.get_vocab()
        for candidate in ("<|endoftext|>", "<pad>", "<|pad|>", "[PAD]", tokenizer.unk_token):
            if candidate and candidate in vocab and vocab[candidate] != eos:
                tokenizer.pad_token = candidate
                break
        else:
            if tokenizer.pad_token_id is None:
                tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    if hasattr(model.config, "get_text_config"):
        model.config.get_text_config().pad_token_id = tokenizer.pad_token_id


class EmoRewardModel:
    """A scalar emotion reward model r(description | context).

    Use `from_backbone` to start training, `from_pretrained` to load a saved or merged model, `score` to get
    rewards, `save_pretrained` / `export_merged` to write it out.

    Args:
        model: a one-output sequence-classification model, optionally a peft `PeftModel`.
        tokenizer: its tokenizer, pad token set.
        settings: input layout, length limit and tie threshold.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, settings: RewardModelSettings):
        self.model = model
        self.tokenizer = tokenizer
        self.settings = settings
        if settings.input_format == "pair":
            # absolute position embeddings: padding must go on the right
            self.tokenizer.padding_side = "right"

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_backbone(
        cls,
        backbone: str = "minilm",
        *,
        gguf_file: str | None = None,
        lora_config=None,
        instruction: str | None = None,
        max_length: int = 512,
        dtype: torch.dtype = torch.float32,
        trust_remote_code: bool = False,
        model_kwargs: dict | None = None,
        train_head_bias: bool = False,
        num_heads: int = 1,
    ) -> EmoRewardModel:
        """A fresh reward model on a backbone; with `lora_config` (a `peft.LoraConfig`) wrapped in LoRA.

        A pairwise (Bradley-Terry, Rao-Kupper, Davidson) loss depends on reward differences only, so a bias
        in the value head gets no gradient: it is frozen unless `train_head_bias` (e.g. with a reward-centering
        term).

        Raises:
            ValueError: unknown backbone name; ImportError: weights package missing.
        """
        spec = get_backbone(backbone, gguf_file=gguf_file)
        model, tokenizer = load_backbone(
            spec, dtype=dtype, trust_remote_code=trust_remote_code, model_kwargs=model_kwargs, num_heads=num_heads
        )
        input_format = spec.input_format
        if input_format == "auto":
            input_format = "chat" if tokenizer.chat_template else "pair"
        if instruction is None:
            instruction = DEFAULT_INSTRUCTION if input_format == "chat" else ""
        if lora_config is not None:
            from peft import get_peft_model

            if lora_config.target_modules is None:
                lora_config.target_modules = spec.lora_target_modules
            model = get_peft_model(model, lora_config)
        if not train_head_bias:
            for name, param in model.named_parameters():
                if name.endswith("bias") and ("classifier" in name or "score" in name):
                    param.requires_grad_(False)
        settings = RewardModelSettings(
            backbone=spec.name,
            gguf_file=spec.gguf_file,
            input_format=input_format,
            instruction=instruction,
            max_length=max_length,
            num_heads=num_heads,
        )
        return cls(model, tokenizer, settings)

    @classmethod
    def from_pretrained(
        cls, directory: str | Path, *, dtype: torch.dtype = torch.float32, trust_remote_code: bool = False
    ) -> EmoRewardModel:
        """Load a model written by `save_pretrained` (adapter + head) or `export_merged` (full weights).

        A multimodal model directory (`emoreward_multimodal.json`) loads as a
        `emoreward.models.multimodal.MultimodalEmoRewardModel` (score with `score_descriptions(media, subtitle,
        descriptions)`).

        Raises:
            FileNotFoundError: if `directory` has no `emoreward_config.json` (nor `emoreward_multimodal.json`).
        """
        directory = Path(directory)
        if (directory / "emoreward_multimodal.json").exists():
            from emoreward.models.multimodal import MultimodalEmoRewardModel

            return MultimodalEmoRewardModel.from_pretrained(directory, dtype=dtype)  # type: ignore[return-value]
        settings = RewardModelSettings.load(directory)
        tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=trust_remote_code)
        if settings.merged or not (directory / "adapter_config.json").exists():
            model = AutoModelForSequenceClassification.from_pretrained(
                directory, dtype=dtype, trust_remote_code=trust_remote_code
            )
        else:
            from peft import PeftModel

            spec = get_backbone(settings.backbone, gguf_file=settings.gguf_file)
            base, _ = load_backbone(
                spec, dtype=dtype, trust_remote_code=trust_remote_code, num_heads=settings.num_heads
            )
            base.config.pad_token_id = tokenizer.pad_token_id
            model = PeftModel.from_pretrained(base, directory)
        model.eval()
        return cls(model, tokenizer, settings)

    # ------------------------------------------------------------------ inputs
    def context_text(self, subtitle: str | None = None) -> str:
        """The context the description is conditioned on: the instruction, plus the subtitle when known."""
        parts = [self.settings.instruction] if self.settings.instruction else []
        if subtitle:
            parts.append(f"Subtitle: {subtitle}")
        return "\n".join(parts)

    def encode(self, description: str, subtitle: str | None = None, *, truncate: bool = True) -> Encoded:
        """Token ids of one (context, description) sequence, the same for training and scoring.

        With `truncate`, the description (never the context or the closing special tokens) is cut so that the
        sequence fits `max_length`; `Encoded.truncated` says whether that happened.

        Raises:
            ValueError: if the context alone leaves no room for the description.
        """
        prefix, suffix = self._template(self.context_text(subtitle))
        body = self.tokenizer(description, add_special_tokens=False)["input_ids"]
        room = self.settings.max_length - len(prefix) - len(suffix)
        if room <= 0:
            raise ValueError(
                f"max_length={self.settings.max_length} leaves no room for the description "
                f"(context and special tokens take {len(prefix) + len(suffix)} tokens)"
            )
        truncated = len(body) > room
        if truncated and truncate:
            body = body[:room]
        return Encoded(prefix + body + suffix, truncated)

    def _template(self, context: str) -> tuple[list[int], list[int]]:
        key = context
        cache = self.__dict__.setdefault("_template_cache", {})
        if key not in cache:
            tok = self.tokenizer
            if self.settings.input_format == "chat":
                messages = [{"role": "assistant", "content": _SENTINEL}]
                if context:
                    messages.insert(0, {"role": "user", "content": context})
                text = tok.apply_chat_template(messages, tokenize=False)
                head, tail = text.split(_SENTINEL)
                cache[key] = (
                    tok(head, add_special_tokens=False)["input_ids"],
                    tok(tail, add_special_tokens=False)["input_ids"],
                )
            else:
                cls_ids = [tok.cls_token_id] if tok.cls_token_id is not None else []
                sep_ids = [tok.sep_token_id] if tok.sep_token_id is not None else []
                ctx = tok(context, add_special_tokens=False)["input_ids"] + sep_ids if context else []
                cache[key] = (cls_ids + ctx, sep_ids)
        return cache[key]

    # ------------------------------------------------------------------ scoring
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def score_ids(self, sequences: list[list[int]], batch_size: int = 32) -> np.ndarray:
        """Rewards for already-encoded sequences.

        Sequences are sorted by length and padded per batch (pad side: right for encoders, the tokenizer's for
        decoders, whose position ids are taken from the attention mask), so a score does not depend on the
        other sequences in the batch or on the padding side.

        Returns:
            `np.ndarray` of shape `(len(sequences),)`, float64: unnormalised rewards (logits of the value head).
        """
        self.model.eval()
        out = np.empty(len(sequences), dtype=np.float64)
        order = np.argsort([len(s) for s in sequences], kind="stable")
        pad_id = self.tokenizer.pad_token_id
        left = self.tokenizer.padding_side == "left" and self.settings.input_format == "chat"
        device = self.device
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            batch = [sequences[i] for i in idx]
            width = max(len(s) for s in batch)
            ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, seq in enumerate(batch):
                if left:
                    ids[row, width - len(seq) :] = torch.tensor(seq)
                    mask[row, width - len(seq) :] = 1
                else:
                    ids[row, : len(seq)] = torch.tensor(seq)
                    mask[row, : len(seq)] = 1
            inputs = {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
            if self.settings.input_format == "chat":
                inputs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0).to(device)
            logits = self.model(**inputs).logits
            out[idx] = logits[:, 0].float().cpu().numpy()  # head 0: the reward (quality head if disentangled)
        return out

    def score(
        self, descriptions: list[str], subtitles: list[str | None] | None = None, batch_size: int = 32
    ) -> np.ndarray:
        """Rewards r(description | context) for a list of descriptions.

        Args:
            descriptions: `N` emotion descriptions.
            subtitles: optional `N` subtitles (context) aligned with `descriptions`.
            batch_size: sequences per forward pass.

        Returns:
            `np.ndarray` of shape `(N,)`, float64, unnormalised rewards. Descriptions longer than `max_length`
            are truncated (count them with `count_truncated`). With a `length_penalty` in the settings,
            the penalty is subtracted here (it is not part of the network, so `export_merged` cannot carry it).
        """
        subtitles = subtitles if subtitles is not None else [None] * len(descriptions)
        if len(subtitles) != len(descriptions):
            raise ValueError(f"{len(descriptions)} descriptions but {len(subtitles)} subtitles")
        encoded = [self.encode(d, s).input_ids for d, s in zip(descriptions, subtitles)]
        rewards = self.score_ids(encoded, batch_size=batch_size)
        penalty = self.settings.length_penalty
        if penalty:
            lengths = np.array([len(d) for d in descriptions], dtype=np.float64)
            rewards = rewards - penalty["alpha"] * (lengths - penalty["mean"]) / penalty["std"]
        return rewards

    def count_truncated(self, descriptions: list[str], subtitles: list[str | None] | None = None) -> int:
        """How many of these descriptions `score` would truncate to fit `max_length`."""
        subtitles = subtitles if subtitles is not None else [None] * len(descriptions)
        return sum(self.encode(d, s, truncate=False).truncated for d, s in zip(descriptions, subtitles))

    # ------------------------------------------------------------------ saving
    def save_pretrained(self, directory: str | Path, *, model_card: str | None = None) -> Path:
        """Write adapter + value head (or full weights), tokenizer, settings and model card as safetensors."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)
        self.settings.save(directory)
        if model_card:
            (directory / "README.md").write_text(model_card)
        return directory

    def export_merged(self, directory: str | Path, *, model_card: str | None = None) -> Path:
        """Merge LoRA into the backbone and save a plain checkpoint that
        `AutoModelForSequenceClassification.from_pretrained(directory)` loads with no missing or unexpected keys.

        The merge runs on a copy: this model keeps its adapter. (For a 7B model the copy needs a second set of
        weights in CPU memory.)
        """
        model = self.model
        if hasattr(model, "merge_and_unload"):
            model = copy.deepcopy(model).merge_and_unload()
        elif self.settings.num_heads > 1:
            model = copy.deepcopy(model)
        if self.settings.length_penalty:
            logger.warning(
                "export_merged: the length penalty is applied by EmoRewardModel.score only, not by the export"
            )
        settings = copy.deepcopy(self.settings)
        if settings.num_heads > 1:
            _keep_first_head(model)  # ODIN: export only the quality reward
            settings.num_heads = 1
        merged = EmoRewardModel(model, self.tokenizer, settings)
        merged.settings.merged = True
        return merged.save_pretrained(directory, model_card=model_card)

    def inference_copy(self, dtype: torch.dtype = torch.float32) -> EmoRewardModel:
        """A copy with LoRA merged into the weights, in `dtype`, for fast scoring; this model is unchanged.

        Merging removes the adapter's extra matmuls (float32: rewards equal within about 1e-6); bfloat16 is
        about 3x faster again on CPUs with AVX512-BF16 or AMX, with rewards within about 1e-2 (a pair whose two
        rewards are that close can change verdict).
        """
        model = copy.deepcopy(self.model)
        if hasattr(model, "merge_and_unload"):
            model = model.merge_and_unload()
        model.to(dtype).eval()
        return EmoRewardModel(model, self.tokenizer, copy.deepcopy(self.settings))

    def trainable_parameters(self) -> dict[str, torch.Tensor]:
        """Detached copies of every trainable parameter, by name (to check that training changed them)."""
        return {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}


def _keep_first_head(model: PreTrainedModel) -> None:
    """Cut a multi-output sequence-classification head down to its first output, in place."""
    for name in ("score", "classifier"):
        head = getattr(model, name, None)
        if isinstance(head, torch.nn.Linear):
            new = torch.nn.Linear(head.in_features, 1, bias=head.bias is not None, dtype=head.weight.dtype)
            with torch.no_grad():
                new.weight.copy_(head.weight[:1])
                if head.bias is not None:
                    new.bias.copy_(head.bias[:1])
            setattr(model, name, new)
            model.config.num_labels = 1
            model.num_labels = 1
            return
    raise ValueError(f"no `score` or `classifier` Linear head found on {type(model).__name__}")


DEFAULT_INSTRUCTION = (
    "Describe the emotional state of the person in the video: facial expression, voice, words, "
    "intensity and how it changes over time."
)

"""Text reward models (`TextRewardModel`): r(description | instruction, subtitle) from a value head on a
transformers text backbone, LoRA-adapted with peft; the token layout is `emoreward.models.layout` and scoring runs
through `emoreward.models.scoring`. See docs/training.md.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Hashable, Iterator, Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from emoreward.data.context import subtitle_key
from emoreward.models.backbones import BackboneSpec, get_backbone
from emoreward.models.base import (
    RewardContext,
    RewardKind,
    RewardModelBase,
    TextSettings,
    apply_score_transform,
    as_context,
    check_finite_weights,
    check_model_files,
    load_settings,
)
from emoreward.models.coverage import CoverageScoreInfo, unknown_token_share
from emoreward.models.layout import Encoded, context_text, text_input_ids, text_input_ids_batch
from emoreward.models.loading import remember_source
from emoreward.models.packed import PackedEncoder, packed_encoder
from emoreward.models.precision import (
    dtype_name,
    dtype_request,
    parse_dtype,
    recorded_precision,
    resolve_dtype,
)
from emoreward.models.scoring import DEFAULT_CHUNK_SIZE, plan_batches, run_batches, stream_scores
from emoreward.utils.allocator import keep_freed_memory


logger = logging.getLogger(__name__)

# the tokenizer outputs the network reads (`score`, training): a saved tokenizer's `model_input_names`, so a reader's
# `model(**tokenizer(CONTEXTS, DESCRIPTIONS))` passes no `token_type_ids` the model was never trained with
MODEL_INPUTS = ("input_ids", "attention_mask")
ENGINE_ROW_MULTIPLE = 128  # token rows of a reduced-precision batch in the fast forward: a multiple of this

DEFAULT_INSTRUCTION = (
    "Describe the emotional state of the person in the video: facial expression, voice, words, "
    "intensity and how it changes over time."
)


# ---------------------------------------------------------------------------------------------- loading
def load_backbone(
    spec: BackboneSpec,
    *,
    dtype: torch.dtype = torch.float32,
    trust_remote_code: bool = False,
    model_kwargs: dict | None = None,
    num_heads: int = 1,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A text backbone as a sequence-classification model with `num_heads` outputs (1: the reward; 2: a disentangled
    reward's quality and length heads) and its tokenizer, pad token set; the new head is initialised by transformers.

    Raises:
        ImportError: the package that carries the weights is not installed."""
    from trl.trainer.reward_trainer import suppress_seqcls_warning

    path = spec.resolve()
    kwargs = dict(model_kwargs or {})
    gguf = {"gguf_file": spec.gguf_file} if spec.gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, **gguf)
    with suppress_seqcls_warning(), _quiet_load_report():
        model = load_pretrained(
            AutoModelForSequenceClassification, path, gguf_file=spec.gguf_file, num_labels=num_heads, dtype=dtype,
            trust_remote_code=trust_remote_code, **kwargs,
        )  # fmt: skip
    set_pad_token(model, tokenizer)
    return model, tokenizer


class _quiet_load_report:
    """transformers prints a load report listing the new value head as MISSING before anyone fills it (a LoRA
    adapter or `from_pretrained` of the head); the head being new is expected, so silence that report."""

    def __enter__(self):
        from transformers.utils import logging as hf_logging

        self._level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()

    def __exit__(self, *exc):
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity(self._level)


def load_pretrained(auto_class, path: str, *, gguf_file: str | None = None, **kwargs) -> PreTrainedModel:
    """The one way a text checkpoint's weights are read (a reward backbone, a generative judge to score or to train):
    ``auto_class.from_pretrained(path, gguf_file=..., **kwargs)``; a GGUF file is dequantized by transformers and the
    quantizer marker it leaves is dropped, so the weights train (the Trainer refuses a "quantized" model) and export
    as plain ones."""
    model = auto_class.from_pretrained(path, **({"gguf_file": gguf_file} if gguf_file else {}), **kwargs)
    if gguf_file:
        _forget_gguf_quantization(model)
    return model


def _forget_gguf_quantization(model: PreTrainedModel) -> None:
    """Drop the GGUF quantizer transformers keeps on a model whose GGUF weights it dequantized (the Trainer refuses
    to train a quantized model and an export would carry the marker)."""
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if getattr(model, "is_quantized", False) and not isinstance(type(model).__dict__.get("is_quantized"), property):
        model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def set_pad_token(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Give the tokenizer and the model config the same pad token id, distinct from EOS where the tokenizer has
    another special token (a decoder's head reads the last non-pad token, so pad == EOS would hide a trailing EOS)."""
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


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, directory: str | Path, *, max_length: int) -> None:
    """Save a tokenizer that transformers 4.x (pinned by vLLM-based RL stacks) loads as well as 5.x (class
    `PreTrainedTokenizerFast` instead of 5.x's `TokenizersBackend`), with the reader settings of the model it belongs
    to: `model_max_length` is the model's own `max_length` (tokens of one sequence, `settings.max_length`) and
    `truncation_side` right, so a reader that tokenizes with `truncation=True` cuts where the model was trained and
    scores, not at the backbone's limit (V09); `model_input_names` is what the network reads (`MODEL_INPUTS`), so
    `model(**tokenizer(...))` and transformers' pipelines pass no `token_type_ids` (a BERT tokenizer's default).
    Every saved or exported folder (text, merged, multimodal) is written here; the tokenizer object is left as it
    was."""
    import json

    from emoreward.utils.io import atomic_write_text

    tokenizer.save_pretrained(directory)
    path = Path(directory) / "tokenizer_config.json"
    if path.exists():
        config = json.loads(path.read_text(encoding="utf-8"))
        if config.get("tokenizer_class") == "TokenizersBackend":
            config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config.update(model_max_length=int(max_length), truncation_side="right", model_input_names=list(MODEL_INPUTS))
        atomic_write_text(path, json.dumps(config, indent=2, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------------------------------------- the model
class TextRewardModel(RewardModelBase):
    """A text emotion reward model r(description | instruction, subtitle) (`RewardModel`, kind `"text"`).

    `model` holds the master weights (float32, with the LoRA adapter while training); with `scoring_dtype` set,
    scoring runs on an inference copy (`scoring_network`: LoRA merged, cast), made again when the weights change.

    Args:
        model: a `num_heads`-output sequence-classification model, optionally a peft `PeftModel`.
        tokenizer: its tokenizer, pad token set.
        settings: input layout, length limit, tie threshold.
        batch_size: most sequences per forward pass of `score`.
        scoring_dtype: None (score with `model` as it is), `"auto"`, or a dtype (name): score on an inference copy.
        max_batch_tokens: most padded tokens per forward pass of `score` (default: `default_batch_tokens`)."""

    kind: ClassVar[RewardKind] = "text"

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        settings: TextSettings,
        *,
        batch_size: int = 32,
        scoring_dtype: str | torch.dtype | None = None,
        max_batch_tokens: int | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.settings = settings
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens
        self._scorer: torch.nn.Module | None = None
        self._scorer_key: tuple | None = None
        self._engine: tuple | None = None  # (key of the network it was made for, PackedEncoder or None)
        self.scoring_dtype = scoring_dtype
        if settings.input_format == "pair":
            self.tokenizer.padding_side = "right"  # absolute position embeddings: padding must go on the right

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
    ) -> TextRewardModel:
        """A fresh reward model on a registered text backbone, path or hub id; with `lora_config` (a `peft.LoraConfig`)
        wrapped in LoRA. The value head's bias gets no gradient from a pairwise loss: it is frozen unless
        `train_head_bias`.

        Raises:
            ValueError: unknown backbone name, or a media backbone; ImportError: weights package missing."""
        spec = get_backbone(backbone, gguf_file=gguf_file)
        if spec.kind != "text":
            raise ValueError(f"backbone {spec.name!r} is a {spec.kind} backbone; use MediaRewardModel")
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
                target = spec.lora_target_modules
                lora_config.target_modules = list(target) if isinstance(target, tuple) else target
            try:
                model = get_peft_model(model, lora_config)
            except ValueError as err:  # peft: "Target modules ... not found in the base model"
                raise ValueError(f"lora_target_modules={lora_config.target_modules!r}: {err}") from None
        if not train_head_bias:
            for name, param in model.named_parameters():
                if name.endswith("bias") and ("classifier" in name or "score" in name):
                    param.requires_grad_(False)
        settings = TextSettings(
            backbone=spec.name,
            model_name_or_path=spec.name,
            gguf_file=spec.gguf_file,
            input_format=input_format,
            instruction=instruction,
            max_length=max_length,
            num_heads=num_heads,
        )
        return cls(model, tokenizer, settings)

    @classmethod
    def from_pretrained(
        cls,
        directory: str | Path,
        *,
        dtype: str | torch.dtype | None = "auto",
        trust_remote_code: bool = False,
        batch_size: int = 32,
    ) -> TextRewardModel:
        """Load a model written by `save_pretrained` (adapter + head) or `export_merged` (full weights), in float32;
        `dtype` is the scoring precision: `"auto"` (`emoreward.models.precision.resolve_dtype`), a dtype or its name, or
        None (the saved network as it is: the exact reference).

        Raises:
            FileNotFoundError: `directory` is not an emoreward model directory; ValueError: it holds a media model,
            `dtype` is unknown or a weights file is cut short (`check_model_files`)."""
        scoring_dtype = None if dtype is None else parse_dtype(dtype)
        directory = Path(directory)
        settings = load_settings(directory)
        if not isinstance(settings, TextSettings):
            raise ValueError(f"{directory} holds a {settings.kind} reward model; load it with load_reward_model")
        check_model_files(directory, settings)
        tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=trust_remote_code)
        if settings.merged or not (directory / "adapter_config.json").exists():
            model = AutoModelForSequenceClassification.from_pretrained(
                directory, dtype=torch.float32, trust_remote_code=trust_remote_code
            )
        else:
            from peft import PeftModel

            spec = get_backbone(settings.backbone, gguf_file=settings.gguf_file)
            base, _ = load_backbone(
                spec, dtype=torch.float32, trust_remote_code=trust_remote_code, num_heads=settings.num_heads
            )
            base.config.pad_token_id = tokenizer.pad_token_id
            model = PeftModel.from_pretrained(base, directory)
        model.eval()
        positions = getattr(model.config, "max_position_embeddings", None)
        if settings.max_length and isinstance(positions, int) and settings.max_length > positions:
            # a hand-edited or other tool's folder: `train` refuses this setting; scoring would index past the table
            raise ValueError(
                f"{directory}: max_length {settings.max_length} exceeds the backbone's {positions} token positions "
                "(max_position_embeddings): set max_length to at most that in its emoreward settings"
            )
        loaded = cls(model, tokenizer, settings, batch_size=batch_size, scoring_dtype=scoring_dtype)
        check_finite_weights(model, str(directory))  # a diverged or poisoned model is refused at load
        remember_source(loaded, directory)  # its content identity: part of every cache key of its outputs
        return loaded

    # ------------------------------------------------------------------ inputs
    def context_key(self, context: RewardContext) -> Hashable:
        """A text model reads the subtitle only (`emoreward.data.context.subtitle_key`)."""
        return subtitle_key(context)

    def encode(
        self, description: str, context: RewardContext | str | None = None, *, truncate: bool = True
    ) -> Encoded:
        """Token ids of one (context, description) sequence (`text_input_ids`; a string context is a subtitle;
        media in `context` are not read)."""
        subtitle = as_context(context).subtitle
        return text_input_ids(self.tokenizer, self.settings, description, subtitle, truncate=truncate)

    def encode_batch(
        self, descriptions: Sequence[str], contexts: Sequence[RewardContext | str | None], *, truncate: bool = True
    ) -> list[Encoded]:
        """`encode` of `N` (description, context) pairs with one tokenizer call (`text_input_ids_batch`: the same
        ids)."""
        subtitles = [as_context(c).subtitle for c in contexts]
        return text_input_ids_batch(self.tokenizer, self.settings, descriptions, subtitles, truncate=truncate)

    # ------------------------------------------------------------------ scoring
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the master weights (`model`)."""
        return next(self.model.parameters()).dtype

    @property
    def scoring_dtype(self) -> torch.dtype | str | None:
        """The requested scoring precision: None (the master weights as they are), `"auto"` or a torch dtype.
        Setting it (a dtype, its name, `"auto"` or None) resolves the precision again (`scoring_precision`)."""
        return self._scoring_dtype

    @scoring_dtype.setter
    def scoring_dtype(self, value: str | torch.dtype | None) -> None:
        self._scoring_dtype = None if value is None else parse_dtype(value)
        self._resolved: tuple | None = None

    @property
    def scoring_precision(self) -> torch.dtype:
        """The dtype `score` computes in: `scoring_dtype` resolved once on this model's device
        (`emoreward.models.precision.resolve_dtype`), or the master weights' dtype without one (and under ZeRO-3)."""
        if self.scoring_dtype is None or _zero3_partitioned(self.model):
            return self.dtype
        device = self.device
        if self._resolved is None or self._resolved[0] != device:
            pin = dtype_request(self.scoring_dtype)[1]  # what decides it, read with it (`dtype_pin`)
            self._resolved = (
                device,
                recorded_precision(self.scoring_dtype, device=device, settings=self.settings),
                pin,
            )
        return self._resolved[1]

    @property
    def dtype_pin(self) -> str | None:
        """What pinned `scoring_precision` when it was resolved (`emoreward.models.precision.dtype_request`:
        ``"dtype=<name>"``, ``"$EMOREWARD_DTYPE=<value>"``); None where the hardware rule chose it, or without a
        `scoring_dtype` (the master weights' dtype)."""
        if self.scoring_dtype is None or _zero3_partitioned(self.model):
            return None
        _ = self.scoring_precision  # resolved on this device
        return self._resolved[2]

    @property
    def scoring_network(self) -> torch.nn.Module:
        """The network `score` runs: `model` itself without `scoring_dtype` (or under DeepSpeed ZeRO-3, whose
        partitioned weights cannot be copied), else an inference copy (LoRA merged, cast) kept until the master weights'
        version counters move."""
        return self._scoring_parts()[0]

    def _scoring_parts(self) -> tuple[torch.nn.Module, PackedEncoder | None]:
        """(`scoring_network`, `scoring_engine`) for one scoring call; the master weights' parameters are walked once."""
        if self.scoring_dtype is None or _zero3_partitioned(self.model):
            return self.model, None
        params = list(self.model.parameters())
        dtype = self.scoring_precision
        if not hasattr(self.model, "merge_and_unload") and params[0].dtype == dtype:
            self._scorer = self._scorer_key = None
            network, key = self.model, (id(self.model), tuple(p._version for p in params))
        else:
            key = (dtype, id(self.model), tuple(p._version for p in params))
            if self._scorer is None or self._scorer_key != key:
                self._scorer = None  # free the stale copy before making the new one
                self._scorer = _inference_network(self.model, dtype)
                self._scorer_key = key
            network = self._scorer
            key = (id(network), tuple(p._version for p in network.parameters()))
        if self._engine is None or self._engine[0] != key:
            self._engine = None
            reduced = dtype != torch.float32
            self._engine = (key, packed_encoder(network, row_multiple=ENGINE_ROW_MULTIPLE if reduced else 1))
        return network, self._engine[1]

    @property
    def scoring_engine(self) -> PackedEncoder | None:
        """The fast forward of `scoring_network` (`emoreward.models.packed.PackedEncoder`) when `scoring_dtype` is set
        and the network is one it reproduces; None: the network's own `forward` (the exact reference)."""
        return self._scoring_parts()[1]

    def default_batch_tokens(self) -> int:
        """The token budget of a forward pass when none is set: 4,096 padded tokens on CPU (the matrix multiplies
        are as fast per FLOP as with larger batches and the attention scores stay in cache), 16,384 on GPU."""
        return 16384 if self.device.type == "cuda" else 4096

    def default_pad_multiple(self) -> int:
        """Padded widths are rounded up to this multiple: 1 in float32 on CPU and with the `scoring_engine`; 32 in
        reduced precision on CPU otherwise (oneDNN compiles a kernel per matrix shape); 8 on GPU (tensor-core tiles)."""
        return self._pad_multiple(self.scoring_engine)

    def _pad_multiple(self, engine: PackedEncoder | None) -> int:
        """`default_pad_multiple` with the scoring engine already in hand."""
        if self.device.type == "cuda":
            return 8
        if engine is not None or self.scoring_precision == torch.float32:
            return 1
        return 32

    def plan_batches(
        self,
        lengths: Sequence[int],
        batch_size: int | None = None,
        max_batch_tokens: int | None = None,
        pad_to_multiple_of: int | None = None,
    ) -> list[tuple[np.ndarray, int]]:
        """How `score_ids` batches sequences of these lengths (`emoreward.models.scoring.plan_batches`, with this
        model's defaults).

        Returns:
            `[(indices into lengths, padded width), ...]` in the order they run."""
        return plan_batches(
            lengths,
            batch_size or self.batch_size,
            max_batch_tokens or self.max_batch_tokens or self.default_batch_tokens(),
            pad_to_multiple_of or self.default_pad_multiple(),
        )

    def score_ids(
        self,
        sequences: Sequence[Sequence[int]],
        batch_size: int | None = None,
        max_batch_tokens: int | None = None,
        pad_to_multiple_of: int | None = None,
    ) -> np.ndarray:
        """Raw value-head rewards (head 0) of already-encoded sequences, in length-sorted batches (`plan_batches`); a
        score does not depend on the other sequences of its batch or the padding side (float32: within about 1e-6).

        Returns:
            `np.ndarray` of shape `(len(sequences),)`, float64: unnormalised rewards (value-head logits)."""
        network, engine = self._scoring_parts()
        network.eval()
        out = np.empty(len(sequences), dtype=np.float64)
        pad_id = self.tokenizer.pad_token_id
        chat = self.settings.input_format == "chat"
        left = chat and self.tokenizer.padding_side == "left"
        device = self.device
        if device.type == "cpu":
            keep_freed_memory()
        plan = self.plan_batches(
            [len(s) for s in sequences], batch_size, max_batch_tokens, pad_to_multiple_of or self._pad_multiple(engine)
        )

        def forward(idx: np.ndarray, width: int) -> None:
            if engine is not None:
                logits = engine([sequences[i] for i in idx], width)
            else:
                ids = np.full((len(idx), width), pad_id, dtype=np.int64)
                mask = np.zeros((len(idx), width), dtype=np.int64)
                for row, i in enumerate(idx):
                    seq, n = sequences[i], len(sequences[i])
                    cols = slice(width - n, width) if left else slice(0, n)
                    ids[row, cols], mask[row, cols] = seq, 1
                ids_t, mask_t = torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)
                inputs = {"input_ids": ids_t, "attention_mask": mask_t}
                if chat:
                    inputs["position_ids"] = (mask_t.cumsum(-1) - 1).clamp(min=0)
                logits = network(**inputs).logits
            out[idx] = logits[:, 0].float().cpu().numpy()  # head 0: the reward (quality head if disentangled)

        # the fast forward's batches are independent: on CPU they run side by side, one per torch thread
        run_batches(plan, forward, workers=torch.get_num_threads() if engine is not None else 1)
        return out

    def score_encoded(
        self, encoded: Sequence[Encoded], descriptions: Sequence[str], *, batch_size: int | None = None
    ) -> CoverageScoreInfo:
        """`score_info` of already-encoded descriptions (`encode` / `encode_batch`; `descriptions` are their texts,
        for the score transform and the unknown-token share where the encoding has none)."""
        rewards = self.score_ids([e.input_ids for e in encoded], batch_size=batch_size)
        rewards = apply_score_transform(rewards, [len(d) for d in descriptions], self.settings.score_transform)
        shares = [e.unknown_share for e in encoded]
        return CoverageScoreInfo(
            rewards,
            np.array([e.truncated for e in encoded], dtype=bool),
            np.array([len(e.input_ids) for e in encoded], dtype=np.int64),
            np.array(shares, dtype=np.float64)
            if None not in shares
            else unknown_token_share(self.tokenizer, descriptions),
        )

    def score_stream(
        self,
        descriptions: Sequence[str],
        contexts: Sequence[RewardContext | None] | RewardContext | None = None,
        *,
        batch_size: int | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
    ) -> Iterator[tuple[np.ndarray, CoverageScoreInfo]]:
        """`score_info` chunk by chunk, as the engine runs it (`emoreward.models.scoring.stream_scores`).

        Yields:
            `(indices, info)`: positions in `descriptions` and their `CoverageScoreInfo`; every position once."""
        return stream_scores(self, descriptions, contexts, batch_size=batch_size, chunk_size=chunk_size)

    def score_contexts(
        self, descriptions: list[str], contexts: list[RewardContext], *, batch_size: int | None = None
    ) -> CoverageScoreInfo:
        """Rewards r(description | context) (`RewardModelBase.score_info` calls this), with truncation flags, token
        counts and unknown-token shares; only the subtitle of a context is read.

        Returns:
            `CoverageScoreInfo` with rewards of shape `(N,)`, float64, the settings' `score_transform` applied;
            descriptions longer than `max_length` are cut and flagged.

        Raises:
            ValueError: a context that leaves no room for the description (`text_input_ids`)."""
        n = len(descriptions)
        info = CoverageScoreInfo(
            np.empty(n, dtype=np.float64), np.zeros(n, dtype=bool), np.zeros(n, dtype=np.int64), np.zeros(n)
        )
        for idx, part in self.score_stream(descriptions, contexts, batch_size=batch_size):
            info.rewards[idx], info.truncated[idx] = part.rewards, part.truncated
            info.n_tokens[idx], info.unknown_share[idx] = part.n_tokens, part.unknown_share
        return info

    # ------------------------------------------------------------------ saving
    def save_pretrained(self, directory: str | Path, *, model_card: str | None = None) -> Path:
        """Write adapter + value head (or full weights), tokenizer, settings and model card (safetensors)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory, safe_serialization=True)
        save_tokenizer(self.tokenizer, directory, max_length=self.settings.max_length)
        _portable_adapter_config(directory)
        self.settings.save(directory)
        if model_card:
            (directory / "README.md").write_text(model_card, encoding="utf-8")
        return directory

    def export_merged(self, directory: str | Path, *, model_card: str | None = None) -> Path:
        """Merge LoRA into a copy of the backbone and save a plain checkpoint that
        `AutoModelForSequenceClassification.from_pretrained(directory)` loads with no missing or unexpected keys; a
        disentangled (two-head) model exports its quality head only."""
        model = self.model
        if hasattr(model, "merge_and_unload"):
            model = copy.deepcopy(model).merge_and_unload()
        elif self.settings.num_heads > 1:
            model = copy.deepcopy(model)
        settings = copy.deepcopy(self.settings)
        if settings.num_heads > 1:
            _keep_first_head(model)  # ODIN: export only the quality reward
            settings.num_heads = 1
        settings.merged = True
        out = TextRewardModel(model, self.tokenizer, settings).save_pretrained(directory, model_card=model_card)
        _mark_regression(out)
        return out

    def inference_copy(self, dtype: str | torch.dtype = torch.float32) -> TextRewardModel:
        """A copy with LoRA merged into the weights, in `dtype` (`"auto"`: see `emoreward.models.precision`), for fast
        scoring (float32: rewards within about 1e-6; bfloat16: within about 1e-2); this model is unchanged."""
        dtype = resolve_dtype(dtype, self.device)
        return TextRewardModel(
            _inference_network(self.model, dtype),
            self.tokenizer,
            copy.deepcopy(self.settings),
            batch_size=self.batch_size,
            max_batch_tokens=self.max_batch_tokens,
        )

    def trainable_parameters(self) -> dict[str, torch.Tensor]:
        """Detached copies of every trainable parameter, by name (to check that training changed them)."""
        return {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}


def _mark_regression(directory: Path) -> None:
    """`problem_type: regression` in an export's `config.json`: the reward is the raw output, so transformers'
    text-classification pipeline applies no sigmoid to it (as vLLM's `/classify` with `use_activation: false`)."""
    import json

    from emoreward.utils.io import atomic_write_text

    path = Path(directory) / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["problem_type"] = "regression"
    atomic_write_text(path, json.dumps(config, indent=2, sort_keys=True) + "\n")


def _zero3_partitioned(model: torch.nn.Module) -> bool:
    """Whether DeepSpeed ZeRO-3 has partitioned `model`'s parameters (they carry a `ds_id`; ZeRO-3 converts every
    parameter of the module it wraps, so the first one tells)."""
    first = next(model.parameters(), None)
    return first is not None and hasattr(first, "ds_id")


def _inference_network(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of `model` for scoring: LoRA merged into the weights (the adapter's extra matmuls gone), cast to
    `dtype`, in eval mode, no gradients. `model` is unchanged."""
    with torch.no_grad():
        net = copy.deepcopy(model)
        if hasattr(net, "merge_and_unload"):
            net = net.merge_and_unload()
        net.to(dtype).eval()
    for param in net.parameters():
        param.requires_grad_(False)
    logger.debug("scoring copy of %s in %s", type(net).__name__, dtype_name(dtype))
    return net


def _portable_adapter_config(directory: Path) -> None:
    """Record a packaged registered backbone in `adapter_config.json` by its hub id instead of the training machine's
    absolute path, so `peft.AutoPeftModel*` resolves it anywhere (GGUF weights keep the path)."""
    import json

    from emoreward.utils.io import atomic_write_text

    path = directory / "adapter_config.json"
    if not path.exists():
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    base = config.get("base_model_name_or_path")
    if base and Path(base).is_absolute():
        from emoreward.models.backbones import BACKBONES

        for spec in BACKBONES.values():
            if spec.package and not spec.gguf_file and spec.resolve() == base:
                config["base_model_name_or_path"] = spec.aliases[-1] if spec.aliases else spec.name
                atomic_write_text(path, json.dumps(config, indent=2) + "\n")
                return


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


__all__ = [
    "DEFAULT_INSTRUCTION",
    "Encoded",
    "TextRewardModel",
    "context_text",
    "load_backbone",
    "save_tokenizer",
    "set_pad_token",
    "text_input_ids",
    "text_input_ids_batch",
]

"""The multimodal reward network: a backbone's decoder stack plus a value head
`score = Linear(hidden, num_heads, bias=False)` read at the last non-pad token; `score_shared_prefix` runs one media
prefix once and continues its KV cache for every description. See docs/multimodal.md.
"""

from __future__ import annotations

import copy
import inspect

import torch
from torch import nn

from emoreward.models.backbones import BackboneSpec
from emoreward.models.media.positions import qwen2_5_vl_positions


def init_value_head(head: nn.Linear, std: float) -> None:
    """Normal(0, std) initialisation that is correct under DeepSpeed ZeRO-3, where a parameter created inside
    `zero.Init` is a 0-sized shard: gather it, initialise on rank 0, let DeepSpeed scatter it back."""
    weight = head.weight
    if hasattr(weight, "ds_id"):  # a ZeRO-3 partitioned parameter
        import deepspeed

        with deepspeed.zero.GatheredParameters([weight], modifier_rank=0):
            nn.init.normal_(weight, mean=0.0, std=std)
    else:
        nn.init.normal_(weight, mean=0.0, std=std)


def _cache_restorer(cache):
    """A function that puts the prefix's key / value tensors back into `cache`, or None for a cache whose layers do
    not hold them as `keys` / `values` attributes (then each chunk works on a deep copy).

    A dynamic cache replaces its tensors (repeat for the batch, concatenation of new tokens) and never writes into
    them, so keeping references to the prefix's tensors is enough to reuse them for the next chunk without copying
    the whole cache first."""
    layers = getattr(cache, "layers", None)
    if not layers or not all(torch.is_tensor(getattr(layer, "keys", None)) for layer in layers):
        return None
    saved = [(layer.keys, layer.values) for layer in layers]

    def restore() -> None:
        for layer, (keys, values) in zip(layers, saved):
            layer.keys, layer.values = keys, values

    return restore


def mm_token_type_ids(input_ids: torch.Tensor, config) -> torch.Tensor:
    """Qwen3.5's token types (`(batch, seq_len)`, int32: 0 text, 1 image token, 2 video token), from the ids by the
    rule of transformers' `ProcessorMixin.create_mm_token_type_ids` (the model places its M-RoPE by them)."""
    types = torch.zeros_like(input_ids, dtype=torch.int32)
    types[input_ids == int(config.image_token_id)] = 1
    types[input_ids == int(config.video_token_id)] = 2
    return types


class ValueHeadModel(nn.Module):
    """Backbone decoder + value head `score` (Linear(hidden, num_heads, bias=False)) read at the last non-pad token.

    Args:
        backbone: the full `transformers` model (`Qwen2_5_VLForConditionalGeneration`, ...); its `.model`
            (decoder stack with media merging, no LM head) is run.
        spec: its registry entry.
        use_audio_in_video: the sequences carry the video's own audio interleaved with its frames (the official
            Qwen2.5-Omni processor's `load_audio_from_video` layout); passed to the thinker so its rotary
            positions follow that layout. Must match how the inputs were built (`MediaOptions`).
        num_heads: value-head outputs: 1 (the reward), or 2 for the disentangled reward (head 0 = quality = the
            reward, head 1 = length; ODIN).

    Raises:
        ValueError: `use_audio_in_video` for a backbone without that layout (`spec.interleaves_audio_in_video`).
    """

    main_input_name = "input_ids"
    base_model_prefix = ""  # peft asks for it (transformers weight-conversion scopes)
    supports_gradient_checkpointing = True

    def __init__(
        self, backbone: nn.Module, spec: BackboneSpec, *, use_audio_in_video: bool = False, num_heads: int = 1
    ):
        super().__init__()
        if use_audio_in_video and not spec.interleaves_audio_in_video:
            raise ValueError(f"{spec.name!r} has no interleaved audio-in-video layout (use_audio_in_video)")
        self.backbone = backbone
        self.spec = spec
        self.use_audio_in_video = use_audio_in_video
        text_config = backbone.config.get_text_config()
        weight = next(backbone.parameters())
        self.num_heads = num_heads
        self.score = nn.Linear(
            text_config.hidden_size, num_heads, bias=False, dtype=weight.dtype, device=weight.device
        )
        init_value_head(self.score, getattr(text_config, "initializer_range", 0.02))
        self.config = backbone.config
        self.config.num_labels = 1  # TRL's RewardTrainer checks it

    @property
    def inner(self) -> nn.Module:
        return self.backbone.model

    def positions(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, media: dict
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Qwen2.5-VL: `(position_ids (3, batch, seq_len), deltas (batch, 1))` by the one position rule
        (`emoreward.models.media.positions`: the release's and vLLM's); None for the other backbones (Qwen2.5-Omni's
        thinker applies that rule itself, Qwen2-Audio has 1-D positions)."""
        if self.spec.name != "qwen2.5-vl" or media.get("video_grid_thw") is None:
            return None
        config = self.config
        return qwen2_5_vl_positions(
            input_ids,
            attention_mask,
            video_grid_thw=media["video_grid_thw"],
            second_per_grid_ts=media.get("second_per_grid_ts"),
            video_token_id=config.video_token_id,
            image_token_id=config.image_token_id,
            spatial_merge_size=config.vision_config.spatial_merge_size,
            tokens_per_second=config.vision_config.tokens_per_second,
        )

    def _media_kwargs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, media: dict) -> dict:
        kwargs = {k: v for k, v in media.items() if v is not None}
        rule = self.positions(input_ids, attention_mask, kwargs)
        if rule is not None:
            kwargs["position_ids"] = rule[0]
        if self.spec.token_types:
            kwargs["mm_token_type_ids"] = mm_token_type_ids(input_ids, self.config)
        if self.spec.name == "qwen2.5-omni-thinker":
            # the interleaved audio-in-video layout changes how the thinker counts spans and assigns positions
            kwargs["use_audio_in_video"] = self.use_audio_in_video
        return kwargs

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **media) -> torch.Tensor:
        """Value-head outputs of a batch of sequences (column 0 is the reward).

        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, seq_len)`), attention_mask (same shape; padding
                on either side).
            **media: the backbone's media tensors (`pixel_values_videos`, `video_grid_thw`,
                `second_per_grid_ts` / `video_second_per_grid`, `input_features`, `feature_attention_mask`),
                one media item per sequence that has media, in batch order.

        Returns:
            logits (`torch.Tensor` of shape `(batch_size, num_heads)`): unnormalised; column 0 is the reward.
        """
        if getattr(self.inner, "rope_deltas", None) is not None:
            self.inner.rope_deltas = None  # stateful across calls in transformers; always recompute
        out = self.inner(
            input_ids=input_ids,
            attention_mask=attention_mask,
            use_cache=False,
            **self._media_kwargs(input_ids, attention_mask, media),
        )
        hidden = out.last_hidden_state
        positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
        last = (attention_mask.long() * positions).argmax(-1)  # last non-pad token, whatever the padding side
        return self.score(hidden[torch.arange(hidden.shape[0], device=hidden.device), last])

    @torch.no_grad()
    def score_shared_prefix(
        self, prefix_ids: list[int], media: dict, suffixes: list[list[int]], *, pad_token_id: int, batch_size: int = 16
    ) -> torch.Tensor:
        """Rewards of `prefix + suffix` for every suffix, running the prefix (and its media encoders) once.

        The prefix's KV cache is repeated over a batch of suffixes; suffix positions continue the prefix's
        (for M-RoPE backbones: text positions shifted by the prefix's `rope_deltas`), so every reward equals
        `forward` on the full sequence up to float rounding.

        Returns:
            `torch.Tensor` of shape `(len(suffixes),)`: the reward (value-head column 0) of each sequence.

        Raises:
            ValueError: a backbone whose layers cannot continue a shared cache (`spec.no_shared_prefix`).
        """
        if self.spec.no_shared_prefix:
            raise ValueError(
                f"{self.spec.name} cannot score behind a shared media prefix: {self.spec.no_shared_prefix}"
            )
        inner = self.inner
        lm = getattr(inner, "language_model", inner)
        device = self.score.weight.device
        if getattr(inner, "rope_deltas", None) is not None:
            inner.rope_deltas = None
        ids = torch.tensor([prefix_ids], device=device)
        mask = torch.ones_like(ids)
        media = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in media.items()}
        kwargs = self._media_kwargs(ids, mask, media)
        out = inner(input_ids=ids, attention_mask=mask, use_cache=True, **kwargs)
        cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        rule = self.positions(ids, mask, media)
        delta = rule[1] if rule is not None else getattr(inner, "rope_deltas", None) if self.spec.mrope else None
        cache_kw = "cache" if "cache" in inspect.signature(lm.forward).parameters else "past_key_values"
        n_prefix = len(prefix_ids)
        restore = _cache_restorer(cache)
        rewards = []
        for start in range(0, len(suffixes), batch_size):
            chunk = suffixes[start : start + batch_size]
            m, width = len(chunk), max(len(s) for s in chunk)
            sids = torch.full((m, width), pad_token_id, dtype=torch.long, device=device)
            smask = torch.zeros((m, width), dtype=torch.long, device=device)
            for row, seq in enumerate(chunk):
                sids[row, : len(seq)] = torch.tensor(seq, device=device)
                smask[row, : len(seq)] = 1
            if restore is not None:
                restore()  # the prefix's own tensors again (the last chunk replaced them with longer, repeated ones)
                chunk_cache = cache
            else:
                chunk_cache = copy.deepcopy(cache)
            chunk_cache.batch_repeat_interleave(m)
            pos = (n_prefix + torch.arange(width, device=device)).unsqueeze(0).expand(m, -1)
            if self.spec.mrope:
                shift = delta.to(device).reshape(-1)[0] if delta is not None else 0
                pos = (pos + shift).unsqueeze(0).expand(3, -1, -1)
            hidden = lm(
                inputs_embeds=lm.get_input_embeddings()(sids),
                attention_mask=torch.cat([torch.ones((m, n_prefix), dtype=torch.long, device=device), smask], dim=1),
                position_ids=pos,
                use_cache=True,
                **{cache_kw: chunk_cache},
            ).last_hidden_state
            last = smask.sum(-1) - 1
            rewards.append(self.score(hidden[torch.arange(m, device=device), last])[:, 0])
        return torch.cat(rewards)

    # Trainer / peft hooks, delegated to the backbone
    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None, **kwargs) -> None:
        self.backbone.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs=gradient_checkpointing_kwargs, **kwargs
        )

    def activation_checkpointing_enable(self, *args, **kwargs) -> None:
        self.backbone.activation_checkpointing_enable(*args, **kwargs)

    def gradient_checkpointing_disable(self) -> None:
        self.backbone.gradient_checkpointing_disable()

    def enable_input_require_grads(self) -> None:
        self.backbone.enable_input_require_grads()

    def get_input_embeddings(self) -> nn.Module:
        return self.backbone.get_input_embeddings()

    def add_model_tags(self, tags: list[str] | str) -> None:
        self.backbone.add_model_tags(tags)

"""What the reward server reads from its reward model, in one picklable snapshot: `ServedModelFacts`, built by
`served_model_facts` from a loaded model. `RewardService` validates, estimates tokens, batches and answers
``/health`` from these facts alone, so the server process of a model process (``emoreward serve``'s default) loads
no weights. Nothing here imports torch. See docs/serving.md#reward-server-emoreward-serve.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from emoreward.export.serve.protocol import max_chars_for
from emoreward.models.loading import model_identity
from emoreward.models.precision import precision_record


@dataclass(frozen=True)
class ServedModelFacts:
    """The facts of a loaded reward model that serving reads (every field is a plain, picklable value).

    Attributes:
        kind (`str`): ``"text"`` or ``"media"`` (`RewardModel.kind`).
        max_length (`int`): the model's ``settings.max_length`` tokens (0: no limit known).
        max_chars (`int`): the longest text that can fit in ``max_length`` tokens (`protocol.max_chars_for`: the
            tokenizer's longest vocabulary entry), the default of ``--max-chars``.
        eos_token, pad_token, sep_token (`str` or `None`): the tokenizer's special-token strings, stripped from
            OpenRLHF queries (`openrlhf.query_markers`).
        modalities (`frozenset[str]`): the media the model reads (empty for a text model).
        sees_video, hears_audio (`bool`): multimodal models: which media the backbone takes (`BackboneSpec`).
        use_audio_in_video (`bool`): multimodal models: the audio comes from the video's own track.
        device (`str`): the device type the model scores on (``"cpu"``, ``"cuda"``): the ``forward_tokens`` default.
        precision (`dict`): `precision_record` of the model (the dtype every reward is computed in), for /health.
        identity (`str`): the model's content identity (`emoreward.models.loading.model_identity`: the one the
            score cache and the vLLM served name use), for /health: a client checks it is the model it names.
    """

    kind: str
    max_length: int
    max_chars: int
    eos_token: str | None = None
    pad_token: str | None = None
    sep_token: str | None = None
    modalities: frozenset[str] = frozenset()
    sees_video: bool = False
    hears_audio: bool = False
    use_audio_in_video: bool = False
    device: str = "cpu"
    precision: dict | None = None
    identity: str | None = None


def _token(tokenizer: Any, name: str) -> str | None:
    value = getattr(tokenizer, name, None) if tokenizer is not None else None
    return value if isinstance(value, str) and value else None


def served_model_facts(model: Any) -> ServedModelFacts:
    """The `ServedModelFacts` of a loaded reward model (`load_reward_model`, `TextRewardModel`, `MediaRewardModel`,
    or any object with ``kind``, ``settings`` and optionally ``tokenizer``, ``spec``, ``options``, ``device``).

    The one place serving reads a model: the in-process `RewardService` and the model process both call it.
    """
    settings = getattr(model, "settings", None)
    tokenizer = getattr(model, "tokenizer", None)
    kind = str(model.kind)
    modalities = frozenset(getattr(model, "modalities", frozenset()) or ())
    sees_video = hears_audio = use_audio_in_video = False
    if kind != "text":
        spec, options = model.spec, model.options
        sees_video, hears_audio = bool(spec.sees_video), bool(spec.hears_audio)
        use_audio_in_video = bool(options.use_audio_in_video)
    device = getattr(model, "device", None)
    return ServedModelFacts(
        kind=kind,
        max_length=int(getattr(settings, "max_length", 0) or 0),
        max_chars=max_chars_for(model),
        eos_token=_token(tokenizer, "eos_token"),
        pad_token=_token(tokenizer, "pad_token"),
        sep_token=_token(tokenizer, "sep_token"),
        modalities=modalities,
        sees_video=sees_video,
        hears_audio=hears_audio,
        use_audio_in_video=use_audio_in_video,
        device=str(getattr(device, "type", None) or device or "cpu"),
        precision=precision_record(model),
        identity=model_identity(model),
    )


__all__ = ["ServedModelFacts", "served_model_facts"]

"""A reward function for TRL's GRPOTrainer backed by an emotion reward model.

    from trl import GRPOConfig, GRPOTrainer
    from emoreward.export import EmotionReward

    reward = EmotionReward("outputs/rm/model")          # a directory written by `emoreward train`
    trainer = GRPOTrainer(model=policy, reward_funcs=[reward], train_dataset=dataset, args=GRPOConfig(...))

`EmotionReward` reads each sample's context (subtitle, media, sample id) from the dataset columns or the prompt, by
the rule every route uses, and returns one float reward per completion. See docs/serving.md.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from emoreward.data.context import MediaRef, message_text, reward_context
from emoreward.data.media import unused_media
from emoreward.export.length_monitor import LengthMonitor, defined, logged_key
from emoreward.models.base import RewardModel


logger = logging.getLogger(__name__)


def completion_text(completion: Any) -> str:
    """The text of one completion: a string (standard format) or a list of messages (conversational format,
    the assistant turns joined; a turn's content a string or a list of parts, `emoreward.data.context.message_text`).

    Raises:
        ValueError: on any other shape.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and all(isinstance(m, dict) for m in completion):
        turns = [message_text(m.get("content") or "") for m in completion if m.get("role", "assistant") == "assistant"]
        if not all(isinstance(t, str) for t in turns):
            raise ValueError("a completion message's content must be a string or a list of content parts")
        return "\n".join(turns)
    raise ValueError(f"a completion must be a string or a list of messages, got {type(completion).__name__}")


class EmotionReward:
    """Reward function with GRPOTrainer's signature: ``(prompts, completions, **kwargs) -> list[float]``: each
    completion's reward r(description | context), unnormalised, as `emoreward evaluate`, `rank` and `serve` give it.

    Args:
        model (`RewardModel`, `str` or `Path`): a reward model (text or multimodal) or a saved model directory.
        vllm_url (`str`, *optional*): with a directory (an export): score through the vLLM server at this URL that
            serves it (`emoreward.models.loading.open_reward_model`, engine ``"vllm"``) instead of loading it here.
        media_root (`str`, *optional*): folder relative media paths resolve in (multimodal models).
        subtitle_column, video_column, audio_column, sample_column (`str`): dataset columns holding the sample's
            subtitle, video path, audio path and id (a missing column or ``None`` value: none). Without a path a
            multimodal model looks for ``<media_root>/video/<sample_id>.mp4`` (``audio/<sample_id>.wav``).
        on_unused_media (`"warn"`, `"error"` or `"ignore"`): a text-only model given video / audio paths warns once
            (default), raises ValueError, or says nothing.
        batch_size (`int`): sequences per forward pass, >= 1 (`models.base.check_batch_size`, checked first).
        scale (`float`): multiply rewards by this (e.g. to weigh this reward against others); finite (ValueError).
        name (`str`, *optional*): the name GRPOTrainer logs the reward under (``rewards/<name>/mean``); default
            ``emotion_reward_<8 hex>``, the model's content identity (`default_reward_name`): two functions of two
            models never share a key, one model twice shares its name.
        length_monitor (`LengthMonitor`, `bool` or `None`): the RL length-hacking monitor
            (`emoreward.export.length_monitor`); ``True`` (default) makes one with its defaults, ``False``/``None``
            turns it off. It keeps a window over the last 512 rewarded completions, so calls of any size measure
            (`LengthMonitor`). Its figures go to GRPOTrainer's logs through the ``log_metric`` callable TRL passes to
            reward functions, keyed by this reward's ``name`` (``length/<name>/mean``, ..., as TRL logs
            ``rewards/<name>/mean``: two reward functions never share a key); the latest are in
            ``last_length_figures`` (keys ``length/mean``, ...).
    """

    def __init__(
        self,
        model: RewardModel | str | Path,
        media_root: str | None = None,
        subtitle_column: str = "subtitle",
        video_column: str = "video",
        audio_column: str = "audio",
        sample_column: str = "sample_id",
        on_unused_media: str = "warn",
        batch_size: int = 16,
        scale: float = 1.0,
        name: str | None = None,
        length_monitor: LengthMonitor | bool | None = True,
        vllm_url: str | None = None,
    ):
        if not math.isfinite(float(scale)):  # before the model is loaded
            raise ValueError(
                f"scale must be a finite number, got {scale!r}: a non-finite weight makes every reward NaN"
            )
        if on_unused_media not in ("warn", "error", "ignore"):
            raise ValueError(f"on_unused_media must be 'warn', 'error' or 'ignore', got {on_unused_media!r}")
        from emoreward.models.base import check_batch_size

        batch_size = check_batch_size(batch_size)  # the scoring routes' one rule, before the model is loaded
        if isinstance(model, (str, Path)):
            from emoreward.models.loading import DEFAULT_ENGINE, open_reward_model

            engine = "vllm" if vllm_url else DEFAULT_ENGINE
            model = open_reward_model(model, engine, url=vllm_url, media_root=media_root)
        elif vllm_url is not None:
            raise ValueError("vllm_url needs the export folder as `model` (the folder the vLLM server serves)")
        elif media_root is not None and model.kind == "media":
            model.media_root = media_root
        self.model = model
        self.columns = {"subtitle": subtitle_column, "video": video_column, "audio": audio_column}
        self.sample_column = sample_column
        self.on_unused_media = on_unused_media
        self.batch_size = batch_size
        self.scale = float(scale)
        if name is None:
            from emoreward.models.loading import model_identity

            name = default_reward_name("emotion_reward", model_identity(model))
        self.__name__ = name
        self.n_calls = 0
        self.n_scored = 0
        self.n_truncated = 0  # completions cut at the model's max_length before scoring (warned once)
        self._warned = False
        self._warned_truncation = False
        self.length_monitor = LengthMonitor() if length_monitor is True else (length_monitor or None)
        self.last_length_figures: dict[str, float | None] | None = None

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        """Rewards, one per completion (``len(completions)`` floats).

        GRPOTrainer calls ``f(prompts=..., completions=..., completion_ids=..., **columns)`` (every dataset column
        but ``prompt``, plus ``trainer_state``, ``log_extra`` and ``log_metric``). The sample's context comes from
        the columns, else from what the prompt names (`emoreward.data.context.reward_context`).

        Raises:
            ValueError: if a column's length differs from ``len(completions)``, a completion has an unknown
                shape, or media paths are given to a text model with ``on_unused_media="error"``.
            DataError: a column and the prompt name different subtitles / media (names the column and the row,
                1-based within the call).
            MediaError: a multimodal model cannot read a sample's media (names the sample and the file).
            NonFiniteRewardError: the model's reward of a completion is NaN or infinite (names the model and the
                completion; `emoreward.models.base.check_finite_rewards`): never a NaN reward to the trainer.
        """
        n = len(completions)
        if prompts is not None and len(prompts) != n:
            raise ValueError(f"{len(prompts)} prompts but {n} completions")
        values = {key: dataset_column(kwargs, column, n) for key, column in self.columns.items()}
        samples = dataset_column(kwargs, self.sample_column, n)
        names = {**self.columns, "sample_id": self.sample_column, "prompt": "prompts"}
        contexts = [
            reward_context(
                prompt=None if prompts is None else prompts[k],
                subtitle=values["subtitle"][k],
                video=values["video"][k],
                audio=values["audio"][k],
                sample_id=samples[k],
                source="EmotionReward",
                row=k + 1,
                names=names,
            )
            for k in range(n)
        ]
        if self.model.kind == "text":
            self._check_unused_media(contexts)
        texts = [completion_text(c) for c in completions]
        info = self.model.score_info(texts, contexts, batch_size=self.batch_size)
        scores = info.rewards
        self.n_calls += 1
        self.n_scored += n
        cut = int(np.count_nonzero(info.truncated))
        if cut:
            self.n_truncated += cut
            if not self._warned_truncation:
                logger.warning(
                    "%d of %d completions are longer than the reward model's max_length (%s tokens) and were cut "
                    "before scoring: what they say after the cut earns no reward (EmotionReward.n_truncated counts "
                    "them; warned once)",
                    cut,
                    n,
                    getattr(self.model.settings, "max_length", "?"),
                )
                self._warned_truncation = True
        rewards = (self.scale * np.asarray(scores, dtype=np.float64)).tolist()
        if self.length_monitor is not None:
            self.last_length_figures = self.length_monitor.update(rewards, texts)
            log_metric = kwargs.get("log_metric")
            if callable(log_metric):  # TRL >= 1.0 GRPOTrainer: averaged per logging step, beside kl and entropy
                for key, value in defined(self.last_length_figures).items():
                    log_metric(logged_key(key, self.__name__), value)
        return rewards

    def _check_unused_media(self, contexts) -> None:
        if self.on_unused_media == "ignore":
            return
        for context in contexts:
            for key, why in unused_media(MediaRef(context.video, context.audio), need_video=False, need_audio=False):
                message = (
                    f"column {self.columns[key]!r} holds media paths, but {why}: "
                    f"it conditions on the subtitle ({self.columns['subtitle']!r}) only"
                )
                if self.on_unused_media == "error":
                    raise ValueError(message)
                if not self._warned:
                    warnings.warn(message, UserWarning, stacklevel=3)
                    self._warned = True
                return


def default_reward_name(base: str, identity: str) -> str:
    """The name a reward function of this project logs under when none is given: ``<base>_<the first 8 hex
    characters of its model's or judge's content identity>``. TRL keys a reward function's figures by its
    ``__name__`` (``rewards/<name>/mean``) and the length monitor keys its own by it (``length/<name>/...``), so two
    functions of two different models must not share one; the same model twice may. An identity that is not a hex
    digest (a closed-form reward's class name) is hashed first."""
    if not re.fullmatch(r"[0-9a-f]{8,}", identity):
        identity = hashlib.sha256(identity.encode()).hexdigest()
    return f"{base}_{identity[:8]}"


def dataset_column(kwargs: dict[str, Any], column: str, n: int) -> list[Any]:
    """The values GRPOTrainer passes for dataset column ``column``, one per completion (``[None] * n`` when absent).

    Raises:
        ValueError: a column of another length than ``n``."""
    values = kwargs.get(column)
    if values is None:
        return [None] * n
    values = list(values)
    if len(values) != n:
        raise ValueError(f"column {column!r} has {len(values)} values for {n} completions")
    return values


__all__ = ["EmotionReward", "completion_text", "dataset_column", "default_reward_name"]

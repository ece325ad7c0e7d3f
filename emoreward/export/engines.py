"""The served engines of `emoreward.models.loading.open_reward_model`: ``"vllm"`` (an export behind vLLM's
``/classify``, `emoreward.export.vllm.VllmRewardModel`) and ``"server"`` (a model behind ``emoreward serve``'s
``/v1/rewards``, `ServerRewardModel`), registered in `emoreward.models.loading.ENGINES` when this module loads (found
by name through the ``emoreward.engines`` entry points of pyproject.toml).
See docs/serving.md.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from emoreward.data.context import RewardContext, subtitle_key
from emoreward.models.base import RewardModelBase, ScoreInfo, load_settings
from emoreward.models.loading import ENGINES, Engine, model_identity, register_engine


class ServerRewardModel(RewardModelBase):
    """A reward model served by ``emoreward serve`` at ``url``: the `RewardModel` interface over ``POST
    /v1/rewards``; the folder ``source`` is what the server serves (its settings, kind and identity are read here),
    its precision the one the server's ``/health`` reports.

    Args:
        source: the model folder the server was started with.
        url: the server's base URL (``http://127.0.0.1:8000``).
        media_root (`str`, *optional*): client-side media root: media paths inside it are sent relative to it (the
            server resolves them in its own ``--media-root``).
        token (`str`, *optional*): bearer token (``emoreward serve --token``); timeout (s, every attempt included),
            retries: per request (`RetryPolicy.resolve`).

    Raises:
        FileNotFoundError / ValueError: ``source`` is not an emoreward model folder, ``url`` is not http(s), or the
            server serves another model (its ``/health`` ``identity`` is not ``source``'s `model_identity`); RuntimeError: the server does not answer.
    """

    device = "cpu"  # scoring happens in another process

    def __init__(
        self,
        source: str | Path,
        url: str,
        *,
        media_root: str | Path | None = None,
        token: str | None = None,
        timeout: float | None = None,
        retries: int | None = None,
    ):
        from emoreward.export.reward_client import RetryPolicy, RewardClient

        self.source_dir = Path(source)
        self.settings = load_settings(self.source_dir)
        self.kind = self.settings.kind
        self.media_root = None if media_root is None else Path(media_root)
        self.url = url.rstrip("/")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"server URL {url!r} is not an http:// or https:// URL")
        self.client = RewardClient((self.url,), token, RetryPolicy.resolve(timeout, retries))
        health = self.client.request("GET", "/health")
        if health.get("kind") != self.kind:
            raise ValueError(f"the server at {self.url} serves a {health.get('kind')} model; {source} is {self.kind}")
        identity = model_identity(self)  # what `source` holds: the identity its score-cache keys carry
        if health.get("identity") != identity:
            raise ValueError(
                f"the server at {self.url} serves the model of content identity {health.get('identity')}, not "
                f"{source} (content identity {identity}): start it with emoreward serve --model {source}"
            )
        self.precision_name = (health.get("precision") or {}).get("dtype")
        self.dtype_pin = (health.get("precision") or {}).get("pinned_by")  # the server's: its process resolved it
        # the server's kernels compute its rewards: its score-cache keys name them (`model_precision_identity`)
        self.served_machine = (health.get("precision") or {}).get("kernels") or f"server:{self.url}"
        self.max_items = int((health.get("limits") or {}).get("max_items") or 256)
        self._modalities = frozenset()
        if self.kind != "text":
            from emoreward.models.backbones import get_backbone

            self._modalities = get_backbone(self.settings.backbone).modalities

    @property
    def modalities(self) -> frozenset[str]:
        return self._modalities

    def context_key(self, context: RewardContext):
        """As the served model: the subtitle (text), the subtitle and the media's identity (multimodal)."""
        if self.kind == "text":
            return subtitle_key(context)
        return (*subtitle_key(context), context.video, context.audio, context.sample_id)

    def _media(self, context: RewardContext) -> dict[str, str]:
        ref = {"subtitle": context.subtitle} if context.subtitle else {}
        if self.kind != "text":
            for key in ("video", "audio"):
                path = getattr(context, key)
                if path and self.media_root is not None and Path(path).is_relative_to(self.media_root):
                    path = Path(path).relative_to(self.media_root).as_posix()
                if path:
                    ref[key] = str(path)
        return ref

    def score_contexts(
        self, descriptions: list[str], contexts: list[RewardContext], *, batch_size: int | None = None
    ) -> ScoreInfo:
        """Rewards from the server (`RewardModelBase.score_info` calls this), in requests of at most the server's
        ``max_items`` descriptions; ``batch_size`` is unused (the server batches itself).

        Returns:
            `ScoreInfo` with rewards of shape `(N,)`, float64, as the server computed them (its score transform
            applied), truncation flags and token counts.

        Raises:
            RuntimeError: the server refused a request (its message) or did not answer."""
        n = len(descriptions)
        rewards, truncated, tokens = np.empty(n), np.zeros(n, dtype=bool), np.zeros(n, dtype=np.int64)
        for start in range(0, n, self.max_items):
            stop = min(n, start + self.max_items)
            body = {
                "descriptions": descriptions[start:stop],
                "media": [self._media(c) for c in contexts[start:stop]],
            }
            reply = self.client.post("/v1/rewards", body)
            if len(reply.get("rewards", [])) != stop - start:
                raise RuntimeError(f"{self.url}/v1/rewards returned {len(reply.get('rewards', []))} rewards for "
                                   f"{stop - start} descriptions")  # fmt: skip
            rewards[start:stop] = np.asarray(reply["rewards"], dtype=np.float64)
            truncated[start:stop] = np.asarray(reply["truncated"], dtype=bool)
            tokens[start:stop] = np.asarray(reply["n_tokens"], dtype=np.int64)
        return ScoreInfo(rewards, truncated, tokens)


def _open_vllm(source, *, url=None, token=None, media_root=None, dtype=None, timeout=None):
    """`VllmRewardModel` of the export ``source`` at ``url``; a ``dtype`` other than ``"auto"`` must be the served
    one (ValueError)."""
    from emoreward.export.vllm import VllmRewardModel

    root = None if media_root is None else str(media_root)
    model = VllmRewardModel(source, url, media_root=root, token=token, timeout=timeout)
    wanted = None if dtype is None else str(dtype).removeprefix("torch.")
    if wanted not in (None, "auto") and wanted != model.precision_name:
        raise ValueError(f"the vLLM server serves {source} in {model.precision_name}, not {wanted}")
    return model


def _open_server(source, *, url=None, token=None, media_root=None, dtype=None, timeout=None):
    """`ServerRewardModel` of ``source`` at ``url``; a ``dtype`` other than ``"auto"`` must be the served one."""
    model = ServerRewardModel(source, url, media_root=media_root, token=token, timeout=timeout)
    wanted = None if dtype is None else str(dtype).removeprefix("torch.")
    if wanted not in (None, "auto") and wanted != model.precision_name:
        raise ValueError(f"the server at {url} scores {source} in {model.precision_name}, not {wanted}")
    return model


for _engine in (
    Engine("vllm", _open_vllm, needs_url=True, help="score an export through the vLLM server at url (/classify)"),
    Engine("server", _open_server, needs_url=True, help="score through the emoreward serve server at url"),
):
    if _engine.name not in ENGINES:
        register_engine(_engine)


__all__ = ["ServerRewardModel"]

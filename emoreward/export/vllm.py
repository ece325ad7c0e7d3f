"""Rewards from a running vLLM pooling server that serves an emoreward export: the one request builder
(`VllmRequestBuilder`: a description and its context -> a ``/classify`` body, by the export's own layout) and the
one client (`VllmRewardModel`, a `RewardModel` over `emoreward.export.reward_client`), which every route that scores
through vLLM gets from `emoreward.models.loading.open_reward_model` (engine ``"vllm"``). Identity is content: the
server serves the export as `served_name` (its content identity and dtype), checked before scoring. `VllmServer`
starts and stops the server (``python -m vllm.entrypoints.openai.api_server``: the CPU build's ``vllm serve`` entry
point fails).
See docs/serving.md#vllm.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from emoreward.data.context import RewardContext, subtitle_key
from emoreward.export.reward_client import RetryPolicy, RewardClient
from emoreward.models.base import RewardModelBase, ScoreInfo, apply_score_transform, load_settings
from emoreward.models.loading import content_identity


NAME_PREFIX = "emoreward-"
DTYPES = ("float32", "bfloat16", "float16")
# the ``/classify`` body options every request carries: the raw value-head output (vLLM applies a sigmoid / softmax
# to a classifier's logits unless told not to)
CLASSIFY_OPTIONS = {"use_activation": False}
# most descriptions per ``/classify`` request of token ids, and chat requests in flight per client
IDS_PER_REQUEST = 256
CHAT_IN_FLIGHT = 8


# ---------------------------------------------------------------------------------------------- identity
def served_name(export_dir: str | Path, dtype: str = "float32") -> str:
    """The ``--served-model-name`` of an export served in ``dtype``: ``emoreward-<fingerprint>-<dtype>``
    (`emoreward.models.loading.content_identity` of the folder: a re-export gets a new name).

    Raises:
        ValueError: a dtype other than float32 / bfloat16 / float16.
    """
    if dtype not in DTYPES:
        raise ValueError(f"vLLM dtype must be one of {list(DTYPES)}, got {dtype!r}")
    return f"{NAME_PREFIX}{content_identity(export_dir)}-{dtype}"


def _check_export(export_dir: Path):
    settings = load_settings(export_dir)
    if not settings.merged:
        raise ValueError(
            f"{export_dir} is a training folder, not an export: vLLM serves a merged checkpoint (emoreward export "
            f"--model {export_dir} --output DIR)"
        )
    if settings.kind != "text":
        from emoreward.models.backbones import get_backbone
        from emoreward.models.media.export_layout import REQUEST_FILE

        spec = get_backbone(settings.backbone)
        if spec.native_classifier:
            raise ValueError(
                f"{export_dir} is a {spec.name} export ({spec.native_classifier}): the vLLM route is not built for "
                "it (no request data: its per-frame timestamps and linear-attention pooling in vLLM are not checked "
                "against emoreward's rewards); serve it with emoreward serve, or read it with transformers"
            )
        if not (export_dir / REQUEST_FILE).is_file():
            raise ValueError(
                f"{export_dir} is a multimodal export without {REQUEST_FILE} (an earlier layout vLLM does not load): "
                "export it again with this emoreward"
            )
    return settings


def _media_options(settings, media_root: str | None):
    """The `MediaOptions` a multimodal export's settings read its media with."""
    from emoreward.data.media import MediaOptions

    s = settings
    return MediaOptions(media_root, fps=s.fps, max_frames=s.max_frames, use_audio_in_video=s.use_audio_in_video,
                        sampling_rate=s.sampling_rate)  # fmt: skip


def request_data(export_dir: str | Path) -> dict:
    """A multimodal export's request as data (`emoreward.models.media.export_layout.request_spec`)."""
    from emoreward.models.media.export_layout import REQUEST_FILE

    return json.loads((Path(export_dir) / REQUEST_FILE).read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------------------------- chat template
def vllm_chat_template(tokenizer: Any) -> str:
    """The export's chat template for vLLM's ``--chat-template``: the tokenizer's own, with the whitespace it writes
    after the last end-of-turn token removed (`emoreward.models.layout`: the value head reads the end-of-turn token;
    ChatML's trailing newline would move it by one token: 0.85 reward units on a SmolLM2 reward model).

    Raises:
        ValueError: the tokenizer has no chat template.
    """
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or not template:
        raise ValueError("the export's tokenizer has no chat template (a chat-layout model needs one)")
    return "{% set emoreward_rendered %}" + template + "{% endset %}{{ emoreward_rendered.rstrip() }}"


def write_chat_template(export_dir: Path, path: Path) -> Path | None:
    """Write a chat-layout export's `vllm_chat_template` to ``path`` and return it; None for another layout."""
    if getattr(_check_export(export_dir), "input_format", None) != "chat":
        return None
    from transformers import AutoTokenizer

    path.write_text(vllm_chat_template(AutoTokenizer.from_pretrained(export_dir)))
    return path


# ---------------------------------------------------------------------------------------------- requests
class VllmRequestBuilder:
    """The ``/classify`` bodies of (description, context) items for one export, by its own layout
    (`emoreward.models.layout.text_input_ids_batch`, the rule of every route): ``"pair"`` (encoders): token ids,
    many items per request; ``"chat"`` (decoders): ``messages`` ``[user: CONTEXT, assistant: DESCRIPTION]``
    rendered by the server's chat template (`vllm_chat_template`), one item per request, a description cut to
    ``max_length`` as its cut token ids; a multimodal export: its request data's messages with the media.

    Args:
        export_dir: an export folder (`emoreward export`); model: the served model name (`served_name`).
    """

    def __init__(self, export_dir: str | Path, model: str, media_root: str | None = None):
        from transformers import AutoTokenizer

        self.export_dir = Path(export_dir)
        self.settings = _check_export(self.export_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.export_dir)
        self.model = model
        self.media_root = media_root
        self.request = request_data(self.export_dir) if self.settings.kind != "text" else None

    def encode(self, descriptions: Sequence[str], contexts: Sequence[RewardContext]):
        """`emoreward.models.layout.Encoded` of each item (ids, truncation), the one layout rule."""
        from emoreward.models.layout import text_input_ids_batch

        subtitles = [c.subtitle for c in contexts]
        return text_input_ids_batch(self.tokenizer, self.settings, list(descriptions), subtitles)

    def messages(self, description: str, context: RewardContext) -> list[dict[str, str]]:
        """The chat messages of one item (the layout's conversation, `emoreward.models.layout`)."""
        from emoreward.models.layout import context_text

        text = context_text(self.settings.instruction, context.subtitle)
        out = [{"role": "assistant", "content": description}]
        return ([{"role": "user", "content": text}] if text else []) + out

    # ------------------------------------------------------------------ multimodal exports
    def media_parts(self, context: RewardContext) -> tuple[dict[str, str], float | None]:
        """``({"{video}": data URL, "{audio}": data URL}, effective fps)`` of one sample, by the export's request
        data: the frames sampled by emoreward's rule (`emoreward.data.media.load_frames`: the model's fps and frame
        cap), each resized with PIL bicubic to Qwen's ``smart_resize`` size and sent as PNG frames; the audio as
        a float32 WAV at the model's sampling rate (`load_audio`).

        Raises:
            MediaError: a needed file is missing or cannot be decoded (names the sample and the file).
        """
        from emoreward.data.media import load_sample_media

        request, options = self.request, _media_options(self.settings, self.media_root)
        need_video, need_audio = "video" in request, "audio" in request
        sample = load_sample_media(
            context.sample_id or "", context.media_ref(), options, need_video=need_video, need_audio=need_audio
        )
        parts: dict[str, str] = {}
        if need_video and sample.frames is not None:
            parts["{video}"] = _video_url(sample.frames, request["video"])
        if need_audio and sample.audio is not None:
            parts["{audio}"] = _wav_url(sample.audio, int(request["audio"]["sampling_rate"]))
        return parts, sample.fps

    def media_body(self, description: str, context: RewardContext, parts: dict[str, str], fps: float | None) -> dict:
        """The ``/classify`` body of one item of a multimodal export: its request data's messages with the media
        parts, the context text and the description filled in, and its per-request options (the frames' rate)."""
        from emoreward.models.layout import context_text

        text = context_text(self.settings.instruction, context.subtitle)
        values = {**parts, "{context}": text, "{description}": description, "{fps}": fps}

        def fill(node):
            if isinstance(node, dict):
                return {k: fill(v) for k, v in node.items()}
            if isinstance(node, list):
                return [fill(v) for v in node]
            if isinstance(node, str) and node in values:
                return values[node]
            return node

        vllm = self.request["vllm"]
        body = {"model": self.model, "messages": fill(self.request["messages"]), **CLASSIFY_OPTIONS}
        body.update(fill(vllm.get("per_request") or {}))
        return body

    def bodies(self, descriptions: Sequence[str], contexts: Sequence[RewardContext]) -> list[tuple[list[int], dict]]:
        """``[(item positions, /classify body), ...]`` covering every item once, and the items' `Encoded`.

        Returns:
            `(list[(list[int], dict)], list[Encoded])`.
        """
        if self.request is not None:
            media = {}
            out = []
            for i, (description, context) in enumerate(zip(descriptions, contexts)):
                key = (context.subtitle, context.video, context.audio, context.sample_id)
                if key not in media:  # one decoding per sample
                    media[key] = self.media_parts(context)
                out.append(([i], self.media_body(description, context, *media[key])))
            return out, None
        encoded = self.encode(descriptions, contexts)
        out: list[tuple[list[int], dict]] = []
        if self.settings.input_format == "chat":
            for i, (description, context, enc) in enumerate(zip(descriptions, contexts, encoded)):
                if enc.truncated:
                    body = {"model": self.model, "input": [enc.input_ids], **CLASSIFY_OPTIONS}
                else:
                    body = {"model": self.model, "messages": self.messages(description, context), **CLASSIFY_OPTIONS}
                out.append(([i], body))
        else:
            for start in range(0, len(encoded), IDS_PER_REQUEST):
                part = list(range(start, min(start + IDS_PER_REQUEST, len(encoded))))
                ids = [encoded[i].input_ids for i in part]
                out.append((part, {"model": self.model, "input": ids, **CLASSIFY_OPTIONS}))
        return out, encoded


def _video_url(frames: np.ndarray, video: dict) -> str:
    """``data:video/jpeg;base64,<PNG>,<PNG>,...`` of sampled frames, each resized as the request data says."""
    import base64
    import io

    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    height, width = frames.shape[1:3]
    size = smart_resize(
        height,
        width,
        factor=int(video["resize_factor"]),
        min_pixels=video["min_pixels"],
        max_pixels=video["max_pixels"],
    )
    out = []
    for frame in frames:
        image = Image.fromarray(frame).resize((size[1], size[0]), Image.BICUBIC)
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        out.append(base64.b64encode(buffer.getvalue()).decode("ascii"))
    return "data:video/jpeg;base64," + ",".join(out)


def _wav_url(audio: np.ndarray, rate: int) -> str:
    """``data:audio/wav;base64,...`` of a mono float32 waveform (IEEE-float WAV: no rounding to 16 bits)."""
    import base64
    import struct

    data = np.asarray(audio, dtype="<f4").tobytes()
    header = b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVE"
    header += (
        b"fmt " + struct.pack("<IHHIIHH", 16, 3, 1, rate, rate * 4, 4, 32) + b"data" + struct.pack("<I", len(data))
    )
    return "data:audio/wav;base64," + base64.b64encode(header + data).decode("ascii")


# ---------------------------------------------------------------------------------------------- the client


def classify_rewards(reply: dict, n: int, url: str) -> np.ndarray:
    """The rewards of one vLLM ``/classify`` reply for ``n`` inputs, in input order: each result's ``probs[0]``
    placed by its ``index``.

    Returns:
        float64 array of shape `(n,)`.

    Raises:
        RuntimeError: the reply does not answer each input exactly once (indices other than 0..n-1, repeated or
            missing), or a result's ``probs`` is not one number."""
    data = reply.get("data") if isinstance(reply, dict) else None
    data = data if isinstance(data, list) else []
    got = [d.get("index") if isinstance(d, dict) else None for d in data]
    if not all(type(i) is int for i in got) or sorted(got) != list(range(n)):
        raise RuntimeError(
            f"{url}/classify returned results with indices {got} for {n} inputs (expected 0..{n - 1}, each once)"
        )
    out = np.empty(n, dtype=np.float64)
    for d in data:
        probs = d.get("probs")
        if not isinstance(probs, list) or len(probs) != 1 or isinstance(probs[0], bool):
            raise RuntimeError(
                f"{url}/classify returned {probs!r} as the scores of input {d['index']}: expected one number (the "
                "export's one-label value head; is the server serving another model?)"
            )
        try:
            out[d["index"]] = float(probs[0])
        except (TypeError, ValueError):
            raise RuntimeError(f"{url}/classify returned {probs[0]!r} as the reward of input {d['index']}") from None
    return out


class VllmRewardModel(RewardModelBase):
    """A reward model served by vLLM (a text export, or a multimodal one with its request data): the `RewardModel`
    interface over ``/classify`` requests to ``url``; media paths resolve in ``media_root`` (decoded here). Its
    content is the export's (``source_dir``, for score-cache keys) and its precision the served dtype.

    Args:
        export_dir: the export folder the server serves (read here: tokenizer, layout, identity).
        url: the server's base URL (``http://127.0.0.1:8000``).
        token (`str`, *optional*): bearer token (vLLM's ``--api-key``); timeout (s, every attempt included), retries:
            per request (`RetryPolicy.resolve`: default ``$EMOREWARD_ENGINE_TIMEOUT`` or 180 s, 5 attempts).

    Raises:
        ValueError: the folder is not a text export, or the server does not serve it (the message names what it
            serves and the ``--served-model-name`` to start it with).
        RuntimeError: the server does not answer.
    """

    device = "cpu"  # scoring happens in another process: nothing here runs on an accelerator

    def __init__(
        self,
        export_dir: str | Path,
        url: str,
        *,
        media_root: str | None = None,
        token: str | None = None,
        timeout: float | None = None,
        retries: int | None = None,
    ):
        self.source_dir = Path(export_dir)
        self.settings = _check_export(self.source_dir)
        self.kind = self.settings.kind
        self.media_root = media_root
        if self.kind != "text":  # what serving and the media checks read of a multimodal model
            from emoreward.models.backbones import get_backbone

            self.spec = get_backbone(self.settings.backbone)
            self.options = _media_options(self.settings, media_root)
        self.url = url.rstrip("/")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"vLLM URL {url!r} is not an http:// or https:// URL")
        self.client = RewardClient((self.url,), token, RetryPolicy.resolve(timeout, retries))
        self.served, self.precision_name = self._served_model()
        self.builder = VllmRequestBuilder(self.source_dir, self.served, media_root)
        self.tokenizer = self.builder.tokenizer

    def _served_model(self) -> tuple[str, str]:
        names = [str(m.get("id")) for m in self.client.request("GET", "/v1/models").get("data", [])]
        fingerprint = content_identity(self.source_dir)
        for name in names:
            head, _, dtype = name.rpartition("-")
            if head == f"{NAME_PREFIX}{fingerprint}" and dtype in DTYPES:
                return name, dtype
        raise ValueError(
            f"the vLLM server at {self.url} serves {names}, not the export {self.source_dir} (its content "
            f"fingerprint is {fingerprint}): start it with --served-model-name {served_name(self.source_dir)} "
            "(emoreward.export.vllm.serve_command gives the whole line)"
        )

    @property
    def modalities(self) -> frozenset[str]:
        """The media the model reads (empty for a text export)."""
        return frozenset() if self.kind == "text" else self.spec.modalities

    def context_key(self, context: RewardContext):
        """A text model reads the subtitle only (`emoreward.data.context.subtitle_key`); a multimodal one the
        subtitle and the media's identity (as `MediaRewardModel.context_key`)."""
        if self.kind == "text":
            return subtitle_key(context)
        return (*subtitle_key(context), context.video, context.audio, context.sample_id)

    def score_contexts(
        self, descriptions: list[str], contexts: list[RewardContext], *, batch_size: int | None = None
    ) -> ScoreInfo:
        """Rewards r(description | context) from the server (`RewardModelBase.score_info` calls this), with
        truncation flags and token counts; ``batch_size`` is unused (the server batches its requests itself).

        Returns:
            `ScoreInfo` with rewards of shape `(N,)`, float64; the settings' ``score_transform`` is applied.

        Raises:
            RuntimeError: the server refused a request or answered a different token count than the export's layout
                (its chat template is not the export's: `vllm_chat_template`).
        """
        n = len(descriptions)
        rewards = np.empty(n, dtype=np.float64)
        if not n:
            return ScoreInfo(rewards, np.zeros(0, dtype=bool), np.zeros(0, dtype=np.int64))
        bodies, encoded = self.builder.bodies(descriptions, contexts)
        tokens = np.zeros(n, dtype=np.int64)

        def post(item: tuple[list[int], dict]) -> None:
            part, body = item
            reply = self.client.post("/classify", body)
            probs = classify_rewards(reply, len(part), self.url)
            if encoded is None:  # a multimodal request: vLLM refuses one over --max-model-len, never cuts it
                tokens[part[0]] = int(reply["usage"]["prompt_tokens"])
            elif "messages" in body:
                got, want = int(reply["usage"]["prompt_tokens"]), len(encoded[part[0]].input_ids)
                if got != want:
                    raise RuntimeError(
                        f"{self.url} read {got} tokens for item {part[0] + 1}, the export's layout {want}: the "
                        "server's chat template is not the export's (start it with serve_command's --chat-template)"
                    )
            rewards[part] = probs

        with ThreadPoolExecutor(min(CHAT_IN_FLIGHT, len(bodies)), thread_name_prefix="emoreward-vllm") as pool:
            list(pool.map(post, bodies))
        rewards = apply_score_transform(rewards, [len(d) for d in descriptions], self.settings.score_transform)
        if encoded is None:
            return ScoreInfo(rewards, np.zeros(n, dtype=bool), tokens)
        return ScoreInfo(
            rewards,
            np.array([e.truncated for e in encoded], dtype=bool),
            np.array([len(e.input_ids) for e in encoded], dtype=np.int64),
        )

    def save_pretrained(self, directory, *, model_card=None):
        raise NotImplementedError("a model served by vLLM is saved where it was exported from")

    export_merged = save_pretrained


# ---------------------------------------------------------------------------------------------- the server
def serve_command(
    export_dir: str | Path,
    *,
    port: int,
    host: str = "127.0.0.1",
    dtype: str = "float32",
    python: str = sys.executable,
    chat_template: str | Path | None = None,
) -> list[str]:
    """The vLLM server command line for an export (``python -m vllm.entrypoints.openai.api_server``, as
    ``vllm serve``): the pooling runner, ``dtype``, eager mode, the served name `served_name`, and for a chat-layout
    export the chat template file ``chat_template`` (`vllm_chat_template`; required then); a multimodal export's
    own arguments from its request data (``vllm.serve``: media limits, frame handling, its chat template).

    Raises:
        ValueError: a chat-layout export without ``chat_template``; see `served_name`.
    """
    export_dir = Path(export_dir)
    settings = _check_export(export_dir)
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(export_dir)]
    if settings.kind != "text":  # the export's own `vllm serve` arguments (request data), in `dtype`
        args = list(request_data(export_dir)["vllm"]["serve"][3:])
        if "--dtype" in args:
            args[args.index("--dtype") + 1] = dtype
        cmd += args
    else:
        cmd += ["--runner", "pooling", "--dtype", dtype]
    cmd += [
        "--enforce-eager",
        "--host",
        host,
        "--port",
        str(port),
        "--served-model-name",
        served_name(export_dir, dtype),
    ]
    if getattr(settings, "input_format", None) == "chat":
        if chat_template is None:
            raise ValueError(f"{export_dir} is a chat-layout export: pass its vLLM chat template (vllm_chat_template)")
        cmd += ["--chat-template", str(chat_template), "--chat-template-content-format", "string"]
    return cmd


def chat_model_command(
    model_dir: str | Path,
    *,
    port: int,
    served_model_name: str,
    host: str = "127.0.0.1",
    dtype: str = "float32",
    python: str = sys.executable,
) -> list[str]:
    """The vLLM server command line for a causal chat LM folder (a trained judge, `emoreward.training.judge`: merged
    weights, tokenizer and chat template): the generate runner (``/v1/chat/completions``, ``/v1/completions``),
    ``dtype``, eager mode, served as ``served_model_name``; a judge YAML with the OpenAI-compatible backend points at
    it (docs/judges.md#trained-judges)."""
    return [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--runner", "generate",
        "--dtype", dtype, "--enforce-eager", "--host", host, "--port", str(port),
        "--served-model-name", served_model_name,
    ]  # fmt: skip


SERVER_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache on the CPU build (its default, 4, is more than tests need)
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
}


class VllmServer:
    """A vLLM server for an export, started in a process group of its own and stopped (SIGTERM, then SIGKILL after
    ``stop_timeout`` s) on exit, and ended (SIGTERM) when the process that started it ends, even killed
    (`emoreward.utils.processes.popen_with_parent`); its output goes to ``log`` (a file path).

    Args:
        export_dir: the export; python: the interpreter of vLLM's environment; port, dtype: as `serve_command`;
        start_timeout: seconds to wait for ``GET /v1/models`` (the server's error and log tail are raised then);
        command: another command line to run instead of the export's (`chat_model_command`: a trained judge).

    Raises:
        RuntimeError: the server exited or did not answer within ``start_timeout`` (the message holds the last
            lines of its log: vLLM's own error).
    """

    def __init__(
        self,
        export_dir: str | Path,
        *,
        python: str,
        port: int,
        log: str | Path,
        dtype: str = "float32",
        start_timeout: float = 300.0,
        stop_timeout: float = 30.0,
        env: dict[str, str] | None = None,
        command: list[str] | None = None,
    ):
        self.export_dir, self.port, self.log = Path(export_dir), int(port), Path(log)
        self.url = f"http://127.0.0.1:{self.port}"
        self.start_timeout, self.stop_timeout = float(start_timeout), float(stop_timeout)
        self._tmp = tempfile.TemporaryDirectory(prefix="emoreward-vllm-")
        if command is None:
            template = write_chat_template(self.export_dir, Path(self._tmp.name) / "chat_template.jinja")
            command = serve_command(
                self.export_dir, port=self.port, dtype=dtype, python=python, chat_template=template
            )
        self.command = list(command)
        self.env = {**os.environ, **SERVER_ENV, **(env or {})}
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        from emoreward.utils.processes import popen_with_parent

        with self.log.open("ab") as out:  # SIGTERM when this process ends, even killed: vLLM then ends its engine
            self.process = subprocess.Popen(
                self.command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                **popen_with_parent(),
            )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM exited with status {self.process.returncode}:\n{self.log_tail()}")
            # a client per poll: one that found no answer fails at once for its timeout (`RetryPolicy`)
            client = RewardClient((self.url,), None, RetryPolicy(timeout=5.0, attempts=1))
            try:
                client.request("GET", "/v1/models")
                client.close()
                return
            except (RuntimeError, OSError):
                time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"vLLM did not answer within {self.start_timeout:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._tmp.cleanup()

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server's log (vLLM's error where it failed)."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def _main(argv: list[str] | None = None) -> int:
    """``python -m emoreward.export.vllm EXPORT_DIR [--port P] [--dtype D]``: print the served name and the server
    command line (the chat template, for a chat-layout export, is written beside the export as
    ``<export>.vllm_chat_template.jinja``)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m emoreward.export.vllm", description=_main.__doc__)
    p.add_argument("export_dir")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    args = p.parse_args(argv)
    export_dir = Path(args.export_dir)
    template = write_chat_template(export_dir, export_dir.with_name(export_dir.name + ".vllm_chat_template.jinja"))
    cmd = serve_command(export_dir, port=args.port, dtype=args.dtype, python="python", chat_template=template)
    sys.stdout.write(json.dumps({"served_model_name": served_name(export_dir, args.dtype), "command": cmd}) + "\n")
    return 0


if __name__ == "__main__":
    from emoreward.utils.guard import guarded

    sys.exit(guarded("python -m emoreward.export.vllm", _main))  # a bad folder: one line, exit 2


__all__ = [
    "CLASSIFY_OPTIONS",
    "VllmRequestBuilder",
    "VllmRewardModel",
    "VllmServer",
    "chat_model_command",
    "serve_command",
    "served_name",
    "vllm_chat_template",
]

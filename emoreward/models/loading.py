"""The one way to open a reward model and the one content identity of a reward model.

`open_reward_model(path_or_id, engine=...)` opens a model folder, an export or a Hub id in process, or through a
served engine (a registry, `ENGINES`: `"in-process"` here; `"vllm"` and `"server"` found by name through entry points);
`content_identity` / `model_identity` say what a model reads (its folder and a referenced backbone), for every cache,
the vLLM served name and run identity; `reward_model_identity`, which model a folder holds (an export is its source).
See docs/serving.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:
    from emoreward.models.base import RewardModel


# ---------------------------------------------------------------------------------------------- content identity
def referenced_backbone(directory: str | Path) -> str | None:
    """The base weights a saved reward model reads besides its own folder, as its loader finds them: a LoRA text
    model's backbone (`get_backbone(settings.backbone).resolve()`: a local folder, a package's folder or a Hub id), a
    LoRA multimodal model's `model_name_or_path`; None for a merged model or export (its folder holds every weight).

    Raises:
        FileNotFoundError / ValueError: `directory` is not an emoreward model directory (`load_settings`)."""
    from emoreward.models.backbones import get_backbone
    from emoreward.models.base import load_settings

    directory = Path(directory)
    settings = load_settings(directory)
    if settings.merged or not (directory / "adapter_config.json").exists():
        return None
    if settings.kind != "text":
        return settings.model_name_or_path or None
    spec = get_backbone(settings.backbone, gguf_file=getattr(settings, "gguf_file", None))
    if spec.package is not None:
        return f"package:{spec.package}"  # an installed weights package: its name and version are its content
    return spec.resolve()


def _backbone_content(reference: str) -> str:
    """The content of a referenced backbone: a local folder's or file's `current_fingerprint`, an installed weights
    package's name and version, a Hub id's name (its revision is what the Hub serves under it)."""
    from emoreward.utils.cache_key import current_fingerprint

    if reference.startswith("package:"):
        from importlib.metadata import PackageNotFoundError, version

        package = reference.removeprefix("package:")
        for name in (package, package.replace("_", "-")):
            try:
                return f"{reference}=={version(name)}"
            except PackageNotFoundError:
                continue
        return reference
    return current_fingerprint(reference) or f"hub:{reference}"


def content_identity(directory: str | Path) -> str:
    """The content identity of a saved reward model (a training folder or an export), 16 hex characters: the
    content of everything its loader reads, its own folder (adapter, head, tokenizer, settings: `content_fingerprint`)
    and a referenced backbone (`referenced_backbone`: a local backbone's weights and tokenizer), so a backbone
    retrained in place under the same path gives a new identity. A model that references no backbone (a merged
    export) has its folder's `content_fingerprint`. Hashed again only when a file's stamp changed
    (`current_fingerprint`). The precision is not part of it: every key adds the one a model scores in.

    Raises:
        FileNotFoundError: `directory` is not a directory; ValueError: its settings are invalid."""
    from emoreward.utils.cache_key import content_fingerprint, current_fingerprint

    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a directory")
    folder = current_fingerprint(directory) or content_fingerprint(directory)
    try:
        reference = referenced_backbone(directory)
    except FileNotFoundError:  # a folder that is no emoreward model (a plain checkpoint): its files are its content
        return folder
    if reference is None:
        return folder
    return hashlib.sha256(f"{folder}\0{_backbone_content(reference)}".encode()).hexdigest()[:16]


def source_identity(name_or_path: str | Path | None) -> str | None:
    """The content identity of a model named by a path or a Hub id before (or without) loading it: an emoreward
    model folder's `content_identity`; any other local folder or file (a backbone, a GGUF file, a judge YAML):
    `source_fingerprint` (through `current_fingerprint`); None for anything else (a Hub id: its name is its
    identity)."""
    from emoreward.models.base import SETTINGS_FILE
    from emoreward.utils.cache_key import current_fingerprint

    if name_or_path is None:
        return None
    path = Path(name_or_path).expanduser()
    if (path / SETTINGS_FILE).is_file():
        return content_identity(path)
    return current_fingerprint(path)


EXPORTED_FROM = "exported_from"
"""The key of an export's settings (`RewardSettings.extra`) under which `emoreward export` records the reward model
it holds: its source's `export_origin` (`record_export_origin`)."""


def reward_model_identity(name_or_path: str | Path | None) -> str | None:
    """Which reward model a path holds, for telling judges apart (a committee member votes once): the identity an
    export recorded of its source (`EXPORTED_FROM`), else `source_identity`; so a folder, its copy and its export
    are one model. Never a cache key: an export's rewards equal its source's within the export check's tolerance,
    not bit for bit, and every cache keys `content_identity`."""
    from emoreward.models.base import SETTINGS_FILE, load_settings

    if name_or_path is not None and (Path(name_or_path).expanduser() / SETTINGS_FILE).is_file():
        recorded = (load_settings(Path(name_or_path).expanduser()).extra or {}).get(EXPORTED_FROM)
        if recorded:
            return str(recorded)
    return source_identity(name_or_path)


def export_origin(model: Any) -> str:
    """The `reward_model_identity` of a model object: the origin its folder recorded (`EXPORTED_FROM`, an export of
    an export names the first source) while its weights are unchanged since it was loaded, else its
    `model_identity`."""
    identity = model_identity(model)
    recorded = (getattr(getattr(model, "settings", None), "extra", None) or {}).get(EXPORTED_FROM)
    source = getattr(model, "source_dir", None)
    if recorded and source is not None and Path(source).is_dir() and identity == content_identity(source):
        return str(recorded)
    return identity


def record_export_origin(directory: str | Path, model: Any) -> None:
    """Record in the export folder ``directory`` (its settings file, `EXPORTED_FROM`) the reward model it was
    exported from (`export_origin` of ``model``), for `reward_model_identity`."""
    from emoreward.models.base import load_settings

    settings = load_settings(directory)
    settings.extra = {**(settings.extra or {}), EXPORTED_FROM: export_origin(model)}
    settings.save(directory)


def weights_identity(name_or_path: str | Path, gguf_file: str | None = None) -> str:
    """The one identity of a model's weights as a judge backend names them (every judge's call cache file, call
    input hash and committee identity): a local folder or file by its content (`source_identity`: a copy, move or
    rename is the same model, one changed weight byte another), anything else by its name (a Hub id, ``pkg:NAME``),
    plus the GGUF file read inside it. Never the path."""
    content = source_identity(name_or_path)
    base = f"content={content}" if content else str(name_or_path)
    return base + (f":{gguf_file}" if gguf_file else "")


def model_identity(model: Any) -> str:
    """The content identity of a reward model object: `content_identity` of the folder it was loaded from while its
    weights are unchanged since (`remember_source`; computed once per model), else the `weights_fingerprint` of its
    network (`model`; without one, its class: a closed-form reward's code is its content)."""
    from emoreward.utils.cache_key import weights_fingerprint

    source = getattr(model, "source_dir", None)
    network = getattr(model, "model", None)
    if source is not None and Path(source).is_dir():
        stamp = getattr(model, "_source_versions", None)
        if network is None or stamp is None or stamp == _versions(network):
            cached = getattr(model, "_source_identity", None)
            if cached is None:  # once per loaded model: what it read when it was loaded
                cached = model._source_identity = content_identity(source)
            return cached
    if network is None:
        return f"{type(model).__module__}.{type(model).__qualname__}"
    return weights_fingerprint(network)


def _versions(module) -> tuple:
    return tuple(p._version for p in module.parameters())


def remember_source(model: Any, directory: str | Path) -> None:
    """Record on a just-loaded reward model the folder it came from (for `model_identity`); a later in-place change
    of its weights (training) makes the identity come from the weights instead."""
    model.source_dir = Path(directory)
    network = getattr(model, "model", None)
    model._source_versions = None if network is None else _versions(network)


# ---------------------------------------------------------------------------------------------- engines
@dataclass(frozen=True)
class Engine:
    """A way to score with a reward model: ``open(source, url=..., token=..., media_root=..., dtype=...)`` returns a
    `RewardModel` (a `RewardModelBase` subclass) for ``source`` (a model folder, an export or a Hub id);
    ``needs_url``: it scores through a running server at ``url`` (its ``open`` takes ``timeout=`` too)."""

    name: str
    open: Callable[..., RewardModel]
    needs_url: bool
    help: str


ENGINES: dict[str, Engine] = {}
ENGINE_GROUP = "emoreward.engines"  # entry points naming the module that registers an engine (pyproject.toml)
DEFAULT_ENGINE = "in-process"
HUB_PREFIX = "hf://"


def register_engine(engine: Engine) -> Engine:
    """Add an engine to the registry. Raises ValueError for a name already taken."""
    if engine.name in ENGINES:
        raise ValueError(f"engine {engine.name!r} is already registered")
    ENGINES[engine.name] = engine
    return engine


def find_engine(name: str) -> Engine:
    """The engine ``name``: a registered one, or one an installed package declares in the entry-point group
    `ENGINE_GROUP` (its module is imported and registers it; emoreward declares ``"vllm"`` and ``"server"`` there).

    Raises:
        ValueError: no engine of that name (lists the registered and declared ones)."""
    from importlib.metadata import entry_points

    if name not in ENGINES:
        for point in entry_points(group=ENGINE_GROUP, name=name):
            point.load()  # the module registers its engines
    if name not in ENGINES:
        known = set(ENGINES) | {point.name for point in entry_points(group=ENGINE_GROUP)}
        raise ValueError(
            f"unknown reward-model engine {name!r}; known: {sorted(known)} (an engine registers with "
            f"`register_engine`, or a package declares it in the entry-point group {ENGINE_GROUP!r}; emoreward "
            "declares 'vllm' and 'server' there: where they are missing, the installed package metadata is older "
            "than its pyproject.toml, so reinstall it: pip install -e .)"
        )
    return ENGINES[name]


def unregister_engine(name: str) -> None:
    """Remove an engine (tests that register one of their own)."""
    ENGINES.pop(name, None)


def open_reward_model(
    source: str | Path,
    engine: str = DEFAULT_ENGINE,
    *,
    url: str | None = None,
    token: str | None = None,
    media_root: str | Path | None = None,
    dtype: Any = None,
    timeout: float | None = None,
) -> RewardModel:
    """The reward model every route scores with, opened by ``engine`` (`ENGINES`): ``"in-process"`` loads a model
    folder, an export or a Hub id (``hf://owner/name[@revision]``, from the local Hub cache offline) in this process
    (`load_reward_model`); ``"vllm"`` scores an export through the vLLM server at ``url``
    (`emoreward.export.vllm.VllmRewardModel`); ``"server"`` through an ``emoreward serve`` server at ``url``
    (`emoreward.export.engines.ServerRewardModel`). An engine not yet registered is found by name in the installed
    packages' entry points (`find_engine`): the served engines need no import by the caller.

    Args:
        source: a model folder, an export folder or a Hub id (what the engine reads: weights, or settings, tokenizer
            and identity of what the server serves).
        engine: an engine's name (`find_engine`).
        url, token: the server's base URL and bearer token (engines with ``needs_url``).
        media_root: the folder relative media paths resolve in (multimodal models; refused for a text model).
        dtype: the scoring precision (`emoreward.models.precision`; a served engine checks the one it serves).
        timeout: a served engine's seconds per request, every attempt included (`export.reward_client.RetryPolicy`;
            None: ``$EMOREWARD_ENGINE_TIMEOUT`` or its default).

    Raises:
        ValueError: an unknown engine (lists the registered ones), a ``url`` given to an engine that reads none or
            missing for one that needs it, a ``media_root`` given for a text model (it reads no media files);
            FileNotFoundError / ValueError / RuntimeError: what the engine raises.
    """
    chosen = find_engine(engine)
    if chosen.needs_url and not url:
        raise ValueError(f"the {engine} engine scores through a running server: give its url")
    if url and not chosen.needs_url:
        raise ValueError(f"the {engine} engine scores in this process: a url ({url}) does not apply")
    if media_root is not None and _reads_no_media(source):
        raise ValueError(f"media_root ({media_root}) applies to multimodal reward models: {source} is a text model")
    if not chosen.needs_url:
        if timeout is not None:
            raise ValueError("an engine timeout (--engine-timeout) applies to a served engine: give --vllm-url too")
        return chosen.open(source, url=url, token=token, media_root=media_root, dtype=dtype)
    return chosen.open(source, url=url, token=token, media_root=media_root, dtype=dtype, timeout=timeout)


def hub_folder(source: str) -> Path:
    """The local folder of a Hub reward model ``hf://owner/name[@revision]`` (`huggingface_hub.snapshot_download`:
    the local cache when offline).

    Raises:
        FileNotFoundError: a malformed id, or a model that cannot be fetched (offline and not cached, unknown)."""
    repo, _, revision = source.removeprefix(HUB_PREFIX).partition("@")
    if repo.count("/") != 1 or not all(repo.split("/")) or (_ and not revision):
        raise FileNotFoundError(f"model directory not found: {source} (a Hub model id is hf://OWNER/NAME[@REVISION])")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo, revision=revision or None))
    except Exception as err:  # offline and not cached, no such repository, no network: one line naming the id
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise FileNotFoundError(
            f"model directory not found: {source} (not fetched from the Hub: {type(err).__name__}"
            + (f": {first})" if first else ")")
        ) from None


def reads_media(folder: str | Path) -> bool | None:
    """Whether the reward model in ``folder`` (a model folder or an export) reads media files, from its settings'
    `kind` before it loads (``"text"`` reads none); None where the folder holds no emoreward settings (its loader
    says what it is). The one rule: `open_reward_model` and `emoreward.judges.reads_media` read it."""
    from emoreward.models.base import SETTINGS_FILE, load_settings

    folder = Path(folder).expanduser()
    return load_settings(folder).kind != "text" if (folder / SETTINGS_FILE).is_file() else None


def _reads_no_media(source: str | Path) -> bool:
    """Whether the reward model ``source`` (a folder, an export or a Hub id) is known to be a text model
    (`reads_media` of its folder)."""
    return reads_media(hub_folder(str(source)) if str(source).startswith(HUB_PREFIX) else source) is False


def _open_in_process(source, *, url=None, token=None, media_root=None, dtype=None) -> RewardModel:
    from emoreward.models.base import load_reward_model

    if str(source).startswith(HUB_PREFIX):
        source = hub_folder(str(source))
    loading = {key: value for key, value in (("media_root", media_root), ("dtype", dtype)) if value is not None}
    return load_reward_model(source, **loading)


register_engine(
    Engine(
        DEFAULT_ENGINE,
        _open_in_process,
        needs_url=False,
        help="load the model folder, export or Hub id in this process",
    )
)


__all__ = [
    "DEFAULT_ENGINE",
    "ENGINES",
    "ENGINE_GROUP",
    "find_engine",
    "reads_media",
    "EXPORTED_FROM",
    "Engine",
    "content_identity",
    "export_origin",
    "hub_folder",
    "model_identity",
    "open_reward_model",
    "record_export_origin",
    "referenced_backbone",
    "register_engine",
    "remember_source",
    "reward_model_identity",
    "source_identity",
    "unregister_engine",
    "weights_identity",
]

"""Versioned prompt templates for the zero-shot judges (EmoPrefer, section 4.1 and appendix D; our own wording).

A prompt set is a YAML file in `configs/prompts/` with a `name`, a `version` and one template per step:
`compare_media` (S1), `describe` (S2-S4 step 1), `compare_reference` (S2/S3 step 2), `reason_reference` (S4
step 2) and `extract_answer` (S4 step 3). The templates are rendered with `str.format`; a missing key or an
unknown placeholder is an error when the set is loaded, not in the middle of a run.
"""

from __future__ import annotations

import hashlib
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

from emoreward.data.text import normal_text


def _config_dir() -> Path:
    """`configs/`: the top-level folder of a source checkout, reached through the package's `configs` link (which
    wheels install as package data, `zero_shot/configs/{judges,prompts}`); the checkout's folder directly where the
    link is not followed (a checkout without symlink support)."""
    package = Path(__file__).resolve().parent
    linked = package / "configs"
    return linked.resolve() if (linked / "judges").is_dir() else package.parent / "configs"


CONFIG_DIR = _config_dir()
PROMPT_DIR = CONFIG_DIR / "prompts"

TEMPLATES: dict[str, tuple[str, ...]] = {
    # template -> placeholders it may use
    "compare_media": ("media_hint", "subtitle_line", "description_1", "description_2"),
    "describe": ("media_hint", "subtitle_line"),
    "compare_reference": ("reference", "description_1", "description_2"),
    "reason_reference": ("reference", "description_1", "description_2"),
    "extract_answer": ("reasoning",),
}
MediaKind = Literal["video", "video_frames", "audio", "text"]


def read_yaml(path: str | Path):
    """Parse one YAML file.

    Raises:
        ValueError: invalid YAML, as one line naming the file, line and column (`judge.yaml, line 3, column 9:
            mapping values are not allowed here`); undecodable bytes, naming the file and the line.
        FileNotFoundError: the file does not exist.
    """
    path = Path(path)
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise ValueError(
            f"{path}, line {line}: undecodable bytes {raw[err.start : err.end]!r} (the file must be UTF-8 text)"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        context = getattr(err, "context", None)
        detail = f"{problem} ({context})" if context and getattr(err, "problem", None) else problem
        raise ValueError(f"{path}{where}: invalid YAML: {detail}") from None


@dataclass(frozen=True)
class PromptSet:
    """One versioned set of templates.

    Attributes:
        name, version: identify the set in reports and cache hashes (`emoprefer-v1`).
        system: system message, or "" for none.
        templates: template name -> text with `{placeholders}`.
        media_hint: media kind (`video`, `video_frames`, `audio`, `text`) -> sentence telling the model what it gets.
        subtitle_line: template for the subtitle sentence (`{subtitle}`), left out when a sample has none.
        logit_answer_prefix: assistant-turn prefix used by logit-based verdicts.
    """

    name: str
    version: int
    system: str
    templates: dict[str, str]
    media_hint: dict[str, str]
    subtitle_line: str
    logit_answer_prefix: str
    source: str = ""

    @property
    def tag(self) -> str:
        return f"{self.name}-v{self.version}"

    @property
    def digest(self) -> str:
        """Short hash of every template; part of each cached call's input hash."""
        blob = repr((self.system, sorted(self.templates.items()), sorted(self.media_hint.items()), self.subtitle_line))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def render(self, template: str, *, media: MediaKind = "text", subtitle: str | None = None, **fields: str) -> str:
        """Fill one template.

        Args:
            template: one of `TEMPLATES`.
            media: what the model is given for this call (selects the media hint).
            subtitle: the sample's transcript, or None (the subtitle line is then dropped).
            fields: `description_1`, `description_2`, `reference`, `reasoning` as the template needs.

        Raises:
            ValueError: unknown template or media kind.
        """
        if template not in self.templates:
            raise ValueError(f"unknown template {template!r}; available: {sorted(self.templates)}")
        if media not in self.media_hint:
            raise ValueError(f"unknown media kind {media!r}; available: {sorted(self.media_hint)}")
        values = {k: normal_text(v) if isinstance(v, str) else v for k, v in fields.items()}  # one form of a text
        values["media_hint"] = self.media_hint[media]
        values["subtitle_line"] = self.subtitle_line.format(subtitle=normal_text(subtitle)) if subtitle else _DROP
        text = self.templates[template].format(**{k: values.get(k, "") for k in TEMPLATES[template]})
        # a sample without a subtitle drops the subtitle line rather than leaving a blank one
        return "\n".join(line for line in text.split("\n") if line.strip() != _DROP).strip()


_DROP = "\x00drop-line\x00"


def prompt_file(name_or_path: str | Path) -> Path:
    """The file of a prompt set, the one place a set is resolved: a path as given, a name (no suffix) as its bundled
    file (`emoprefer_v1` -> `configs/prompts/emoprefer_v1.yaml`). Run identities hash this file's content.

    Raises:
        ValueError: unknown name (lists the available sets). FileNotFoundError: no file at the path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROMPT_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            available = sorted(p.stem for p in PROMPT_DIR.glob("*.yaml"))
            raise ValueError(f"unknown prompt set {name_or_path!r}; available: {available}")
    if not path.exists():
        raise FileNotFoundError(f"prompt file not found: {path}")
    return path


def load_prompts(name_or_path: str | Path) -> PromptSet:
    """Load a prompt set by file path or by name (`prompt_file`).

    Raises:
        ValueError: unknown name (lists the available sets), a missing template, or a placeholder a template
            may not use.
    """
    path = prompt_file(name_or_path)
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping of templates")
    for key in ("name", "version", *TEMPLATES, "media_hint", "subtitle_line"):
        if key not in raw:
            raise ValueError(f"{path}: missing key {key!r}")
    templates = {key: str(raw[key]) for key in TEMPLATES}
    for key, text in templates.items():
        used = {f for _, f, _, _ in string.Formatter().parse(text) if f}
        bad = used - set(TEMPLATES[key])
        if bad:
            raise ValueError(
                f"{path}: template {key!r} uses unknown placeholders {sorted(bad)}; allowed: {TEMPLATES[key]}"
            )
    hints = {str(k): str(v) for k, v in raw["media_hint"].items()}
    missing = {"video", "video_frames", "audio", "text"} - set(hints)
    if missing:
        raise ValueError(f"{path}: media_hint lacks {sorted(missing)}")
    return PromptSet(
        name=str(raw["name"]),
        version=int(raw["version"]),
        system=str(raw.get("system") or ""),
        templates=templates,
        media_hint=hints,
        subtitle_line=str(raw["subtitle_line"]),
        logit_answer_prefix=str(raw.get("logit_answer_prefix") or "Answer:"),
        source=str(path),
    )

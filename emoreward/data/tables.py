"""Description tables: the descriptions M models wrote for N samples, the input of ranking (EMER-Ranker, section 2).

JSONL, one `{"sample", "model", "description"[, "video", "audio", "subtitle"]}` object a line; bad input raises
`TableError` naming the file, line and field. Empty descriptions are kept and counted; models and samples are kept
in the order of their content (`canonical_order`), so a shuffled or renamed table ranks the same. See
docs/ranking.md.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from emoreward.data.context import MediaRef, reward_context, same_media
from emoreward.data.readers import undecodable
from emoreward.data.text import NameNormaliser, description_length, normal_name, normal_text


MEDIA_FIELDS: tuple[str, ...] = ("video", "audio", "subtitle")


class TableError(ValueError):
    """Invalid description table; the message names the file, the line and the field."""


def read_utf8(path: str | Path, error: type[ValueError] = TableError) -> str:
    """The text of a UTF-8 file, a leading byte-order mark removed.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        error: (each loader's own `ValueError` class) on bytes that are not UTF-8; names the file, the line, for
            JSON lines the field, and the bytes."""
    path = Path(path)
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line, _row, field, message = undecodable(raw, err, "jsonl" if path.suffix.lower() == ".jsonl" else None)
        where = f", field {field!r}" if field else ""
        raise error(f"{path}, line {line}{where}: {message}") from None


@dataclass(frozen=True)
class DescriptionTable:
    """Descriptions written by M models for N samples (one description per model and sample).

    Attributes:
        models (`list[str]`): the M models, in the order of their content (`canonical_order`).
        samples (`list[str]`): the N samples, in the order of their content (`canonical_order`).
        descriptions (`dict[tuple[str, str], str]`): ``(sample, model) -> description``; a model may miss samples.
        media (`dict[str, MediaRef]`): per-sample media (video / audio path, subtitle) when the table gives them.
        source (`str`): where the table came from (for reports).
        lines (`dict[tuple[str, str], int]`): ``(sample, model) -> line`` of the file (or 1-based row), for error
            messages; empty for a table built in code.
    """

    models: list[str]
    samples: list[str]
    descriptions: dict[tuple[str, str], str]
    media: dict[str, MediaRef] = field(default_factory=dict)
    source: str = "<memory>"
    lines: dict[tuple[str, str], int] = field(default_factory=dict)

    @classmethod
    def from_rows(cls, rows: Iterable[dict[str, Any]], source: str = "<memory>") -> DescriptionTable:
        """Build a table from dict rows with ``sample``, ``model``, ``description`` and optional media fields (which every
        row of a sample must agree on); errors name the row's position (1-based) as its line.

        Raises:
            TableError: on a missing or non-string field, a repeated ``(sample, model)``, rows of one sample
                that disagree on its media, or no rows."""
        return cls._from_numbered(enumerate(rows, start=1), source)

    @classmethod
    def _from_numbered(cls, rows: Iterable[tuple[int, Any]], source: str) -> DescriptionTable:
        """`from_rows` on ``(line number, row)`` pairs, so that errors name the line of the file."""
        models: dict[str, None] = {}
        samples: dict[str, None] = {}
        descriptions: dict[tuple[str, str], str] = {}
        media: dict[str, MediaRef] = {}
        lines: dict[tuple[str, str], int] = {}
        sample_names, model_names = NameNormaliser("sample id", source), NameNormaliser("model name", source)
        for line, row in rows:
            if not isinstance(row, dict):
                raise TableError(f"{source}, line {line}: expected a JSON object, got {type(row).__name__}")
            for key in ("sample", "model", "description"):
                if key not in row or row[key] is None:
                    raise TableError(f"{source}, line {line}, field {key!r}: missing")
                if not isinstance(row[key], str):
                    raise TableError(
                        f"{source}, line {line}, field {key!r}: expected a string, got {type(row[key]).__name__}"
                    )
            for key in ("sample", "model"):
                if not row[key].strip():
                    raise TableError(f"{source}, line {line}, field {key!r}: empty")
            sample, model = sample_names(row["sample"], f"line {line}"), model_names(row["model"], f"line {line}")
            for key in MEDIA_FIELDS:
                if row.get(key) is not None and not isinstance(row[key], str):
                    raise TableError(
                        f"{source}, line {line}, field {key!r}: expected a string, got {type(row[key]).__name__}"
                    )
            if (sample, model) in descriptions:
                raise TableError(
                    f"{source}, line {line}, field 'model': a second description of sample {sample!r} by {model!r} "
                    f"(the first is on line {lines[sample, model]})"
                )
            # the one context rule (types checked above, so it raises nothing here)
            context = reward_context(**{k: row.get(k) for k in MEDIA_FIELDS}, source=source, row=line)
            ref = MediaRef(context.video, context.audio, context.subtitle)
            key = same_media(ref, media[sample]) if sample in media else None
            if key is not None:
                first = min(n for (s, _), n in lines.items() if s == sample)
                raise TableError(
                    f"{source}, line {line}, field {key!r}: sample {sample!r} has {key} {getattr(ref, key)!r} here "
                    f"but {getattr(media[sample], key)!r} on line {first}; every row of a sample must agree"
                )
            media[sample] = ref
            models.setdefault(model)
            samples.setdefault(sample)
            descriptions[sample, model] = row["description"]
            lines[sample, model] = line
        if not descriptions:
            raise TableError(f"{source}: no rows")
        media = {s: m for s, m in media.items() if not m.is_empty()}
        return cls(*canonical_order(models, samples, descriptions, media), descriptions, media, source, lines)

    def sample_line(self, sample: str) -> int | None:
        """The first line of the table that describes ``sample`` (None for a table built without line numbers)."""
        found = [n for (s, _), n in self.lines.items() if s == sample]
        return min(found) if found else None

    @property
    def n_models(self) -> int:
        return len(self.models)

    @property
    def n_samples(self) -> int:
        return len(self.samples)

    def subtitle(self, sample: str) -> str | None:
        """The sample's subtitle, or ``None``."""
        ref = self.media.get(sample)
        return None if ref is None else ref.subtitle

    def texts(self, model: str) -> tuple[list[str], list[str | None]]:
        """The model's descriptions in sample order, and the matching subtitles (``None`` when unknown)."""
        samples = [s for s in self.samples if (s, model) in self.descriptions]
        return [self.descriptions[s, model] for s in samples], [self.subtitle(s) for s in samples]

    def subset(self, samples: Sequence[str] | None = None, models: Sequence[str] | None = None) -> DescriptionTable:
        """The table restricted to ``samples`` and ``models`` (``None`` keeps all), in the table's order.

        Raises:
            TableError: on an unknown sample or model, one selected twice, or an empty selection.
        """
        # names as the table reads them (`normal_name`): a selection spelled as written in the file selects it
        named = samples is not None
        samples = list(self.samples if samples is None else map(normal_name, samples))
        models = list(self.models if models is None else map(normal_name, models))
        for kind, wanted, known in (("samples", samples, self.samples), ("models", models, self.models)):
            unknown = sorted(set(wanted) - set(known))
            if unknown:
                raise TableError(f"unknown {kind} {unknown[:5]}; the table has {len(known)} {kind}")
            if not wanted:
                raise TableError(f"subset selects no {kind}")
        for kind, wanted in (("samples", samples), ("models", models)):
            repeated = sorted({x for x in wanted if wanted.count(x) > 1})
            if repeated:
                raise TableError(f"{kind} {repeated[:5]} selected more than once; select each once")
        keep_s, keep_m = set(samples), set(models)
        descriptions = {k: v for k, v in self.descriptions.items() if k[0] in keep_s and k[1] in keep_m}
        described = {s for s, _ in descriptions}
        if named:  # a sample named that no kept model described cannot be ranked
            unseen = [s for s in samples if s not in described]
            if unseen:
                raise TableError(
                    f"samples {unseen[:5]} have no description by the selected models {sorted(keep_m)[:5]}"
                )
        keep_s &= described  # as filtering the rows first: a sample none of the kept models described is gone
        media = {s: m for s, m in self.media.items() if s in keep_s}
        lines = {k: v for k, v in self.lines.items() if k in descriptions}
        # the order of the rows kept, whatever order the selection names them in: a subset equals filtering first
        models, samples = canonical_order(keep_m, keep_s, descriptions, media)
        return DescriptionTable(models, samples, descriptions, media, self.source, lines)

    def read_sample_ids(self, path: str | Path) -> list[str]:
        """The sample ids of a file, one a line (blank lines skipped), read as the table reads its own
        (`normal_name`); `TableError` naming the file and line of an id not in the table or listed again (and the
        line of its first listing), or a file without ids."""
        file, known = Path(path), set(self.samples)
        samples: list[str] = []
        first: dict[str, int] = {}
        for number, line in enumerate(read_utf8(file).split("\n"), start=1):
            sample = normal_name(line)
            if sample and sample not in known:
                raise TableError(
                    f"{file}, line {number}: sample {sample!r} is not in the table {self.source} ({self.n_samples} "
                    "samples)"
                )
            if sample in first:
                raise TableError(
                    f"{file}, line {number}: sample {sample!r} selected more than once (line {first[sample]} lists "
                    "it); select each once"
                )
            if sample:
                first[sample] = number
                samples.append(sample)
        if not samples:
            raise TableError(f"{file}: no sample ids in the file")
        return samples

    def select(
        self,
        models: Sequence[str] | None = None,
        samples: Sequence[str] | None = None,
        n_samples: int | None = None,
        seed: int = 0,
    ) -> DescriptionTable:
        """Every subset option in the one order that composes, each equal to filtering the rows first: the
        ``models``, then the ``samples`` among those the kept models described (`subset`), then ``n_samples`` drawn
        from what is left on which two kept models can be compared (`sample_subset`, seeded by ``seed``). ``None``
        keeps all.

        Raises:
            TableError: as `subset`, or ``n_samples`` above the comparable samples (`comparable_samples`) left after
                the other selections, naming how many there are.
        """
        table = self.subset(samples, models) if models is not None or samples is not None else self
        comparable = len(table.comparable_samples)
        if n_samples is not None and n_samples > comparable:
            raise TableError(
                f"--samples {n_samples}: the table {self.source} has {comparable} samples on which two of "
                f"{'the selected' if table is not self else 'its'} {table.n_models} models can be compared (a "
                "sample one model described gives no comparison)"
            )
        return table if n_samples is None else table.sample_subset(n_samples, seed=seed)

    @property
    def comparable_samples(self) -> list[str]:
        """The samples (table order) at least two of the table's models described: those a ranking compares on,
        and the ones `sample_subset` draws from."""
        count: dict[str, int] = {}
        for sample, _ in self.descriptions:
            count[sample] = count.get(sample, 0) + 1
        return [s for s in self.samples if count.get(s, 0) >= 2]

    def sample_subset(self, n: int, seed: int = 0) -> DescriptionTable:
        """A random subset of ``n`` samples (EMER-Ranker, section 5: fewer comparison samples), drawn among the
        `comparable_samples` (a sample one model described gives no comparison), table order kept.

        Raises:
            TableError: if ``n`` is not in ``[1, len(comparable_samples)]``.
        """
        among = self.comparable_samples
        if not 1 <= n <= len(among):
            raise TableError(
                f"sample subset size must be in [1, {len(among)}] (the samples two models can be compared on), got {n}"
            )
        chosen = set(np.random.default_rng(seed).choice(len(among), size=n, replace=False).tolist())
        return self.subset([s for k, s in enumerate(among) if k in chosen])

    def lengths(self) -> dict[str, dict[str, float]]:
        """Per model: mean description length and counts, ``{"chars", "words", "n", "n_empty"}`` (``n_empty``: empty or
        whitespace-only descriptions, judged as given)."""
        out = {}
        for model in self.models:
            texts = self.texts(model)[0]
            out[model] = {
                "chars": float(np.mean([description_length(t, "chars") for t in texts])) if texts else math.nan,
                "words": float(np.mean([description_length(t, "words") for t in texts])) if texts else math.nan,
                "n": len(texts),
                "n_empty": sum(not t.strip() for t in texts),
            }
        return out


def canonical_order(
    models: Iterable[str],
    samples: Iterable[str],
    descriptions: dict[tuple[str, str], str],
    media: dict[str, MediaRef],
) -> tuple[list[str], list[str]]:
    """The order of a table's models and samples: each by a digest of its content (its descriptions as a set, in
    `normal_text` form, and a sample's media), the name only between two of one content, so a shuffled, renamed or
    re-encoded table gives the same numbers."""
    texts: dict[str, list[str]] = {}
    for (sample, model), text in descriptions.items():
        texts.setdefault(sample, []).append(normal_text(text))
        texts.setdefault("\x02" + model, []).append(normal_text(text))

    def digest(body: str) -> str:
        return hashlib.sha1(body.encode("utf-8")).hexdigest()

    def sample_key(sample: str) -> tuple[str, str]:
        ref = media.get(sample, MediaRef())
        media_text = repr((ref.video, ref.audio, ref.subtitle and normal_text(ref.subtitle)))
        return digest("\x00".join(sorted(texts.get(sample, []))) + "\x01" + media_text), sample

    def model_key(model: str) -> tuple[str, str]:
        return digest("\x00".join(sorted(texts.get("\x02" + model, [])))), model

    return sorted(models, key=model_key), sorted(samples, key=sample_key)


def load_description_table(path: str | Path) -> DescriptionTable:
    """Read a JSONL description table (UTF-8, with or without BOM; blank lines skipped).

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        TableError: on undecodable bytes, invalid JSON or invalid rows (the message names the file and the line)."""
    given, path = str(path), Path(path)  # named as given: Path would make "hf://a/b" "hf:/a/b"
    if not path.is_file():
        hub = " (Hub ids are read for preference pairs; a description table is a local JSONL file)"
        raise FileNotFoundError(f"description table {given} does not exist{hub if given.startswith('hf://') else ''}")
    text = read_utf8(path)

    def rows() -> Iterable[tuple[int, Any]]:
        # split on newlines only: str.splitlines would also split on U+2028 etc., legal inside a JSON string
        for line_no, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except json.JSONDecodeError as err:
                raise TableError(f"{path}, line {line_no}: invalid JSON ({err.msg})") from None

    return DescriptionTable._from_numbered(rows(), source=str(path))


def bundled_ovmerd_path() -> Path:
    """The vendored OV-MERD description table (10 models x 332 samples; see ``data/files/NOTICE``)."""
    from importlib import resources

    return Path(str(resources.files("emoreward") / "data" / "files" / "ovmerd" / "ovmerd_descriptions_subtitle.jsonl"))


def load_selection(
    data: str | Path,
    models: str | None = None,
    sample_ids: str | Path | None = None,
    n_samples: int | None = None,
    seed: int = 0,
) -> DescriptionTable:
    """The table ``data`` names (a JSONL path, or ``"ovmerd"``: `bundled_ovmerd_path`) with the subsets of
    `emoreward rank` applied in the one order that composes (`DescriptionTable.select`).

    Args:
        data: the table's path or ``"ovmerd"``.
        models (`str`, *optional*): comma-separated model names, read as the table reads its own (`normal_name`);
            given, even empty, it is checked, never read as "all models".
        sample_ids (*optional*): a file of sample ids, one a line (`DescriptionTable.read_sample_ids`).
        n_samples, seed: a random subset of that many samples (`DescriptionTable.sample_subset`).

    Raises:
        TableError: naming the option: a model not in the table, one listed twice, fewer than two models; as
            `load_description_table` and `DescriptionTable.select`. FileNotFoundError: no ``sample_ids`` file.
    """
    table = load_description_table(bundled_ovmerd_path() if str(data) == "ovmerd" else data)
    names = None
    if models is not None:
        names = [normal_name(m) for m in models.split(",") if m.strip()]
        unknown = [m for m in names if m not in table.models]
        if unknown:
            raise TableError(
                f"--models: {unknown} not in the table {table.source}; its models are {sorted(table.models)}"
            )
        repeated = sorted({m for m in names if names.count(m) > 1})
        if repeated:
            raise TableError(f"--models: {repeated} listed more than once in {models!r}")
        if len(set(names)) < 2:
            raise TableError(f"--models: a ranking needs at least two models, got {names}")
    if sample_ids and not Path(sample_ids).is_file():
        raise FileNotFoundError(f"--sample-ids {sample_ids}: no such file")
    samples = table.read_sample_ids(sample_ids) if sample_ids else None
    return table.select(names, samples, n_samples, seed=seed)


__all__ = [
    "MEDIA_FIELDS",
    "DescriptionTable",
    "TableError",
    "bundled_ovmerd_path",
    "load_description_table",
    "load_selection",
    "read_utf8",
]

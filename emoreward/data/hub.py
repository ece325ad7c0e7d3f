"""Preference data from the Hugging Face Hub (`hf://OWNER/NAME[/CONFIG][@REVISION][:SPLIT]`) and from local
dataset folders, through `datasets` (no remote code); a string without `hf://` is always a path.

Offline, or when the Hub cannot be reached, a dataset not in the local cache fails with one line naming it
(`DataError`). See docs/data.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emoreward.data.errors import DataError


HUB_PREFIX = "hf://"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
SYNTAX = "hf://OWNER/NAME[/CONFIG][@REVISION][:SPLIT]"


@dataclass(frozen=True)
class HubDatasetSpec:
    """A dataset on the Hub, pinned to a revision and split.

    Attributes:
        repo_id (`str`): `OWNER/NAME`.
        config (`str` or `None`): the dataset configuration (subset), or the default one.
        revision (`str` or `None`): branch, tag or commit; None: the default branch.
        split (`str` or `None`): the split; None: `train`, or the only split.
    """

    repo_id: str
    config: str | None = None
    revision: str | None = None
    split: str | None = None

    def __str__(self) -> str:
        return (
            HUB_PREFIX
            + self.repo_id
            + (f"/{self.config}" if self.config else "")
            + (f"@{self.revision}" if self.revision else "")
            + (f":{self.split}" if self.split else "")
        )


def is_hub_spec(source: Any) -> bool:
    """Whether `source` names a Hub dataset (a string starting with `hf://`)."""
    return isinstance(source, str) and source.startswith(HUB_PREFIX)


def parse_hub_spec(spec: str) -> HubDatasetSpec:
    """Parse `hf://OWNER/NAME[/CONFIG][@REVISION][:SPLIT]`.

    Raises:
        DataError: a malformed id (the message gives the syntax).
    """
    if not is_hub_spec(spec):
        raise DataError(str(spec), None, None, f"not a Hub dataset id; expected {SYNTAX}")
    body, colon, split = spec[len(HUB_PREFIX) :].partition(":")
    repo, at, revision = body.partition("@")
    parts = repo.split("/")
    problem = None
    if len(parts) not in (2, 3) or not all(_NAME.fullmatch(p) for p in parts):
        problem = "OWNER/NAME (and CONFIG) must be names of letters, digits, '.', '_' and '-'"
    elif at and not revision:
        problem = "'@' must be followed by a revision"
    elif colon and not split:
        problem = "':' must be followed by a split"
    if problem:
        raise DataError(spec, None, None, f"malformed Hub dataset id: {problem}; expected {SYNTAX}")
    return HubDatasetSpec("/".join(parts[:2]), parts[2] if len(parts) == 3 else None, revision or None, split or None)


def load_hub_dataset(spec: HubDatasetSpec | str) -> Any:
    """The split of a Hub dataset as a `datasets.Dataset`.

    Online, the dataset and revision are first looked up (one quick request), so a wrong id, a missing revision,
    a gated or private dataset and an unreachable Hub each fail fast with their own message.

    Raises:
        DataError: one line naming the dataset id: offline and not cached, Hub unreachable, no such dataset,
            revision, config or split, or a load failure.
    """
    import datasets
    from huggingface_hub import constants

    if isinstance(spec, str):
        spec = parse_hub_spec(spec)
    label = str(spec)
    offline = constants.is_offline_mode() if hasattr(constants, "is_offline_mode") else constants.HF_HUB_OFFLINE
    if not offline:
        _preflight(spec, label, constants.ENDPOINT)
    try:
        split = spec.split or _default_split(
            datasets.get_dataset_split_names(spec.repo_id, spec.config, revision=spec.revision), label
        )
        return datasets.load_dataset(spec.repo_id, spec.config, split=split, revision=spec.revision)
    except DataError:
        raise
    except Exception as err:  # datasets raises many kinds; each becomes one line naming the dataset
        if offline and isinstance(err, (ConnectionError, FileNotFoundError)):
            raise DataError(
                label,
                None,
                None,
                "cannot load offline (HF_HUB_OFFLINE=1): the dataset is not in the local cache. Run once with "
                "network access, or download it and give its local folder",
            ) from None
        raise DataError(label, None, None, f"cannot load the dataset: {_one_line(err)}") from None


def _preflight(spec: HubDatasetSpec, label: str, endpoint: str) -> None:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        HfApi().dataset_info(spec.repo_id, revision=spec.revision)
    except GatedRepoError:
        raise DataError(
            label, None, None, "the dataset is gated: accept its conditions on the Hub and log in"
        ) from None
    except RepositoryNotFoundError:
        raise DataError(
            label,
            None,
            None,
            f"no dataset {spec.repo_id!r} on the Hub at {endpoint}, or it is private (log in, or set HF_TOKEN)",
        ) from None
    except RevisionNotFoundError:
        raise DataError(label, None, None, f"the dataset has no revision {spec.revision!r}") from None
    except HfHubHTTPError as err:
        raise DataError(label, None, None, f"the Hub answered: {_one_line(err)}") from None
    except Exception as err:  # connection refused, DNS, timeout, proxy: the transport library's own errors
        raise DataError(
            label,
            None,
            None,
            f"cannot reach the Hub at {endpoint} ({_one_line(err)}). To use a copy cached by an earlier run, set "
            "HF_HUB_OFFLINE=1",
        ) from None


def load_local_dataset(path: Path, split: str | None = None) -> Any:
    """One split of a local dataset folder as a `datasets.Dataset` (see the module docstring).

    Args:
        path: a `save_to_disk` folder (a `Dataset` or a `DatasetDict`) or a folder of data files.
        split: the split; None: `train`, or the only split.

    Raises:
        DataError: an unknown split (lists the splits), a folder `datasets` cannot read.
    """
    import datasets

    label = str(path)
    try:
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.Dataset):
                if split is not None and loaded.split is not None and str(loaded.split) != split:
                    raise DataError(label, None, None, f"holds split {str(loaded.split)!r}, not {split!r}")
                return loaded
        else:
            loaded = datasets.load_dataset(str(path))
    except DataError:
        raise
    except Exception as err:
        raise DataError(label, None, None, f"not a dataset folder datasets can read: {_one_line(err)}") from None
    if split is None:
        split = _default_split(list(loaded), label)
    elif split not in loaded:
        raise DataError(label, None, None, f"no split {split!r}; the splits are {sorted(loaded)}")
    return loaded[split]


def _default_split(splits: list[str], label: str) -> str:
    if "train" in splits:
        return "train"
    if len(splits) == 1:
        return splits[0]
    raise DataError(label, None, None, f"name a split: it has {sorted(splits)} and no 'train'")


def _one_line(err: BaseException) -> str:
    """`Type: message` on one line, with the cause when the error only wraps it (as `datasets` often does)."""
    text = " ".join(str(err).split())[:300]
    out = f"{type(err).__name__}: {text}" if text else type(err).__name__
    cause = err.__cause__ or err.__context__
    if cause is not None and str(cause) and str(cause) not in text:
        out += f" ({type(cause).__name__}: {' '.join(str(cause).split())[:300]})"
    return out


__all__ = [
    "HUB_PREFIX",
    "HubDatasetSpec",
    "is_hub_spec",
    "load_hub_dataset",
    "load_local_dataset",
    "parse_hub_spec",
]

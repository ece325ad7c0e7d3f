"""Structural rules of the code base, read from the source with `ast`: every import (module level, inside functions,
and module names given as strings, as the command dispatcher's `importlib` table does) goes down the floors
utils < data < models < evaluation < training | ranking | export | zero_shot < judges < cli, never up or sideways;
no import cycle at module level; no module reaching into another module's private names; a size budget and an
opening docstring for every library file; openings of at most 15 lines, without dates, in library, scripts and benchmarks. Also:
every recipe field is read by a backbone kind or refused for it, commands and backbones are read from their
registries, and test files have unique basenames."""

from __future__ import annotations

import ast
import dataclasses
import re
import typing
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("emoreward", "zero_shot")
MAX_LINES = 800

# floor of each top-level part (a package below `emoreward`, or `zero_shot`); imports go to a lower floor, or stay
# inside their own part; the parts of one floor do not import each other
FLOORS = {
    "emoreward": 0,  # the package root: `__version__` only
    "utils": 0,
    "data": 1,
    "models": 2,
    "evaluation": 3,
    "zero_shot": 3.5,  # generative judges: below training (a judge is trained), ranking and export (judges used)
    "training": 4,
    "ranking": 4,
    "export": 4,
    "judges": 5,
    "cli": 6,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


FILES = sorted(p for package in LIBRARY for p in (ROOT / package).rglob("*.py"))
MODULES = {module_name(p): p for p in FILES}


def part(module: str) -> str:
    """The floor part of a module: `emoreward.ranking.bpa.model` -> `ranking`, `zero_shot.runner` -> `zero_shot`."""
    names = module.split(".")
    if names[0] == "zero_shot":
        return "zero_shot"
    return names[1] if len(names) > 1 else "emoreward"


@dataclasses.dataclass(frozen=True)
class Import:
    target: str  # the imported module (for `from m import n`: `m.n` when that is a module, else `m`)
    names: tuple[str, ...]  # names imported from it (`from m import a, b`), empty for `import m` and strings
    line: int
    module_level: bool  # runs when the importing module is imported (not inside a function or TYPE_CHECKING)
    how: str  # "import", "from" or "string"


def resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def owner(target: str, modules) -> str | None:
    """The module of ours that `target` names (`emoreward.cli.main:main` and `a.b.func` -> their module)."""
    target = target.split(":")[0]
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def read_imports(source: str, module: str, is_package: bool, modules) -> list[Import]:
    """Every import of a module's source: `import` and `from ... import` statements anywhere (module level, in
    functions and methods, under `try`/`if`), and string constants that name one of `modules` (`"pkg.mod"` or
    `"pkg.mod:attr"`, what `importlib.import_module` tables hold; docstrings excluded)."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    module_level: set[int] = set()

    def mark(nodes) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                mark(node.orelse)
                continue
            module_level.add(id(node))
            for field in ("body", "orelse", "finalbody", "handlers"):
                mark(getattr(node, field, None) or [])

    mark(tree.body)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [Import(a.name, (), node.lineno, id(node) in module_level, "import") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = resolve(module, node, is_package)
            names = tuple(a.name for a in node.names)
            submodules = [f"{base}.{n}" for n in names if f"{base}.{n}" in modules]
            # `from package import submodule` needs the submodule, not what the package's __init__ imports (Python
            # finds the submodule even while that __init__ is still running)
            for target in submodules if len(submodules) == len(names) else {base, *submodules}:
                found.append(Import(target, names, node.lineno, id(node) in module_level, "from"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if node.value.split(":")[0] in modules:
                found.append(Import(node.value.split(":")[0], (), node.lineno, False, "string"))
    return found


IMPORTS = {
    name: read_imports(path.read_text(encoding="utf-8"), name, path.name == "__init__.py", MODULES)
    for name, path in MODULES.items()
}


def ours(imp: Import) -> str | None:
    return owner(imp.target, MODULES) if imp.target.split(".")[0] in LIBRARY else None


def test_the_reader_sees_function_level_type_checking_and_string_imports():
    modules = {"emoreward.cli.main", "emoreward.cli.train", "emoreward.data", "emoreward.data.pairs"}
    source = (
        '"""doc naming emoreward.cli.train"""\n'
        "from typing import TYPE_CHECKING\n"
        "from emoreward.data import pairs\n"
        "if TYPE_CHECKING:\n    from emoreward.cli import train\n"
        "TABLE = {'train': 'emoreward.cli.train'}\n"
        "def f():\n    import emoreward.data.pairs\n"
    )
    found = read_imports(source, "emoreward.cli.main", False, modules)
    got = {(i.target, i.how, i.module_level) for i in found if i.target.startswith("emoreward")}
    assert got == {
        ("emoreward.data.pairs", "from", True),
        ("emoreward.cli.train", "from", False),
        ("emoreward.cli.train", "string", False),
        ("emoreward.data.pairs", "import", False),
    }


def test_every_library_module_has_a_floor():
    unknown = sorted({part(m) for m in MODULES} - set(FLOORS))
    assert not unknown, f"packages without a floor in FLOORS (say where they sit): {unknown}"


def test_imports_go_down_the_floors():
    """data < models < evaluation < zero_shot < training | ranking | export < judges < cli (utils lowest): an
    import stays inside its own part or goes to a lower floor, at module level and inside functions alike."""
    offenders = []
    for name, found in IMPORTS.items():
        here = part(name)
        for imp in found:
            target = ours(imp)
            if target is None or part(target) == here:
                continue
            there = part(target)
            if FLOORS[there] >= FLOORS[here] and there != "emoreward":
                direction = "up" if FLOORS[there] > FLOORS[here] else "sideways"
                kind = "module level" if imp.module_level else imp.how if imp.how == "string" else "in a function"
                offenders.append(
                    f"{MODULES[name].relative_to(ROOT)}:{imp.line} {name} -> {target} ({direction}, {kind})"
                )
    assert not offenders, "imports that do not go down the floors:\n" + "\n".join(sorted(set(offenders)))


def cycles_of(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles of a module graph (at least one per strongly connected part that has one)."""
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
    return cycles


def test_the_options_module_is_a_leaf_and_every_command_module_keeps_the_contract():
    """`emoreward.cli.options` imports nothing of the project but `emoreward.utils.guard`, which imports nothing
    (any command module, script or test can use it);
    each module the dispatcher names defines `add_arguments(parser)` and `run(args)`."""
    from emoreward.cli.main import COMMANDS

    leaf = [ours(imp) for imp in IMPORTS["emoreward.cli.options"] if ours(imp) not in (None, "emoreward.utils.guard")]
    # (`guarded` reads `emoreward.utils.io` from `sys.modules` by name, only where a command imported it)
    guard = [ours(imp) for imp in IMPORTS["emoreward.utils.guard"] if ours(imp) is not None and imp.how != "string"]
    assert not guard, f"emoreward.utils.guard (the exit codes options reads) imports {guard}"
    assert not leaf, f"emoreward.cli.options imports {leaf}"
    for name, (_help, module) in COMMANDS.items():
        tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        defined |= {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
        assert {"add_arguments", "run"} <= defined, f"command {name}: {module} lacks add_arguments or run"


def test_no_import_cycles_at_module_level():
    graph = {m: set() for m in MODULES}
    for name, found in IMPORTS.items():
        for imp in found:
            target = ours(imp)
            if imp.module_level and target is not None and target != name:
                graph[name].add(target)
    # importing a package imports its __init__: a submodule importing its own package's __init__ that imports it
    # back is a cycle like any other
    cycles = cycles_of(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_import_cycles_between_modules_even_inside_functions():
    """A function-level or `TYPE_CHECKING` import that closes a loop (`pipeline -> tracking -> pipeline`, a route
    naming the service that builds it) hides a dependency the wrong way round just as well. Package `__init__`
    modules are nodes like any other (importing a package runs its `__init__`, whose imports count). Aside only:
    registries naming their implementations by string (`models.base.MODEL_CLASSES`: the protocol's module picks the
    class by name)."""
    graph = {m: set() for m in MODULES}
    for name, found in IMPORTS.items():
        for imp in found:
            target = ours(imp)
            if target is not None and target != name and imp.how != "string":
                graph[name].add(target)
    cycles = cycles_of(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


# the one base that writes `score` / `score_info` (and the protocol that declares them); a class elsewhere that scores
# descriptions writes `score_contexts` only. The model process's proxy is the scorer a service calls, not a model.
SCORE_OWNERS = {
    "emoreward.models.base": {"RewardModel", "RewardModelBase"},
    "emoreward.export.serve.worker": {"ModelProcess"},
}


def test_score_and_score_info_are_written_once():
    """Every reward model (text, multimodal, a served engine's client) inherits `score` / `score_info` from
    `emoreward.models.base.RewardModelBase` (issue 39): no other class defines them over descriptions."""
    offenders = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef) or node.name in SCORE_OWNERS.get(name, set()):
                continue
            for item in node.body:
                if (
                    isinstance(item, ast.FunctionDef)
                    and item.name in ("score", "score_info")
                    and [a.arg for a in item.args.args[1:2]] == ["descriptions"]
                ):
                    offenders.append(f"{path.relative_to(ROOT)}:{item.lineno} {node.name}.{item.name}")
    assert not offenders, "score / score_info written again (write score_contexts instead):\n" + "\n".join(offenders)


def test_no_module_imports_another_modules_private_names():
    offenders = []
    for name, found in IMPORTS.items():
        for imp in found:
            private = [n for n in imp.names if n.startswith("_") and not n.startswith("__")]
            target = ours(imp)
            if private and target is not None and target != name and f"{target}.{private[0]}" not in MODULES:
                offenders.append(f"{name} imports {private} from {target}")
    assert not offenders, offenders


def test_library_files_have_a_docstring_and_stay_within_the_size_budget():
    no_docstring = [str(p.relative_to(ROOT)) for p in FILES if not ast.get_docstring(ast.parse(p.read_text("utf-8")))]
    too_long = {
        str(p.relative_to(ROOT)): n
        for p in FILES
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not no_docstring, f"files without an opening docstring naming their concern: {no_docstring}"
    assert not too_long, f"library files over {MAX_LINES} lines (split along their concerns): {too_long}"


MAX_OPENING_LINES = 15
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def test_module_openings_are_short_and_undated():
    """A file opens with what it does and where its docs page is; measurements, dates and history go to `docs/`
    or the commit messages."""
    too_long, dated = {}, []
    for path in [*FILES, *sorted((ROOT / "scripts").rglob("*.py")), *sorted((ROOT / "benchmarks").rglob("*.py"))]:
        text = ast.get_docstring(ast.parse(path.read_text("utf-8")), clean=False)
        if text is None:
            continue
        if (n := text.count("\n") + 1) > MAX_OPENING_LINES:
            too_long[str(path.relative_to(ROOT))] = n
        if DATE.search(text):
            dated.append(str(path.relative_to(ROOT)))
    assert not too_long, f"module docstrings over {MAX_OPENING_LINES} lines (file: lines): {too_long}"
    assert not dated, f"module docstrings holding a date (move it to docs/ or a commit message): {dated}"


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


# ---------------------------------------------------------------------------------------------- registries
def string_lists(path: Path, dict_keys: bool = False):
    """The string elements of each tuple, list or set literal (with ``dict_keys``, also the string keys of each dict
    literal) in a file, with its line."""
    kinds = (ast.Tuple, ast.List, ast.Set, ast.Dict) if dict_keys else (ast.Tuple, ast.List, ast.Set)
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, kinds):
            elements = node.keys if isinstance(node, ast.Dict) else node.elts
            strings = [e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            yield node.lineno, strings


def test_commands_are_read_from_the_dispatcher_registry():
    """Every command module (`add_arguments` and `run`) is registered in `COMMANDS`, and no other cli module or
    test spells all the commands out in a list: they read `COMMANDS`."""
    from emoreward.cli.main import COMMANDS

    registered = {module for _help, module in COMMANDS.values()}
    for path in sorted((ROOT / "emoreward" / "cli").glob("*.py")):
        tree = ast.parse(path.read_text("utf-8"))
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        if {"add_arguments", "run"} <= defined:
            assert module_name(path) in registered, f"{module_name(path)} is a command module missing from COMMANDS"
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in [*sorted((ROOT / "emoreward" / "cli").glob("*.py")), *sorted((ROOT / "tests").rglob("*.py"))]
        for line, strings in string_lists(path)
        if set(strings) >= set(COMMANDS)
    ]
    assert not offenders, f"hand-written lists of commands (read emoreward.cli.main.COMMANDS): {offenders}"


def test_backbones_are_read_from_their_registry():
    """No library module but the registry spells out every backbone of a kind in a list (a subset that picks a
    behaviour is fine), and the recipe's help texts name every registered backbone of their kind (they are built
    from `BACKBONES`)."""
    from emoreward.models.backbones import BACKBONES
    from emoreward.training.config import EmoRewardConfig

    kinds = {spec.kind for spec in BACKBONES.values()}
    every = {kind: {n for n, s in BACKBONES.items() if s.kind == kind} for kind in kinds}
    registry = ROOT / "emoreward" / "models" / "backbones.py"
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in FILES
        if path != registry
        for line, strings in string_lists(path)
        if any(set(strings) >= names for names in every.values())
    ]
    assert not offenders, f"hand-written lists of backbones (read emoreward.models.backbones.BACKBONES): {offenders}"
    helps = {f.name: f.metadata.get("help", "") for f in dataclasses.fields(EmoRewardConfig)}
    for name, spec in BACKBONES.items():
        assert name in helps["model_name_or_path" if spec.kind == "text" else "backbone"], name


def test_tie_models_and_wire_routes_are_read_from_their_registries():
    """No module of the library, the judges or the tests but the registries' own packages spells out every tie model
    (`emoreward.ranking.tie_models.TIE_MODELS`) or every wire route (paths or names, `emoreward.export.serve.routes.ROUTES`)
    in a list, set or dict: adding one is one file there (docs/development.md, "Extending")."""
    from emoreward.export.serve.routes import ROUTES
    from emoreward.ranking.tie_models import TIE_MODELS

    every = {
        "tie models (read emoreward.ranking.tie_models.TIE_MODELS)": (set(TIE_MODELS), "ranking/tie_models"),
        "route paths (read emoreward.export.serve.routes.ROUTES)": (set(ROUTES), "export/serve/routes"),
        "route names (read emoreward.export.serve.routes.ROUTES)": (
            {route.name for route in ROUTES.values()},
            "export/serve/routes",
        ),
    }
    files = [*FILES, *sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "zero_shot").rglob("*.py"))]
    for what, (names, home) in every.items():
        offenders = [
            f"{path.relative_to(ROOT)}:{line}"
            for path in files
            if home not in path.as_posix()
            for line, strings in string_lists(path, dict_keys=True)
            if set(strings) >= names
        ]
        assert not offenders, f"hand-written lists of {what}: {offenders}"

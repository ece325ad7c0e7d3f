"""Typed values from text, for recipes and command lines: one rule for a recipe YAML, `--field value` and
`--set field=value`, reading each value by its field's declared type, never by YAML's guessing. Imports no ML
library. See docs/training.md.
"""

from __future__ import annotations

import difflib
import enum
import json
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any


NULL_WORDS = ("null", "~")
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
# tokenizer special-token fields: not credentials
_TOKENIZER_TOKENS = {"pad_token", "eos_token", "bos_token", "unk_token", "sep_token", "cls_token", "mask_token"}
SECRET_HINT = "pass tokens and keys through the environment (e.g. HF_TOKEN, WANDB_API_KEY), never in a recipe or on the command line"


def is_secret_key(name: str) -> bool:
    """True for a field or key that holds a credential: `token`, `*_token` (not a tokenizer's `pad_token`,
    `eos_token`, ...), and names containing `api_key`, `apikey`, `secret` or `password`."""
    key = name.strip().lower().replace("-", "_")
    if key in _TOKENIZER_TOKENS:
        return False
    return (
        key == "token" or key.endswith("_token") or any(s in key for s in ("api_key", "apikey", "secret", "password"))
    )


class RecipeError(ValueError):
    """A recipe or command-line override that cannot be used; the message names the file (and line) or the option."""


def parse_value(hint: Any, text: str, name: str) -> Any:
    """Read `text` as a value of type `hint` (a field's resolved type annotation).

    Rules:
    - `null` or `~` is None where the field allows None (and an empty YAML value, `key:`); an empty command-line
      value is an error, never silently ignored;
    - booleans: `true/false`, `yes/no`, `on/off`, `1/0` (any case);
    - integers and floats as Python reads them (`3e-4`, `1_000`);
    - `Literal` fields: one of the listed strings; enum fields (transformers' `SaveStrategy`, `IntervalStrategy`,
      ...): one of the enum's values, even where the field is typed `Enum | str`;
    - lists: `[a, b]`, `a,b` or one item, each item read by the element type;
    - dicts: a JSON object.

    Args:
        hint: the field's type (`int`, `float | None`, `list[str] | None`, `Literal[...]`, an `Enum`, unions).
        text: the value as written (a YAML scalar's text, or a command-line string).
        name: the field, for the error message.

    Raises:
        ValueError: an empty value, or text the type cannot read (the message names the field and what it takes).
    """
    if text is None or str(text).strip() == "":
        raise ValueError(f"{name}: empty value; give a value{' or null' if _allows_none(hint) else ''}")
    text = str(text).strip()
    members = _members(hint)
    if text.lower() in NULL_WORDS:
        if type(None) in members:
            return None
        raise ValueError(f"{name}: null or an empty value, but this field takes {_type_name(hint)} (it has no null)")
    enums = [m for m in members if isinstance(m, type) and issubclass(m, enum.Enum)]
    if enums:  # `SaveStrategy | str`: the `str` is a typing convenience, the values are the enum's
        for kind in enums:
            for member in kind:
                if text == str(member.value) or text.lower() == str(member.value).lower():
                    return member
        allowed = [str(m.value) for kind in enums for m in kind]
        raise ValueError(f"{name}: {text!r} is not one of {allowed}")
    errors = []
    for member in sorted((m for m in members if m is not type(None)), key=_priority):
        try:
            return _parse_one(member, text, name)
        except ValueError as err:
            errors.append(str(err))
    raise ValueError(errors[0] if len(errors) == 1 else f"{name}: cannot read {text!r} as {_type_name(hint)}")


def _parse_one(kind: Any, text: str, name: str) -> Any:
    origin = typing.get_origin(kind)
    if kind is bool:
        low = text.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(f"{name}: {text!r} is not a boolean (true/false, yes/no, on/off, 1/0)")
    if kind is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{name} must be an integer, got {text!r}") from None
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{name} must be a number, got {text!r}") from None
    if origin is typing.Literal:
        for option in typing.get_args(kind):
            if isinstance(option, bool):
                if text.lower() in (_TRUE if option else _FALSE):
                    return option
            elif text == str(option):
                return option
        raise ValueError(f"{name}: {text!r} is not one of {list(typing.get_args(kind))}")
    if kind is list or origin is list:
        (element,) = typing.get_args(kind) or (str,)
        inner = text[1:-1] if text.startswith("[") and text.endswith("]") else text
        items = [item.strip().strip("'\"") for item in inner.split(",")] if inner.strip() else []
        if any(item == "" for item in items):
            raise ValueError(f"{name}: empty item in list {text!r}")
        return [parse_value(element, item, name) for item in items]
    if kind is dict or origin is dict:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, dict):
            raise ValueError(f'{name} must be a JSON object ({{"key": value}}), got {text!r}')
        return value
    if kind is str:
        return text
    raise ValueError(f"{name} cannot be set from text (type {_type_name(kind)}); set it in Python")


def parse_yaml_value(hint: Any, value: Any, name: str) -> Any:
    """A value YAML already built (a list or mapping in a recipe), with each scalar re-read by the field's type."""
    members = _members(hint)
    if isinstance(value, list):
        lists = [m for m in members if m is list or typing.get_origin(m) is list]
        if not lists:
            raise ValueError(f"{name} takes {_type_name(hint)}, got a list")
        (element,) = typing.get_args(lists[0]) or (str,)
        return [parse_value(element, _text(item, name), name) for item in value]
    if isinstance(value, dict):
        if not any(m is dict or typing.get_origin(m) is dict for m in members):
            raise ValueError(f"{name} takes {_type_name(hint)}, got a mapping")
        return value
    return parse_value(hint, _text(value, name), name)


def _text(value: Any, name: str) -> str:
    if isinstance(value, (dict, list)):
        raise ValueError(f"{name}: nested lists and mappings are not allowed here")
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def _members(hint: Any) -> tuple:
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return typing.get_args(hint)
    return (hint,)


def _allows_none(hint: Any) -> bool:
    return type(None) in _members(hint)


def _priority(kind: Any) -> int:
    # specific before general: `true` is a bool before a str, `8` an int before a float or a str
    order = [bool, int, float]
    if kind in order:
        return order.index(kind)
    origin = typing.get_origin(kind)
    if origin is typing.Literal:
        return 3
    if kind is dict or origin is dict:
        return 4
    if kind is list or origin is list:
        return 5
    return 6 if kind is str else 7


_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "text", type(None): "null"}


def _type_name(hint: Any) -> str:
    """What a field takes, in words: `int | Literal["auto"]` is "an integer or 'auto'" (not "Union")."""
    members = _members(hint)
    if len(members) > 1 or typing.get_origin(hint) is typing.Literal:
        words = []
        for member in members:
            if typing.get_origin(member) is typing.Literal:
                words.append(" or ".join(repr(v) for v in typing.get_args(member)))
            else:
                words.append(_WORDS.get(member) or _type_name(member))
        return " or ".join(words)
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


# ---------------------------------------------------------------------------------------------- recipe files
@dataclass
class RecipeEntry:
    """One top-level key of a recipe YAML: its value (the scalar's text, or the list / mapping YAML built), whether
    it was a scalar, and its 1-based line."""

    value: Any
    scalar: bool
    line: int


def read_recipe_file(path: str | Path) -> dict[str, RecipeEntry]:
    """The top-level keys of a recipe YAML (flat keys, as in the alignment-handbook), values not yet typed.

    Scalars keep their text (`no` stays `"no"`; the field's type reads it later); an empty or `null` value is
    `"null"`. Lists and mappings are built by YAML's safe loader.

    Raises:
        FileNotFoundError: no such file.
        RecipeError: not valid YAML ("<file>, line L, column C: <problem>"), not a mapping, a key given twice, or a
            credential (`hub_token`, `*_token`, `api_key`, `secret`: "<file>, line L: <key>: pass tokens ...").
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"recipe not found: {path}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        line_text = raw.split(b"\n")[line - 1].decode("utf-8", errors="replace")
        key = re.match(r"\s*([A-Za-z_][\w.-]*)\s*:", line_text)
        raise RecipeError(
            f"{path}, line {line}: {key.group(1) + ': ' if key else ''}undecodable bytes "
            f"{raw[err.start : err.end]!r} (a recipe is UTF-8 text; re-save it as UTF-8)"
        ) from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = " ".join(str(p) for p in (err.context, err.problem) if p)
        raise RecipeError(f"{path}{where}: not valid YAML: {problem}") from None
    except yaml.YAMLError as err:
        raise RecipeError(f"{path}: not valid YAML: {err}") from None
    if root is None:
        return {}
    if not isinstance(root, yaml.MappingNode):
        raise RecipeError(f"{path}, line {root.start_mark.line + 1}: a recipe is a mapping of keys to values")
    entries: dict[str, RecipeEntry] = {}
    for key_node, value_node in root.value:
        line = key_node.start_mark.line + 1
        if not isinstance(key_node, yaml.ScalarNode):
            raise RecipeError(f"{path}, line {line}: a recipe key must be a name")
        key = key_node.value
        if key in entries:
            raise RecipeError(f"{path}, line {line}: key {key!r} is given twice (first on line {entries[key].line})")
        if is_secret_key(key):
            raise RecipeError(f"{path}, line {line}: {key}: {SECRET_HINT}")
        if isinstance(value_node, yaml.ScalarNode):
            plain_null = value_node.style is None and value_node.tag == "tag:yaml.org,2002:null"
            entries[key] = RecipeEntry("null" if plain_null else value_node.value, True, line)
        else:
            value = yaml.safe_load(yaml.serialize(value_node))
            entries[key] = RecipeEntry(value, False, line)
    return entries


def split_override(item: str) -> tuple[str, str]:
    """`KEY=VALUE` from `--set` into (key, value text); the value is typed later by the field.

    Raises:
        RecipeError: no `=`, no key, or a credential.
    """
    if "=" not in item:
        raise RecipeError(f"--set expects KEY=VALUE, got {item!r}")
    key, value = item.split("=", 1)
    key = key.strip()
    if not key:
        raise RecipeError(f"--set expects KEY=VALUE, got {item!r}")
    if is_secret_key(key):
        raise RecipeError(f"--set {key}=...: {SECRET_HINT}")
    return key, value


def unknown_key_message(keys: str | list[str], known: list[str]) -> str:
    """ "unknown key(s) ['lr'] (did you mean 'learning_rate'?)" for keys that are not fields."""
    keys = [keys] if isinstance(keys, str) else sorted(keys)
    guesses = {k: difflib.get_close_matches(k, known, n=1) for k in keys}
    hints = [f"{k!r} -> {g[0]!r}" for k, g in guesses.items() if g]
    if len(keys) == 1 and hints:  # one key: name the guess alone, without repeating the typo
        hints = [repr(guesses[keys[0]][0])]
    return f"unknown key(s) {keys}" + (f" (did you mean {', '.join(hints)}?)" if hints else "")


__all__ = [
    "NULL_WORDS",
    "SECRET_HINT",
    "RecipeEntry",
    "RecipeError",
    "is_secret_key",
    "parse_value",
    "parse_yaml_value",
    "read_recipe_file",
    "split_override",
    "unknown_key_message",
]

"""The registry holds the parser, the routes and the relation modules together: every command of `COMMANDS` and
every option of its real parser, every route and parameter, resolves to relations or a reason; every registered
(command, option, relation) is exercised by that relation's module (its ``COVERS``); nothing is covered that is not
registered. A relation module that does not exist yet is skipped, with its name, until it does."""

from __future__ import annotations

import importlib
import importlib.util

import pytest
from registry import REGISTRY, RELATIONS, ROUTES, option_key, options_of


def names() -> list[str]:
    from emoreward.cli.main import COMMANDS

    return [*COMMANDS, *ROUTES]


def relation_module(relation: str):
    name = RELATIONS[relation]
    if importlib.util.find_spec(name) is None:
        return None
    return importlib.import_module(name)


def test_every_command_and_route_is_registered():
    missing = [n for n in names() if n not in REGISTRY]
    assert not missing, (
        f"commands or routes with no registry entry: {missing} (add them to tests/relations/registry.py)"
    )
    unknown = [n for n in REGISTRY if n not in names()]
    assert not unknown, f"registry entries that are neither a command of COMMANDS nor a route of ROUTES: {unknown}"


@pytest.mark.parametrize("name", names())
def test_every_option_resolves(name):
    unresolved = [o for o in options_of(name) if option_key(name, o) is None]
    assert not unresolved, (
        f"{name}: options with no relations and no reason in tests/relations/registry.py: {unresolved}"
    )
    keys = set(options_of(name)) | {option_key(name, o) for o in options_of(name)}
    stale = [k for k in REGISTRY[name] if k not in keys]
    assert not stale, f"{name}: registry keys that are no option (or group) of it any more: {stale}"


@pytest.mark.parametrize("name", names())
def test_relations_are_known(name):
    for key, entry in REGISTRY[name].items():
        if isinstance(entry, str):
            assert entry.strip(), f"{name} {key}: an empty reason"
            continue
        assert entry, f"{name} {key}: no relations (give a reason string instead)"
        unknown = [r for r in entry if r not in RELATIONS]
        assert not unknown, f"{name} {key}: unknown relations {unknown}; known: {sorted(RELATIONS)}"


@pytest.mark.parametrize("relation", list(RELATIONS))
def test_registered_options_are_covered(relation):
    module = relation_module(relation)
    if module is None:
        pytest.skip(f"tests/relations/{RELATIONS[relation]}.py does not exist yet (its owner adds it)")
    covers = getattr(module, "COVERS", None)
    assert isinstance(covers, dict), f"{RELATIONS[relation]}.py declares no COVERS dict"
    wanted = {
        (name, key)
        for name, entries in REGISTRY.items()
        for key, entry in entries.items()
        if not isinstance(entry, str) and relation in entry
    }
    given = {(name, key) for name, keys in covers.items() for key in keys}
    uncovered = sorted(wanted - given)
    assert not uncovered, f"{relation}: registered but not exercised by {RELATIONS[relation]}.py: {uncovered}"
    unregistered = sorted(given - wanted)
    assert not unregistered, (
        f"{relation}: {RELATIONS[relation]}.py covers what the registry does not give it: {unregistered} "
        "(register them in tests/relations/registry.py)"
    )

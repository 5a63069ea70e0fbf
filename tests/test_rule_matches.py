"""A rule that fixes hands its fixer a typed match (graphlint.rule.Match): the fields the fixer reads are the
fields the rule fills, so that a misspelt name fails here, not as an empty answer at fix time."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
from typing import Generic

import pytest

from graphlint.engine import load_rules
from graphlint.rule import LazyFixer, Match, Matched


@dataclasses.dataclass(frozen=True)
class Pair(Match, Generic[Matched]):
    first: Matched
    second: Matched | None = None
    steps: tuple[Matched, ...] = ()


def test_a_match_resolves_each_node_and_keeps_its_type():
    match = Pair("a", "b", ("c", "d", "e"))
    resolved = match.resolved(lambda name, node: None if node in ("b", "d") else f"{name}:{node}")
    assert resolved == Pair("first:a", None, ("steps:c", "steps:e"))
    assert list(Pair("a", steps=("c",)).nodes()) == [("first", "a"), ("steps", "c")]


def test_a_misspelt_field_is_an_error_not_an_empty_answer():
    with pytest.raises(AttributeError):
        Pair("a").frist  # noqa: B018


def _matches_of(module) -> list[type[Match]]:
    return [value for value in vars(module).values() if isinstance(value, type) and issubclass(value, Match)
            and value.__module__ == module.__name__]


def fields_read(source: str) -> set[str]:
    """The attributes read from a site's match in a fixer's source: `site.match.root`, `s.match.centred`."""
    return {node.attr for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "match"}


def test_fields_read_are_found():
    assert fields_read("def f(site):\n    return site.match.root.node, other.match.centred\n") == {"root", "centred"}


TYPED = ("GL105", "GL106", "GL107", "GL201", "GL204")


@pytest.mark.parametrize("rule", [r for r in load_rules() if r.id in TYPED], ids=lambda r: r.id)
def test_each_fixer_reads_only_fields_of_its_rules_match(rule):
    module = sys.modules[rule.__module__]
    fixers = [value for value in vars(module).values() if isinstance(value, LazyFixer)]
    read = set().union(*(fields_read(inspect.getsource(inspect.getmodule(f.function))) for f in fixers))
    declared = {field.name for match in _matches_of(module) for field in dataclasses.fields(match)}
    assert fixers and read <= declared, (rule.id, sorted(read - declared))
    if read:  # a rule whose fixer reads the match gives one with every problem that has a fix
        assert _matches_of(module)

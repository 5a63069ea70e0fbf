"""The rule engine: find the rules in `graphlint.rules` (the top-level `rules/` folder) and in the rule plugins'
entry points (graphlint.plugins), and run them."""

from __future__ import annotations

import functools
import importlib
import pkgutil
import traceback
from types import ModuleType
from typing import TYPE_CHECKING

from graphlint import catalog, plugins
from graphlint.errors import UsageError, one_line
from graphlint.results import Finding, TargetError
from graphlint.rule import Rule, anatomy_problems

if TYPE_CHECKING:  # listing the rules imports neither: they import torch
    from graphlint.capture import Capture
    from graphlint.locate.place import Locator


def load_rules() -> tuple[type[Rule], ...]:
    """Every rule, built-in and from plugins, by ID. An incomplete built-in rule is a bug in graphlint: it fails
    loudly; a plugin that cannot be imported, or whose rule is incomplete or reuses an ID, is a `UsageError` that
    names its entry point and distribution."""
    return tuple(rule for rule, _ in _loaded())


def listed_rules() -> tuple[type[Rule], ...]:
    """Every rule as `load_rules` gives it, for what reads only their metadata (`graphlint rules`, `graphlint rule
    ID`, a session's rule list): the built-in rules are read from their source (graphlint.catalog), so that
    listing them imports no torch; the plugins' are imported, with the same errors."""
    return tuple(rule for rule, _ in _listed())


def builtin_rules() -> tuple[type[Rule], ...]:
    """graphlint's own rules, by ID: the ones its generated references document (read from their source)."""
    return tuple(rule for rule, origin in _listed() if not origin)


def rule_origin(rule: type[Rule]) -> str:
    """The distribution a plugin's rule comes from (`graphlint-extra-rules 0.1`); empty for a built-in rule."""
    return next((origin for loaded, origin, _ in _plugin_rules_found() if loaded is rule), "")


@functools.lru_cache(maxsize=1)
def _loaded() -> tuple[tuple[type[Rule], str], ...]:
    """(rule, origin) by ID; the origin is empty for a built-in rule (an error raised here is not cached)."""
    import graphlint.rules as package

    builtin = [rule for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name)
               for rule in catalog.defined_rules(importlib.import_module(f"{package.__name__}.{info.name}"))]
    return _with_plugins(builtin)


@functools.lru_cache(maxsize=1)
def _listed() -> tuple[tuple[type[Rule], str], ...]:
    return _with_plugins(catalog.builtin_rules())


def _with_plugins(builtin: list[type[Rule]]) -> tuple[tuple[type[Rule], str], ...]:
    """The built-in rules, checked, and the plugins' beside them, by ID."""
    found: dict[str, tuple[type[Rule], str]] = {}
    for value in builtin:
        problems = anatomy_problems(value)
        if problems:
            raise RuntimeError(f"rule {value.__name__} in {value.__module__} is incomplete: {'; '.join(problems)}")
        if value.id in found:
            raise RuntimeError(f"rule ID {value.id} is used by {found[value.id][0].__name__} and {value.__name__}")
        found[value.id] = (value, "")
    for value, origin, where in _plugin_rules_found():
        if value.id in found and found[value.id][0] is not value:
            other, origin_before = found[value.id]
            owner = f"the rule plugin {origin_before}" if origin_before else "graphlint's built-in rule"
            raise UsageError(f"{where} uses the ID {value.id}, which {owner} {other.__module__}.{other.__qualname__} "
                             f"({other.name}) has; a plugin's rules need IDs of their own")
        found[value.id] = (value, origin)
    return tuple(found[rule_id] for rule_id in sorted(found))


@functools.lru_cache(maxsize=1)
def _plugin_rules_found() -> tuple[tuple[type[Rule], str, str], ...]:
    """(rule, its distribution, how an error names it) of every plugin's rule, each checked for its anatomy."""
    found = []
    for entry in plugins.entry_points():
        for value in _plugin_rules(entry):
            where = f"rule {value.__module__}.{value.__qualname__} of the {plugins.described(entry)}"
            problems = anatomy_problems(value)
            if problems:
                raise UsageError(f"{where} is incomplete: {'; '.join(problems)}")
            found.append((value, plugins.distribution(entry), where))
    return tuple(found)


def _plugin_rules(entry) -> list[type[Rule]]:
    """The rules an entry point names: a module's own Rule subclasses, or one Rule subclass."""
    try:
        loaded = entry.load()
    except Exception as error:  # the plugin's own failure, in one line: it is not graphlint's to show a traceback of
        raise UsageError(f"the rule plugin {plugins.described(entry)} cannot be imported: {one_line(error)}") from None
    rules = catalog.defined_rules(loaded) if isinstance(loaded, ModuleType) else (
        [loaded] if isinstance(loaded, type) and issubclass(loaded, Rule) and loaded is not Rule else [])
    if not rules:
        raise UsageError(f"the rule plugin {plugins.described(entry)} names neither a module that defines a "
                         "graphlint.rule.Rule subclass nor such a class")
    return rules


def rule_by_id(rule_id: str) -> type[Rule] | None:
    """The rule with this ID (any case), imported, as `load_rules` gives it: one that can check a capture; None
    when there is none."""
    return next((rule for rule in load_rules() if rule.id == rule_id.upper()), None)


def described_rule(rule_id: str) -> type[Rule] | None:
    """The rule with this ID (any case), as `listed_rules` gives it: its metadata and docs, read without importing
    torch (it may have no `check`); None when there is none."""
    return next((rule for rule in listed_rules() if rule.id == rule_id.upper()), None)


def run_rules(
    rules: tuple[type[Rule], ...], capture: Capture, locator: Locator, debug: bool = False
) -> tuple[list[Finding], list[TargetError]]:
    """Every rule over one capture. A rule whose detection crashes is reported as a tool error; the others still
    run. What fails after detection (spans, fixes) costs no finding: the locator keeps it in `failures`."""
    findings: list[Finding] = []
    errors: list[TargetError] = []
    for rule in sorted(rules, key=lambda rule: rule.reads_findings):  # stable: ID order otherwise
        try:
            problems = list(rule().check(capture, tuple(findings)) if rule.reads_findings else rule().check(capture))
        except Exception as error:
            if debug:
                traceback.print_exc()
            errors.append(TargetError(capture.target, f"internal error in rule {rule.id} ({one_line(error)}); "
                                                      "please report it with the output of --debug"))
            continue
        findings.extend(locator.place(rule, problems, capture))
    return sorted(findings, key=Finding.sort_key), errors

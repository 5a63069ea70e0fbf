"""The rule engine: find the rules in `graphlint.rules` (the top-level `rules/` folder) and run them."""

from __future__ import annotations

import functools
import importlib
import pkgutil
import traceback

from graphlint.capture import Capture
from graphlint.config import Config
from graphlint.errors import UsageError, one_line
from graphlint.locate import Locator
from graphlint.results import Finding, TargetError
from graphlint.rule import Rule, anatomy_problems


@functools.lru_cache(maxsize=1)
def load_rules() -> tuple[type[Rule], ...]:
    """Every rule class in the rules package, by ID. An incomplete rule is a bug in graphlint: it fails loudly."""
    import graphlint.rules as package

    found: dict[str, type[Rule]] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Rule) and value.__module__ == module.__name__:
                problems = anatomy_problems(value)
                if problems:
                    raise RuntimeError(f"rule {value.__name__} in {module.__name__} is incomplete: {'; '.join(problems)}")
                if value.id in found:
                    raise RuntimeError(f"rule ID {value.id} is used by {found[value.id].__name__} and {value.__name__}")
                found[value.id] = value
    return tuple(found[rule_id] for rule_id in sorted(found))


def rule_by_id(rule_id: str) -> type[Rule] | None:
    return next((rule for rule in load_rules() if rule.id == rule_id.upper()), None)


def select_rules(config: Config) -> tuple[type[Rule], ...]:
    """The rules a configuration turns on: `select` (or the default set), plus `extend-select`, minus
    `ignore`. A selector is `ALL`, a rule ID or an ID prefix (`GL1`, `GL20`)."""
    rules = load_rules()
    chosen = _expand(config.select, "select", rules) if config.select is not None else {
        rule.id for rule in rules if rule.default_enabled}
    chosen |= _expand(config.extend_select, "extend-select", rules)
    chosen -= _expand(config.ignore, "ignore", rules)
    for codes in config.per_file_ignores.values():
        _expand(codes, "per-file-ignores", rules)  # checked, applied later per file
    _expand(tuple(config.severity), "severity", rules)
    return tuple(rule for rule in rules if rule.id in chosen)


def _expand(selectors, option: str, rules) -> set[str]:
    ids = set()
    for selector in selectors:
        key = selector.strip().upper()
        matched = {rule.id for rule in rules if key == "ALL" or rule.id.startswith(key)}
        if not matched:
            known = ", ".join(rule.id for rule in rules)
            raise UsageError(f"{option}: {selector!r} matches no rule; rule IDs are {known} (or a prefix, or ALL)")
        ids |= matched
    return ids


def run_rules(
    rules: tuple[type[Rule], ...], capture: Capture, locator: Locator, debug: bool = False
) -> tuple[list[Finding], list[TargetError]]:
    """Every rule over one capture. A rule that crashes is reported as a tool error; the others still run."""
    findings: list[Finding] = []
    errors: list[TargetError] = []
    for rule in rules:
        try:
            findings.extend(locator.place(rule, rule().check(capture), capture))
        except Exception as error:
            if debug:
                traceback.print_exc()
            errors.append(TargetError(capture.target, f"internal error in rule {rule.id} ({one_line(error)}); "
                                                      "please report it with the output of --debug"))
    return sorted(findings, key=Finding.sort_key), errors

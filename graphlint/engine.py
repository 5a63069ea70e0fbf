"""The rule engine: find the rules in `graphlint.rules` (the top-level `rules/` folder) and run them."""

from __future__ import annotations

import functools
import importlib
import pkgutil
import traceback

from graphlint.capture import Capture
from graphlint.errors import one_line
from graphlint.locate.place import Locator
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

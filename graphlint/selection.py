"""Which rules a configuration turns on. Works on anything with `id` and `default_enabled` (rule classes, or
the `RuleInfo`s a cached run has), so that choosing rules never needs torch."""

from __future__ import annotations

from graphlint.config import Config
from graphlint.errors import UsageError


def select(config: Config, rules):
    """The rules of `select` (or the default set), plus `extend-select`, minus `ignore`. A selector is `ALL`,
    a rule ID or an ID prefix (`GL1`, `GL20`); one that matches no rule is an error naming it."""
    chosen = _expand(config.select, "select", rules) if config.select is not None else {
        rule.id for rule in rules if rule.default_enabled}
    chosen |= _expand(config.extend_select, "extend-select", rules)
    chosen -= _expand(config.ignore, "ignore", rules)
    for codes in config.per_file_ignores.values():
        _expand(codes, "per-file-ignores", rules)  # checked here, applied per file by the policy stage
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

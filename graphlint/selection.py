"""Which rules a configuration turns on, with ruff's semantics. Works on anything with `id` and
`default_enabled` (rule classes, or the `RuleInfo`s a cached run has), so that choosing rules never needs torch.

The selection is resolved in layers, lowest priority first: the default set, `[tool.graphlint]`, the command
line. The highest-priority layer that has a `select` starts the resolution (lower layers' modifiers are
dropped: `--select GL101` runs GL101 whatever the pyproject ignores); each later layer then adjusts the set
with its `extend-select` and `ignore`. Within a layer the more specific selector wins (`GL101` over `GL1`
over `ALL`); between a select and an ignore of equal specificity, the ignore wins.
"""

from __future__ import annotations

from graphlint.config import Config, RuleSelection
from graphlint.errors import UsageError


def select(config: Config, rules):
    """The rules the configuration's layers turn on, in the order of `rules`. A selector is `ALL`, a rule ID or
    an ID prefix (`GL1`, `GL20`); one that matches no rule is an error naming it."""
    layers = [config.file_selection, *([config.command_line] if config.command_line else [])]
    for layer in layers:
        _check(layer.select or (), "select", rules)
        _check(layer.extend_select, "extend-select", rules)
        _check(layer.ignore, "ignore", rules)
    for codes in config.per_file_ignores.values():
        _check(codes, "per-file-ignores", rules)  # checked here, applied per file by the policy stage
    _check(tuple(config.severity), "severity", rules)
    starts = [index for index, layer in enumerate(layers) if layer.select is not None]
    # A target meant for DDP turns on the rules about DDP (GL402), as if they were on by default.
    chosen = {rule.id for rule in rules if rule.default_enabled or config.distributed in getattr(rule, "tags", ())}
    for layer in layers[starts[-1] if starts else 0:]:
        chosen = _apply(layer, chosen, rules)
    return tuple(rule for rule in rules if rule.id in chosen)


def _apply(layer: RuleSelection, carried: set[str], rules) -> set[str]:
    """One layer's adjustment: a `select` replaces what came before; then the most specific selector decides."""
    enabling = (*(layer.select or ()), *layer.extend_select)
    chosen = set() if layer.select is not None else set(carried)
    for rule in rules:
        on = _specificity(enabling, rule.id)
        off = _specificity(layer.ignore, rule.id)
        if on is None and off is None:
            continue
        if off is None or (on is not None and on > off):
            chosen.add(rule.id)
        else:
            chosen.discard(rule.id)
    return chosen


def _specificity(selectors, rule_id: str) -> int | None:
    """How specifically the best of `selectors` names `rule_id` (ALL 0, a prefix its length); None if none does."""
    best = None
    for selector in selectors:
        key = selector.strip().upper()
        score = 0 if key == "ALL" else len(key) if rule_id.startswith(key) else None
        if score is not None and (best is None or score > best):
            best = score
    return best


def _check(selectors, option: str, rules) -> None:
    for selector in selectors:
        key = selector.strip().upper()
        if not any(key == "ALL" or rule.id.startswith(key) for rule in rules):
            known = ", ".join(rule.id for rule in rules)
            raise UsageError(f"{option}: {selector!r} matches no rule; rule IDs are {known} (or a prefix, or ALL)")

"""One target in its own process, for `-j N` and `--timeout`: a crash or a hang loses only that target.

    python -m graphlint.worker REQUEST.json RESULT.json

The request names the target, the project and the configuration; the result is the target's
TargetResult as JSON. The parent process reads it, or reports the crash or timeout as that target's error.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from graphlint.config import Config, RuleSelection
from graphlint.project import Project


def request(target: str, base: Path, project: Project, config: Config, rules: tuple[str, ...], debug: bool) -> dict:
    return {
        "target": target,
        "base": str(base),
        "root": str(project.root),
        "first_party_folders": [str(f) for f in project.first_party_folders],
        "config": {k: v for k, v in dataclasses.asdict(config).items() if k != "source"},
        "rules": list(rules),
        "debug": debug,
    }


def _config(data: dict) -> Config:
    return Config(**{
        **data,
        "targets": tuple(data["targets"]),
        "select": tuple(data["select"]) if data["select"] is not None else None,
        "extend_select": tuple(data["extend_select"]),
        "ignore": tuple(data["ignore"]),
        "per_file_ignores": {glob: tuple(codes) for glob, codes in data["per_file_ignores"].items()},
        "command_line": _selection(data["command_line"]),
    })


def _selection(data: dict | None) -> RuleSelection | None:
    if data is None:
        return None
    return RuleSelection(tuple(data["select"]) if data["select"] is not None else None,
                         tuple(data["extend_select"]), tuple(data["ignore"]))


def main(request_path: str, result_path: str) -> int:
    from graphlint.engine import load_rules
    from graphlint.locate.place import Locator
    from graphlint.pipeline import lint_target

    data = json.loads(Path(request_path).read_text(encoding="utf-8"))
    project = Project(root=Path(data["root"]), first_party_folders=[Path(f) for f in data["first_party_folders"]])
    config = _config(data["config"])
    rules = tuple(rule for rule in load_rules() if rule.id in set(data["rules"]))
    result = lint_target(data["target"], Path(data["base"]), Locator(project), rules, config.device, data["debug"])
    Path(result_path).write_text(json.dumps(dataclasses.asdict(result), default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))

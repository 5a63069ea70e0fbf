"""The child process that lints one target: the per-target pipeline, with its stages and its result sent to the
run over a one-way pipe.

Messages, in order: `{"stage": NAME}` as the lint goes (graphlint.stages), then one
`{"result": <graphlint.results wire format>, "imported": [top-level names of installed libraries it imported]}`.
A child that exits without sending a result has died; the run reports how, with the last stage it saw.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from graphlint import stages
from graphlint.files import is_installed_file
from graphlint.results import TargetError, TargetResult, to_wire


def request(target: str, base: Path, project, device: str, rules: tuple[str, ...], debug: bool,
            vary: tuple[str, ...] = ("batch",)) -> dict:
    """What a child needs to lint one target; plain data, so that a spawned child can receive it too. `vary` is
    the target's setting for the torch.compile analysis (graphlint.capture.compile.analyse_target)."""
    return {
        "target": target,
        "base": str(base),
        "root": str(project.root),
        "first_party_folders": [str(f) for f in project.first_party_folders],
        "device": device,
        "rules": list(rules),
        "debug": debug,
        "vary": list(vary),
    }


def child_main(request: dict, connection) -> None:
    """Lint the requested target and send its result (the entry point of every child process)."""
    for descriptor in request.get("close_fds", ()):  # the parent's own pipes are none of the target's business
        try:
            os.close(descriptor)
        except OSError:
            pass
    os.dup2(2, 1)  # everything the model prints, Python or native, goes to stderr: stdout carries the report
    if request.get("single_threaded"):
        import torch

        torch.set_num_threads(1)  # the parent's OpenMP pool did not survive the fork (see graphlint.run.parent)
    # A model file that parses arguments at import (argparse with defaults) sees its own name, not graphlint's
    # command line.
    sys.argv = [request["target"].rpartition(":")[0] or request["target"]]
    before = set(sys.modules)
    last = ["import"]

    def tell(stage: str) -> None:
        last[0] = stage
        connection.send({"stage": stage})

    stages.listen(tell)
    try:
        result = _lint(request)
    except SystemExit as leaving:  # sys.exit() in the user's code (argparse at module level, often)
        result = TargetResult(target=request["target"], errors=[TargetError(request["target"], _exited(leaving, last[0]))])
    connection.send({"result": to_wire(result), "imported": _installed_libraries(set(sys.modules) - before)})
    connection.close()


def _lint(request: dict) -> TargetResult:
    from graphlint.engine import load_rules
    from graphlint.locate.place import Locator
    from graphlint.pipeline import lint_target
    from graphlint.project import Project

    project = Project(root=Path(request["root"]), first_party_folders=[Path(f) for f in request["first_party_folders"]])
    rules = tuple(rule for rule in load_rules() if rule.id in set(request["rules"]))
    return lint_target(request["target"], Path(request["base"]), Locator(project), rules, request["device"],
                       request["debug"], tuple(request["vary"]))


def _exited(leaving: SystemExit, stage: str) -> str:
    code = leaving.code if leaving.code is not None else 0
    advice = ("guard a script's own code with `if __name__ == \"__main__\":` so that importing it does not run it"
              if stage == "import" else "a model's code must return, not exit the process")
    return f"the target called sys.exit({code!r}) during the {stage}; {advice}"


def _installed_libraries(names: set[str]) -> list[str]:
    """The top-level names of the installed libraries (never project files) among newly imported modules."""
    found = set()
    for name in names:
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if "." not in name and not name.startswith("_") and isinstance(path, str) and is_installed_file(path):
            found.add(name)
    return sorted(found)

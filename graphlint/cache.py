"""The result cache: a target whose inputs did not change is not captured again, and torch is not imported.

    <cache dir>/.gitignore                 "*", so the folder is never committed
    <cache dir>/v2/rules-<code>.json       the rules' metadata, for reports that need no rule classes
    <cache dir>/v2/targets/<key>.json      one target's result and the files it depends on
    <cache dir>/v2/reports/<key>.json      one target's `graphlint graph` report or `graphlint memory` estimate, alike
    <cache dir>/v2/compile-<code>/          torch.compile analyses kept across runs (graphlint.capture.compile_memo)

A target's key covers graphlint's version and code (and the rule plugins': graphlint.plugins), torch's version,
Python's version, the project root, the target, and the settings that change what a capture finds: the device,
the rules that run and, for the torch.compile rules, the input dimensions they vary. Settings applied after the
capture (severities, fail-on, per-file ignores, suppressions, the baseline) are not in it: changing them
re-reports the cached findings. A graph or memory report's key covers the same versions, the project root and
folders, the target and the options of its job that change the answer (graphlint.run.wire), a memory job's CPU
threads by what torch's thread count follows (graphlint.run.wire.thread_settings); the picture's and the output's
options are not in it, and a report from the cache is rendered without torch. The entry is used only when every
file the capture ran or imported from the project (or from a library installed from a local path) still has the
content hash recorded in it, and every installed distribution it loaded is still installed at the recorded version
(graphlint.libraries). Unreadable or corrupt cache files are ignored; writing the cache never fails a run. Files
the model reads with open() are not tracked: use --no-cache after changing them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Collection
from pathlib import Path

import graphlint
import graphlint.plugins as graphlint_plugins
from graphlint.libraries import installed_version
from graphlint.project import Project
from graphlint.results import RuleInfo, Severity, TargetResult, from_wire, to_wire
from graphlint.tags import BUDGET_TAG, COMPILE_TAG

VERSION = 2
DEFAULT_FOLDER = ".graphlint_cache"


def default_folder(project: Project, option: str | None) -> Path:
    """--cache-dir, else $GRAPHLINT_CACHE_DIR, else .graphlint_cache in the project root."""
    chosen = option or os.environ.get("GRAPHLINT_CACHE_DIR")
    return Path(chosen) if chosen else project.root / DEFAULT_FOLDER


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_digest(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return _digest(handle.read())
    except OSError:
        return None


def _code_digest() -> str:
    """graphlint's own code and rules: a change to them (in a development install) invalidates results."""
    folders = [Path(graphlint.__file__).parent]
    spec = importlib.util.find_spec("graphlint.rules")
    folders += [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    digest = hashlib.sha256(graphlint.__version__.encode())
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _rules_digest(code: str) -> str:
    """graphlint's code and the installed rule plugins' (graphlint.plugins): adding, removing, upgrading or editing
    a plugin invalidates results and the rules' metadata. Without plugins, graphlint's code digest as it is."""
    plugins = graphlint_plugins.digest()
    return hashlib.sha256(f"{code}\n{plugins}".encode()).hexdigest()[:16] if plugins else code


def _torch_version() -> str:
    try:
        return importlib.metadata.version("torch")  # read from the installed metadata: no import
    except importlib.metadata.PackageNotFoundError:
        return "none"


class ResultCache:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._graphlint_code = _code_digest()
        self._code = _rules_digest(self._graphlint_code)

    def key(self, target: str, base: Path, project: Project, device: str, rules: tuple[str, ...],
            vary: tuple[str, ...] = (), memory_budget: int | None = None, tags: Collection[str] = (),
            cost_gpu: str | None = None, cost_cpu: str | None = None) -> str:
        """The key of one target's entry; `rules` are the IDs of the rules that run on its capture and `tags` their
        tags (graphlint.tags), which say whether `vary`, the input dimensions the torch.compile analysis grows, and
        `memory_budget` change what the capture finds; `cost_gpu` the GPU the findings are priced on, `cost_cpu` the
        CPU (its model)."""
        fields = {
            "graphlint": self._code,
            "torch": _torch_version(),
            "python": sys.version,
            "root": str(project.root),
            "base": str(base),
            "pythonpath": [str(folder) for folder in project.pythonpath],  # other folders, other imported code
            "target": target,
            "device": device,
            "rules": sorted(rules),
            "vary": list(vary) if COMPILE_TAG in tags else [],
            "memory_budget": memory_budget if BUDGET_TAG in tags else None,
            **({"cost_gpu": cost_gpu} if cost_gpu is not None else {}),  # absent: the keys made before it stay
            **({"cost_cpu": cost_cpu} if cost_cpu is not None else {}),
        }
        return _digest(json.dumps(fields, sort_keys=True, default=str).encode())[:32]

    def job_key(self, kind: str, job: dict) -> str:
        """The key of a graph or memory job's entry (`graphlint graph`, `graphlint memory`): graphlint's, torch's
        and Python's versions, the kind of job and the fields of it that the session names: the project's root,
        base and import folders, the target and every option that changes the answer."""
        fields = {"graphlint": self._code, "torch": _torch_version(), "python": sys.version, "job": kind, **job}
        return _digest(json.dumps(fields, sort_keys=True, default=str).encode())[:32]

    def compile_folder(self) -> str:
        """Where the children keep torch.compile analyses across runs: a target whose file changed outside its
        model is captured again but not compiled again."""
        return str(self.folder / f"v{VERSION}" / f"compile-{self._graphlint_code}")  # no rule reads it, plugins neither

    # -- targets --------------------------------------------------------------------------------------------

    def load(self, key: str) -> TargetResult | None:
        entry = self._entry("targets", key)
        try:
            return None if entry is None else from_wire(entry["result"])
        except (KeyError, TypeError, ValueError):
            return None  # a corrupt entry is a miss

    def store(self, key: str, result: TargetResult) -> None:
        self._store_entry("targets", key, result, {})

    # -- graph and memory reports ---------------------------------------------------------------------------

    def load_report(self, key: str) -> tuple[TargetResult, dict] | None:
        """A job's result and its report as plain data, when nothing they depend on changed."""
        entry = self._entry("reports", key)
        try:
            return None if entry is None else (from_wire(entry["result"]), dict(entry["report"]))
        except (KeyError, TypeError, ValueError):
            return None

    def store_report(self, key: str, result: TargetResult, report: dict) -> None:
        self._store_entry("reports", key, result, {"report": report})

    def _entry(self, kind: str, key: str) -> dict | None:
        """The entry, when every file and library it depends on is as it was recorded."""
        entry = self._read(self.folder / f"v{VERSION}" / kind / f"{key}.json")
        try:
            if entry is None or any(file_digest(path) != digest for path, digest in entry["inputs"].items()):
                return None
            if any(installed_version(name) != version for name, version in entry["libraries"].items()):
                return None  # a library was upgraded, downgraded or removed since
            return entry
        except (KeyError, TypeError, ValueError, AttributeError):
            return None  # a corrupt entry is a miss

    def _store_entry(self, kind: str, key: str, result: TargetResult, extra: dict) -> None:
        inputs = {path: file_digest(path) for path in result.inputs}
        if any(digest is None for digest in inputs.values()):
            return  # an input vanished: nothing reliable to store
        self._write(self.folder / f"v{VERSION}" / kind / f"{key}.json",
                    {"inputs": inputs, "libraries": result.libraries, "result": to_wire(result), **extra})

    # -- rules ----------------------------------------------------------------------------------------------

    def rule_infos(self) -> tuple[RuleInfo, ...] | None:
        data = self._read(self.folder / f"v{VERSION}" / f"rules-{self._code}.json")
        try:
            return None if data is None else tuple(
                RuleInfo(**{**info, "severity": Severity(info["severity"]), "tags": tuple(info["tags"])})
                for info in data)
        except (KeyError, TypeError, ValueError):
            return None

    def store_rule_infos(self, infos: tuple[RuleInfo, ...]) -> None:
        self._write(self.folder / f"v{VERSION}" / f"rules-{self._code}.json", [dataclasses.asdict(i) for i in infos])

    # -- files ----------------------------------------------------------------------------------------------

    def _read(self, path: Path):
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            return None

    def _write(self, path: Path, data) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            ignore = self.folder / ".gitignore"
            if not ignore.exists():
                ignore.write_text("# graphlint's result cache; safe to delete\n*\n", encoding="utf-8")
            handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(handle, "w", encoding="utf-8") as stream:
                json.dump(data, stream, default=str)
            os.replace(temporary, path)  # readers never see half a file
        except OSError:
            pass  # a cache that cannot be written is only a slower next run

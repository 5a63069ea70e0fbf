"""The `[tool.graphlint]` table of pyproject.toml, checked, and the command-line options that override it.

    [tool.graphlint]
    targets = ["models/gpt.py:make_model",                  # a factory
               { model = "pkg/net.py:Net", inputs = ["float32[2,3,32,32]"], kwargs = { depth = 2 } }]
    device = "auto"                      # auto, meta, cpu or cuda
    select = ["GL1", "GL2"]              # rule IDs or prefixes; "ALL" for every rule (default: the default set)
    extend-select = ["GL901"]            # added to select
    ignore = ["GL203"]                   # removed from the selection
    per-file-ignores = { "legacy/*.py" = ["GL101"] }
    fail-on = "warning"                  # note, warning, error or never
    timeout = 600                        # seconds per target; 0 for no limit
    memory-budget = "24GiB"              # GL401: a training step's peak memory must stay under it
    distributed = "ddp"                  # how the target is trained: none or ddp (turns GL402 on)
    pythonpath = ["src"]                 # folders targets import from (default: pytest's pythonpath setting)
    [tool.graphlint.severity]
    GL203 = "warning"                    # per-rule severity

Every problem is one `UsageError` line that names the file, the key and what is allowed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from graphlint.errors import UsageError
from graphlint.target import parse_vary, target_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

DEVICES = ("auto", "meta", "cpu", "cuda")
SEVERITIES = ("note", "warning", "error")
FAIL_ON = (*SEVERITIES, "never")
DISTRIBUTED = ("none", "ddp")  # how targets are trained; rules tagged with it run by default (GL402 for ddp)


@dataclass(frozen=True)
class RuleSelection:
    """One layer of rule selection (the pyproject's, or the command line's); see graphlint.selection."""

    select: tuple[str, ...] | None = None  # None: this layer does not restart the selection
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()


@dataclass(frozen=True)
class Config:
    targets: tuple[str, ...] = ()
    device: str = "auto"
    select: tuple[str, ...] | None = None  # None: the rules enabled by default
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    per_file_ignores: dict[str, tuple[str, ...]] = field(default_factory=dict)
    severity: dict[str, str] = field(default_factory=dict)
    fail_on: str = "warning"
    timeout: float = 600  # seconds per target, so that a forward that never returns cannot hang a hook; 0: none
    vary: tuple[str, ...] = ("batch",)  # input dimensions the torch.compile analysis (GL302) grows: batch, seq
    memory_budget: int | None = None  # bytes a training step may peak at (GL401); None: no budget
    cost_gpu: str | None = None  # check --gpu: the findings' time per step on this GPU (graphlint.costs)
    cost_cpu: str | None = None  # check --cpu: on this machine's CPU instead, named by its model
    distributed: str = "none"  # one of DISTRIBUTED: "ddp" turns on the rules tagged ddp (GL402)
    # Folders (absolute) that targets import from, before the project's src/ and root: [tool.graphlint] pythonpath,
    # else [tool.pytest.ini_options] pythonpath, so that graphlint imports the project as its tests do; None when
    # neither is set (graphlint.project then reads pytest's other configuration files).
    pythonpath: tuple[str, ...] | None = None
    source: Path | None = None  # the pyproject.toml it came from
    command_line: RuleSelection | None = None  # --select/--extend-select/--ignore, a layer above the file's

    @property
    def file_selection(self) -> RuleSelection:
        return RuleSelection(self.select, self.extend_select, self.ignore)

    def overridden(self, select=None, extend_select=None, ignore=None, **options) -> Config:
        """This configuration with the command line's options (those not None) taking precedence. The rule
        options form their own layer, resolved with ruff's semantics by graphlint.selection."""
        layer = None
        if select is not None or extend_select is not None or ignore is not None:
            layer = RuleSelection(select, extend_select or (), ignore or ())
        return replace(self, command_line=layer or self.command_line,
                       **{key: value for key, value in options.items() if value is not None})


def _strings(value, where: str, example: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"{where} must be a list of strings, like {example}")
    return tuple(value)


def _targets(value, where: str) -> tuple[str, ...]:
    """Target strings, and tables { model, inputs, kwargs } made into the canonical text of such a target."""
    example = '["models/gpt.py:make_model", { model = "pkg/net.py:Net", inputs = ["float32[2,3,32,32]"] }]'
    if not isinstance(value, list):
        raise UsageError(f"{where} must be a list of strings or tables, like {example}")
    return tuple(_target(item, f"{where}[{index}]", example) for index, item in enumerate(value))


def _target(item, where: str, example: str) -> str:
    if isinstance(item, str):
        return item
    if not isinstance(item, dict):
        raise UsageError(f"{where} must be a string or a table, like {example}")
    unknown = sorted(set(item) - {"model", "inputs", "kwargs", "vary"})
    if unknown:
        raise UsageError(f"{where}: unknown key {_key(unknown[0])}; a target table has model, inputs, kwargs and vary")
    if not isinstance(item.get("model"), str):
        raise UsageError(f'{where} needs model = "path/to/file.py:NAME" (or "package.module:NAME")')
    inputs = _strings(item.get("inputs", []), f"{where}.inputs", '["float32[2,3,32,32]", "int64[2,16]:0..1000"]')
    kwargs = item.get("kwargs", {})
    if not isinstance(kwargs, dict):
        raise UsageError(f"{where}.kwargs must be a table of the model's keyword arguments, like {{ depth = 2 }}")
    vary = parse_vary(item["vary"], f"{where}.vary") if "vary" in item else None
    return target_text(item["model"], inputs, kwargs, vary)


def _key(name: str) -> str:
    """A TOML key as a message names it: bare when TOML would write it bare, else quoted as Python writes it (a
    quoted key may hold a line break, and every usage error is one line)."""
    return name if name and name.replace("-", "_").isidentifier() else repr(name)


def _one_of(value, where: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise UsageError(f"{where} must be one of {', '.join(allowed)}; got {value!r}")
    return value


def _per_file_ignores(value, where: str) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, dict):
        raise UsageError(f'{where} must be a table of glob = [rule IDs], like {{ "legacy/*.py" = ["GL101"] }}')
    return {glob: _strings(codes, f"{where}.{glob!r}", '["GL101"]') for glob, codes in value.items()}


def vary_setting(value, where: str) -> tuple[str, ...]:
    """A `vary` list (`["batch", "seq"]`, `[]` for none), checked."""
    if not isinstance(value, list):
        raise UsageError(f'{where} must be a list of dimension names, like ["batch", "seq"]')
    return parse_vary(value, where)


def _seconds(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise UsageError(f"{where} must be a number of seconds (0 for no limit); got {value!r}")
    return float(value)


def memory_budget(value, where: str) -> int:
    """A budget (`"24GiB"`, `"80GB"`, a number of bytes), checked."""
    from graphlint.sizes import parse_bytes

    budget = parse_bytes(value) if isinstance(value, (str, int)) else None
    if budget is None:
        raise UsageError(f'{where} must be a size like "24GiB", "80GB" or a number of bytes; got {value!r}')
    return budget


def _severity(value, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise UsageError(f'{where} must be a table of rule ID = level, like {{ GL203 = "warning" }}')
    return {code: _one_of(level, f"{where}.{_key(code)}", SEVERITIES) for code, level in value.items()}


_KEYS = {
    "targets": ("targets", _targets),
    "device": ("device", lambda v, w: _one_of(v, w, DEVICES)),
    "select": ("select", lambda v, w: _strings(v, w, '["GL1", "GL201"]')),
    "extend-select": ("extend_select", lambda v, w: _strings(v, w, '["GL901"]')),
    "ignore": ("ignore", lambda v, w: _strings(v, w, '["GL203"]')),
    "per-file-ignores": ("per_file_ignores", _per_file_ignores),
    "severity": ("severity", _severity),
    "fail-on": ("fail_on", lambda v, w: _one_of(v, w, FAIL_ON)),
    "timeout": ("timeout", _seconds),
    "vary": ("vary", vary_setting),
    "memory-budget": ("memory_budget", memory_budget),
    "distributed": ("distributed", lambda v, w: _one_of(v, w, DISTRIBUTED)),
    "pythonpath": ("pythonpath", lambda v, w: _strings(v, w, '["src"]')),
}


def read_config(pyproject: Path) -> Config:
    """Read and check `[tool.graphlint]` of a pyproject.toml."""
    try:
        with open(pyproject, "rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"{pyproject}: invalid TOML ({error}); fix the file") from error
    except OSError as error:
        raise UsageError(f"{pyproject}: cannot read it ({error.strerror})") from error
    tool = data.get("tool", {})
    if not isinstance(tool, dict):
        raise UsageError(f"{pyproject}: tool must be a table ([tool.graphlint]); got {type(tool).__name__}")
    table = tool.get("graphlint", {})
    if not isinstance(table, dict):
        raise UsageError(f"{pyproject}: tool.graphlint must be a table ([tool.graphlint])")
    values = {}
    for key, value in table.items():
        if key not in _KEYS:
            raise UsageError(f"{pyproject}: unknown key tool.graphlint.{_key(key)}; the keys graphlint reads are "
                             f"{', '.join(_KEYS)}")
        attribute, check = _KEYS[key]
        values[attribute] = check(value, f"{pyproject}: tool.graphlint.{key}")
    if "pythonpath" not in values:
        values["pythonpath"] = _pytest_pythonpath(tool, pyproject)
    if values["pythonpath"] is not None:
        values["pythonpath"] = tuple(str((pyproject.parent / folder).resolve()) for folder in values["pythonpath"])
    return Config(source=pyproject, **values)


def _pytest_pythonpath(tool: dict, pyproject: Path) -> tuple[str, ...] | None:
    """pytest's `pythonpath` setting in the same file: a list, or one string of folders separated by spaces;
    None when it has none."""
    options = tool.get("pytest", {}).get("ini_options", {}) if isinstance(tool.get("pytest"), dict) else {}
    value = options.get("pythonpath") if isinstance(options, dict) else None
    if value is None:
        return None
    if isinstance(value, str):
        return tuple(value.split())
    return _strings(value, f"{pyproject}: tool.pytest.ini_options.pythonpath", '["src"]')


def split_codes(text: str | None) -> tuple[str, ...] | None:
    """`GL101,GL2` from the command line as a tuple; None when the option was not given."""
    if text is None:
        return None
    return tuple(part.strip() for part in text.split(",") if part.strip())

"""The torch.compile analysis: compile a captured model with dynamo and a backend that runs each graph as traced
(computing nothing on meta), run it on the calls the target will see, and keep every graph break and
recompilation as plain data with its user frames.

It runs in the target's child after the forward recorder has exited (dynamo leaves frames alone under a
dispatch mode), on the device the capture ran on: meta when the forward ran there, the CPU rebuild when it
needed real values. Dynamo's caches are reset before and after, so one target's compilations never reach the
next. What torch reports is read from dynamo itself: the graph-break log call (with the break's type, which
torch's registry `graph_break_registry.json` maps to a `GBnnnn` ID) and the guard-failure callback.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import os
import re
import traceback
import types
from dataclasses import dataclass, field
from typing import Any

import torch

from graphlint.capture import dimensions
from graphlint.capture.frames import Frame
from graphlint.errors import one_line
from graphlint.files import is_hidden_file

# Names dynamo gives the functions that resume a frame after a graph break, and their original name.
_RESUME = re.compile(r"^torch_dynamo_resume_in_(\w+?)_at_\d+$")
# Dynamo's graph-break types that only wrap another break (the one to report is inside them).
WRAPPER_TYPES = frozenset({"graph break in loop", "Graph break in loop", "Failed to handle graph break gracefully"})
# Dynamo's graph-break types for an exception raised while tracing: on a call that fails, that exception.
_FAILURE_TYPES = frozenset({"Observed exception", "Assertion failed on symbolic shapes"})


@dataclass(frozen=True)
class GraphBreak:
    """One graph break dynamo reported: its type and registry ID (empty on torch versions without them), the
    explanation in dynamo's words, its hints, and the user frames of the break, outermost first."""

    gb_type: str
    gb_id: str
    explanation: str
    hints: tuple[str, ...]
    stack: tuple[Frame, ...]


@dataclass(frozen=True)
class Recompile:
    """One recompilation: the guard that failed (dynamo's text, compile ID removed), the function compiled
    again (its `def` line), the call that caused it, the line that reads the guarded value, when found, and the
    module it was compiled for, with the other modules of its class."""

    guard: str
    function: Frame
    call: str
    line: Frame | None = None
    instance: str = ""  # the module path of `self` when the function is a method of one of the model's modules
    siblings: tuple[str, ...] = ()  # the module paths of every module of that class in the model, in order
    # Which code object recompiled (1, 2, ... in order of first recompile): a function that resumes after a break
    # can have several, each with its own cache, recompile_limit and automatic dynamic shapes.
    code: int = 0

    @property
    def subject(self) -> str:
        """The guard without its values (dimension indices kept): recompiles with one subject are one hazard."""
        return re.sub(r"(?<!index )\b\d+\b", "N", self.guard)


@dataclass
class CompileAnalysis:
    """What compiling the target showed. `unavailable` says why nothing was analysed (an old torch, a model
    that failed under dynamo); `calls` names the calls that ran, in order; `dropped` the calls left out, with
    the error the model raised on each without torch.compile."""

    breaks: list[GraphBreak] = field(default_factory=list)
    recompiles: list[Recompile] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    recompile_limit: int = 8
    limit_hit: list[Frame] = field(default_factory=list)  # functions whose recompiles reached the limit
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (call, error): refused by the model uncompiled
    unavailable: str = ""
    shortcut: bool = False  # the repeated blocks were compiled once each (graphlint.capture.compile_regions)
    reused: bool = False  # read from an earlier run's memo (graphlint.capture.compile_memo), nothing compiled


@functools.lru_cache(maxsize=1)
def graph_break_ids() -> dict[str, str]:
    """Dynamo's graph-break type → `GBnnnn`, from the registry installed with torch ({} when it has none)."""
    path = os.path.join(os.path.dirname(torch.__file__), "_dynamo", "graph_break_registry.json")
    try:
        with open(path, encoding="utf-8") as handle:
            registry = json.load(handle)
    except (OSError, ValueError):
        return {}
    return {entry["Gb_type"]: gb_id for gb_id, entries in registry.items() for entry in entries if "Gb_type" in entry}


def analyse_compile(model: torch.nn.Module, calls: list[tuple[str, tuple, dict]],
                    graphs_without_grad: bool = False) -> CompileAnalysis:
    """Compile `model` with dynamo and run it on `calls` (label, args, kwargs), recording breaks and recompiles.
    A call that fails ends the analysis there (what was seen is kept) with a line saying so. Dynamo traces with
    gradients enabled; `graphs_without_grad` runs the traced graphs without them (see `_run_graph_without_grad`)."""
    analysis = CompileAnalysis()
    try:
        import torch._dynamo as dynamo
        from torch._dynamo import convert_frame, symbolic_convert
    except ImportError as error:  # pragma: no cover - every supported torch has dynamo
        analysis.unavailable = f"this torch has no torch._dynamo ({one_line(error)})"
        return analysis
    if not hasattr(symbolic_convert.InstructionTranslatorBase, "log_graph_break") or not hasattr(
            convert_frame, "get_and_maybe_log_recompilation_reasons"):
        analysis.unavailable = f"torch {torch.__version__} lacks the dynamo hooks graphlint reads (graph-break log, " \
                               "recompilation reasons)"
        return analysis
    config = dynamo.config
    analysis.recompile_limit = int(getattr(config, _limit_name(config), 8))
    current = ["the factory's inputs"]
    dynamo.reset()
    try:
        on_meta = any(t.device.type == "meta" for t in (*model.parameters(), *model.buffers()))
        with _quiet(), _without_fake_tensor_cache(config), _guard_latency_unmeasured(), \
                _real_meta_tensors_accepted(on_meta), \
                _breaks_recorded(symbolic_convert, analysis), _recompiles_recorded(convert_frame, analysis, current, model), \
                _limit_hits_recorded(analysis):
            compiled = dynamo.optimize(_run_graph_without_grad if graphs_without_grad else _run_graph)(model)
            for label, args, kwargs in calls:
                current[0] = label
                analysis.calls.append(label)
                seen = len(analysis.breaks)
                try:
                    # With gradients, as the training step runs: some breaks happen only then (a tensor made with
                    # requires_grad=True, an autograd.Function whose backward dynamo must trace).
                    with torch.enable_grad():
                        compiled(*args, **kwargs)
                except Exception as error:  # the analysis stops; the capture's findings stand
                    analysis.calls[-1] += f" (failed under torch.compile: {one_line(error)})"
                    # Dynamo's record of the failure itself is not a break of the model's graph.
                    analysis.breaks[seen:] = [b for b in analysis.breaks[seen:] if b.gb_type not in _FAILURE_TYPES]
                    break
    finally:
        dynamo.reset()
    return analysis


@contextlib.contextmanager
def _quiet():
    """Dynamo's own warnings about the breaks it finds: graphlint reports them, so they are not printed too."""
    import logging
    import warnings

    loggers = [logging.getLogger("torch._dynamo"), logging.getLogger("torch._subclasses"),
               logging.getLogger("torch._dynamo.convert_frame")]
    saved = [(logger.level, logger.propagate) for logger in loggers]
    loggers[0].setLevel(logging.CRITICAL)
    loggers[1].setLevel(logging.CRITICAL)
    loggers[2].setLevel(logging.WARNING)  # the recompile-limit warning still reaches graphlint's handler
    loggers[2].propagate = False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, (level, propagate) in zip(loggers, saved, strict=True):
            logger.setLevel(level)
            logger.propagate = propagate


def _without_fake_tensor_cache(config):
    """Dynamo's fake-tensor cache off for the analysis: with the batch dimension symbolic, a cache hit rebuilds its
    output more slowly than the meta kernel computes it again (a small target's analysis took 10% less CPU without
    it, benchmarks/run.py --only many); it changes no result, only how one is reached."""
    if not hasattr(config, "fake_tensor_cache_enabled"):
        return contextlib.nullcontext()
    return config.patch(fake_tensor_cache_enabled=False)


@contextlib.contextmanager
def _guard_latency_unmeasured():
    """Dynamo's timing of each new guard set off while the analysis compiles: it only feeds a compile metric that
    graphlint never reads, and flushes the CPU caches first by filling a fresh 32 MiB buffer (about 19 ms and 8,000
    page faults for every frame compiled, recompiles included). The guards are still built and checked."""
    from torch._dynamo import guards

    original = getattr(guards, "profile_guard_manager", None)
    if original is None:  # a torch that does not time its guards
        yield
        return
    guards.profile_guard_manager = lambda *args, **kwargs: 0.0
    try:
        yield
    finally:
        guards.profile_guard_manager = original


@contextlib.contextmanager
def _real_meta_tensors_accepted(on_meta: bool):
    """On meta, a tensor the model creates from constants inside the compiled region (`torch.tensor([],
    device=...)`, as transformers' default cache does) is a real meta tensor that dynamo's fake-tensor mode
    refuses to mix with its fake ones; converting it, as that mode does when asked, costs nothing on meta."""
    if not on_meta:
        yield
        return
    from torch._subclasses import fake_tensor

    original = fake_tensor.FakeTensorMode.__init__

    @functools.wraps(original)
    def accepting(self, *args, **kwargs):
        kwargs["allow_non_fake_inputs"] = True
        original(self, *args, **kwargs)

    fake_tensor.FakeTensorMode.__init__ = accepting
    try:
        yield
    finally:
        fake_tensor.FakeTensorMode.__init__ = original


def _run_graph(gm: torch.fx.GraphModule, example_inputs) -> Any:
    """A dynamo backend that runs each graph as it was traced, on the inputs' device: on meta that computes
    nothing, and on the CPU rebuild it computes the values eager PyTorch would. Made-up values (zeros) would
    flow into the Python between graphs, take branches the model never takes and raise in its own checks."""
    return gm.forward


def _run_graph_without_grad(gm: torch.fx.GraphModule, example_inputs) -> Any:
    """`_run_graph` with autograd off while the graph runs (dynamo has traced it with gradients on). Only for an
    analysis whose result stands on a single graph per call (the repeated-block shortcut): there no output of a
    graph reaches Python code that dynamo traces next, so what requires grad there cannot change what it finds,
    and the nested regions are not traced again for backward on every call (several times the whole cost)."""
    forward = gm.forward

    def run(*args):
        with torch.no_grad():
            return forward(*args)

    return run


@contextlib.contextmanager
def _breaks_recorded(symbolic_convert, analysis: CompileAnalysis):
    """Wrap dynamo's graph-break log call (its arguments differ between torch versions) to keep each break."""
    translator = symbolic_convert.InstructionTranslatorBase
    original = translator.log_graph_break
    ids = graph_break_ids()

    def log_graph_break(self, *args, **kwargs):
        values = list(args) + list(kwargs.values())
        error = next((v for v in values if isinstance(v, BaseException)), None)
        if error is None or not getattr(error, "logged", False):
            stack = kwargs.get("user_stack") or getattr(error, "real_stack", None) or next(
                (v for v in args if isinstance(v, list) and v and isinstance(v[0], traceback.FrameSummary)), None)
            if stack is None:
                stack = torch._guards.TracingContext.extract_stack()
            reason = kwargs.get("reason") or next((v for v in args[1:] if isinstance(v, str)), "")
            gb_type = getattr(error, "gb_type", None) if error is not None else None
            gb_type = gb_type if isinstance(gb_type, str) else ""
            analysis.breaks.append(GraphBreak(gb_type, ids.get(gb_type, ""), _explanation(reason, gb_type),
                                              _hints(reason), _frames(stack)))
        return original(self, *args, **kwargs)

    translator.log_graph_break = log_graph_break
    try:
        yield
    finally:
        translator.log_graph_break = original


@contextlib.contextmanager
def _recompiles_recorded(convert_frame, analysis: CompileAnalysis, current: list[str], model: torch.nn.Module):
    """Wrap dynamo's call that explains a recompilation: its first reason is the newest compilation's failed
    guard (older entries fail too, for reasons already seen)."""
    original = convert_frame.get_and_maybe_log_recompilation_reasons
    paths = {id(module): path for path, module in model.named_modules()}
    classes: dict[type, list[str]] = {}
    for path, module in model.named_modules():
        classes.setdefault(type(module), []).append(path)
    # By identity (equal code objects can be two, each with its cache); kept alive, so no id is reused meanwhile.
    codes: dict[int, tuple[int, types.CodeType]] = {}

    def explained(cache_entries, frame, *args, **kwargs):
        reasons = original(cache_entries, frame, *args, **kwargs)
        if reasons:
            code = frame.f_code
            guard, line = _guard_and_line(str(reasons[0]), code)
            function = Frame(os.path.abspath(code.co_filename), code.co_firstlineno, _user_name(code.co_name))
            owner = _local(frame, "self")
            instance = paths.get(id(owner), "") if isinstance(owner, torch.nn.Module) else ""
            analysis.recompiles.append(Recompile(guard, function, current[0], line or _guarded_line(code, guard),
                                                 instance, tuple(classes[type(owner)]) if instance else (),
                                                 codes.setdefault(id(code), (len(codes) + 1, code))[0]))
        return reasons

    convert_frame.get_and_maybe_log_recompilation_reasons = explained
    try:
        yield
    finally:
        convert_frame.get_and_maybe_log_recompilation_reasons = original


def _local(frame, name: str):
    """A local of the frame dynamo is about to compile (its arguments are set by then), None when unreadable."""
    try:
        return frame.f_locals.get(name)
    except Exception:  # dynamo's frame wrapper differs between torch versions
        return None


# A guard's verbose text: `self.n == 1   # self.n += 1  # …/model.py:10 in forward (HINT: …)`.
_GUARD_SOURCE = re.compile(r"#\s*(?P<code>.*?)\s*#\s*(?P<path>\S+):(?P<line>\d+) in (?P<function>\w+)")


# One frame of the user stack dynamo appends to a guard's failure: `  File "/m/unet.py", line 52, in _forward`.
_STACK_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)\s*$')


def _user_name(name: str) -> str:
    """A function's name as its user wrote it: dynamo's `torch_dynamo_resume_in_forward_at_13` is `forward`."""
    resumed = _RESUME.match(name)
    return resumed.group(1) if resumed else name


def _guard_and_line(reason: str, code) -> tuple[str, Frame | None]:
    """The failed guard without dynamo's compile ID and comments, and the user line dynamo attributed it to: the
    innermost frame of the user code of the guard's stack (the line that read the value, which may be in a
    function inlined into the recompiled one, in another file), else the line of its one-line comment."""
    lines = reason.strip().splitlines()
    first = re.sub(r"^\s*\d+/\d+:\s*", "", lines[0])
    guard = first.split("#", 1)[0].strip() or first.strip()
    if "User stack trace:" in lines[1:2]:
        frames = [m for m in map(_STACK_FRAME.match, lines[2:]) if m]
        users = [m for m in frames if not is_hidden_file(os.path.abspath(m.group("path")))]
        if users:
            innermost = users[-1]
            return guard, Frame(os.path.abspath(innermost.group("path")), int(innermost.group("line")),
                                _user_name(innermost.group("function")))
    found = _GUARD_SOURCE.search(first)
    if found:
        path = found.group("path").lstrip(".")
        filename = os.path.abspath(code.co_filename)
        if filename.endswith(path.replace("/", os.sep)):
            return guard, Frame(filename, int(found.group("line")), _user_name(found.group("function")))
    return guard, None


@contextlib.contextmanager
def _limit_hits_recorded(analysis: CompileAnalysis):
    """Dynamo says in a warning on its `torch._dynamo.convert_frame` logger when a function hits the limit."""
    import logging

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            text = record.getMessage()
            if "recompile_limit" in text or "cache_size_limit" in text:
                found = re.search(r"function: '([^']+)' \(([^:)]+):(\d+)\)", text)
                if found:
                    analysis.limit_hit.append(Frame(os.path.abspath(found.group(2)), int(found.group(3)),
                                                    _user_name(found.group(1))))

    logger = logging.getLogger("torch._dynamo.convert_frame")
    handler = Handler(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def _frames(stack) -> tuple[Frame, ...]:
    """Dynamo's `FrameSummary`s as graphlint frames, torch's own left out, resume functions under their names."""
    frames = []
    for summary in stack or ():
        filename = os.path.abspath(summary.filename)
        if is_hidden_file(filename):
            continue
        name = _user_name(summary.name)
        positions = (getattr(summary, "colno", None), getattr(summary, "end_lineno", None),
                     getattr(summary, "end_colno", None))
        frames.append(Frame(filename, summary.lineno or 0, name, *(positions if None not in positions else ())))
    return tuple(frames)


def _explanation(reason: str, gb_type: str) -> str:
    """Dynamo's explanation of a break, its first sentence."""
    found = re.search(r"Explanation:\s*(.+)", reason)
    if found:
        return re.split(r"(?<=[.)`])\s+(?=[A-Z])", found.group(1).strip())[0].rstrip(".")
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    return next((line for line in lines if line != gb_type), gb_type)


def _hints(reason: str) -> tuple[str, ...]:
    return tuple(line.strip()[len("Hint:"):].strip() for line in reason.splitlines() if line.strip().startswith("Hint:"))


# `L['self'].step`, `L['x']`, `G['CONFIG'].n` in a guard, as the user wrote them: `self.step`, `x`, `CONFIG.n`.
_SOURCE = re.compile(r"[LG]\['([A-Za-z_]\w*)'\]((?:\.[A-Za-z_]\w*)*)")


def _guarded_line(code, guard: str) -> Frame | None:
    """The first line of the recompiled function that reads the guarded value (`self.step`, `x.shape`)."""
    import inspect

    sources = [name + attributes for name, attributes in _SOURCE.findall(guard)]
    tensor = re.search(r"tensor '([^']+)'", guard)
    if tensor:
        sources.append(_SOURCE.sub(lambda m: m.group(1) + m.group(2), tensor.group(1)))
    if not sources:
        return None
    try:
        lines, start = inspect.getsourcelines(code)
    except (OSError, TypeError):
        return None
    target = sources[0]
    pattern = re.compile(rf"(?<![\w.]){re.escape(target)}(?![\w])")
    use = re.compile(rf"{pattern.pattern}\s*(\.shape|\.size\(|\.dim\(|\[)") if tensor else pattern
    for offset, text in enumerate(lines[1:], start=1):  # not the `def` line: the value is read in the body
        stripped = text.split("#", 1)[0]
        if use.search(stripped) or (not tensor and pattern.search(stripped)):
            return Frame(os.path.abspath(code.co_filename), start + offset, code.co_name)
    return None


DEFAULT_VARY = ("batch",)


def analyse_target(made, device: str, vary: tuple[str, ...] | None = DEFAULT_VARY, memo=None) -> CompileAnalysis:
    """The analysis of a captured target (`graphlint.Target`) on the calls it will see: its inputs three times
    (state that changes on every call shows on the second and third), each `vary` dimension one and two larger
    (a size change that dynamic shapes absorb recompiles once, not twice), then the target's own `calls`. With
    `vary` None, only the factory's inputs, once (graph breaks need no more).

    Every call after the first (which the capture has just run) runs eagerly first, on the capture's device;
    one the model refuses there is left out with a line in `CompileAnalysis.dropped`, so that nothing dynamo
    reports is caused by an input the model does not accept.

    Dynamo traces torch's default-device mode op by op, which doubles its cost, so the model (already on
    `device`) is compiled without it first; only a forward that then fails, such as one that creates tensors
    without a device, is analysed again inside it. Alike repeated blocks are traced once each where that can
    only give what compiling the whole model gives (graphlint.capture.compile_regions).

    With a `memo` (graphlint.capture.compile_memo.CompileMemo), an earlier run's analysis of the same model,
    calls and traced code is returned instead, and a new one is kept for the next run.

    On meta, the dimensions the grown calls change are dynamic from the first compilation on (`_traced_once`), so
    a model that does not specialise on them is traced once."""
    from graphlint.capture.compile_memo import traced_code_recorded

    planned = _calls(made, device, vary)
    key = memo.key(made.model, planned, device) if memo is not None else None
    if key is not None:
        found = memo.load(key)
        if found is not None:
            try:
                return _analysis_from(found)
            except (KeyError, TypeError, ValueError):
                pass  # an entry of another shape: compiled again, and written over
    traced: list = []
    # The model's prints would repeat the capture's, once per call and compilation: the user sees one forward's.
    with traced_code_recorded(traced) if key is not None else contextlib.nullcontext(), _as_torch_compile_leaves(), \
            contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        calls, dropped = _accepted(made.model, planned, device)
        analysis = _traced_once(made.model, calls, device)
        if analysis is None:
            analysis = _analysed(made.model, calls, device)
    analysis.dropped = dropped
    if key is not None and not analysis.unavailable:
        memo.store(key, analysis, traced)
    return analysis


def _traced_once(model, calls: list[tuple[str, tuple, dict]], device: str) -> CompileAnalysis | None:
    """The analysis with the grown calls' dimensions dynamic from the first compilation on
    (`dynamic_from_the_start`), on a copy of the model; None where it might differ from the analysis without them,
    which then runs on the untouched model. It stands only when nothing compiled again: no recompile, no
    recompile-limit hit (nor a limit of 1), no failing call, and no module state or global that changed across the
    calls. Compiled without the marks, such a model compiles once more on the first grown call (its one-off size
    recompile, which no rule reports) and only checks guards otherwise; any recompile means the model specialises on
    something, and its analysis, with every reason and call GL302 names, is the one without the marks. On meta
    only, where a copy of the model costs no memory."""
    from graphlint.capture.compile_regions import globals_kept, module_state

    kinds = {label.split()[0] for label, _, _ in calls[1:] if label.split()[0] in dimensions.DIMENSIONS}
    if device != "meta" or not kinds:
        return None
    with globals_kept(model) as kept:
        try:
            copied = copy.deepcopy(model)
        except Exception:  # a model deepcopy refuses: analysed without the marks, as before
            return None
        before = module_state(copied)
        with dynamic_from_the_start(calls[0][1], calls[0][2], kinds) as marked, _first_recompile_ends_it() as limit:
            if not marked:
                return None
            analysis = _analysed(copied, calls, device)
        analysis.recompile_limit = limit
        # Unmarked, the grown call's one-off recompile would reach a recompile_limit of 1: that limit is reported.
        settled = not (analysis.unavailable or analysis.recompiles or analysis.limit_hit or
                       any("(failed under" in call for call in analysis.calls)) and limit > 1
        kept.keep = settled and module_state(copied) == before and not kept.changed()
    return analysis if kept.keep else None


@contextlib.contextmanager
def _first_recompile_ends_it():
    """Dynamo's recompile limit at 1 for the marked attempt, yielding the limit as configured: any recompile refuses
    that attempt, so its later ones would be traced for nothing (a U-Net that recompiled 20 times spent 7 s there). A
    model that never recompiles never reaches the limit, so what it gives is what it gave under the configured one."""
    from torch._dynamo import config

    name = _limit_name(config)
    configured = int(getattr(config, name, 8))
    with config.patch(**{name: 1}):
        yield configured


def _limit_name(config) -> str:
    """The name of dynamo's recompile limit in this torch (`cache_size_limit` before it was renamed)."""
    return "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"


def _analysed(model, calls: list[tuple[str, tuple, dict]], device: str) -> CompileAnalysis:
    """The repeated-block shortcut where it holds, else the whole model compiled; on a device other than the CPU,
    a forward that fails on the first call is compiled again inside that device's default-device mode."""
    analysis = _shortcut(model, calls, device)
    if analysis is None:
        analysis = analyse_compile(model, calls)
    if device != "cpu" and analysis.calls and "(failed under" in analysis.calls[0]:
        with torch.device(device):
            analysis = analyse_compile(model, calls)
    return analysis


@contextlib.contextmanager
def dynamic_from_the_start(args: tuple, kwargs: dict, kinds: set[str]):
    """The dimensions that the grown calls change (`kinds`: "batch", "seq"; graphlint.capture.dimensions) marked
    with dynamo's `maybe_mark_dynamic` on these inputs' tensors, so that the first compilation already treats them
    as symbolic and a grown call only checks guards: one trace instead of a static one and a dynamic one. Where
    the model specialises on a size (a Python loop over it) dynamo keeps it static, as `maybe_` allows without an
    error, and the grown calls compile again. Yields whether a tensor was marked; the marks are attributes of the
    inputs, so they are put back as they were. Sizes 0 and 1, dimensions the user marked static, tensor subclasses
    that wrap others, and a dynamo configured without automatic dynamic shapes get no marks."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    found = dimensions.sizes(args, kwargs) if kinds and _automatic_dynamic_shapes() else {}
    marks: dict[int, tuple[torch.Tensor, list[int]]] = {}
    for tensor in dimensions.input_tensors(args, kwargs):
        if is_traceable_wrapper_subclass(tensor):
            continue
        static = tensor.__dict__.get("_dynamo_static_indices", set())  # the user's `mark_static` stands
        # Dynamo keeps sizes 0 and 1 static even when marked: such a size is left to its automatic dynamic shapes.
        dims = sorted({dim for kind in kinds if kind in found for dim in dimensions.carried(tensor, kind, found[kind])
                       if dim not in static and tensor.shape[dim] >= 2})
        if dims:
            marks[id(tensor)] = (tensor, dims)
    saved = [(tensor, {name: _attribute(tensor, name) for name in _DYNAMO_MARKS}) for tensor, _ in marks.values()]
    try:
        if marks:
            from torch._dynamo import maybe_mark_dynamic

            for tensor, dims in marks.values():
                maybe_mark_dynamic(tensor, dims)
        yield bool(marks)
    finally:
        for tensor, attributes in saved:
            for name, (present, value, contents) in attributes.items():
                if not present:
                    tensor.__dict__.pop(name, None)
                    continue
                if isinstance(value, set):
                    value.clear()
                    value.update(contents)
                setattr(tensor, name, value)


def _automatic_dynamic_shapes() -> bool:
    """Whether dynamo, as configured in this process, compiles a frame again with a changed size symbolic (its
    automatic dynamic shapes, on by default): only then do the marks compile what the grown call would."""
    from torch._dynamo import config

    return bool(getattr(config, "automatic_dynamic_shapes", False)) and \
        getattr(config, "automatic_dynamic_shapes_mark_as", "dynamic") == "dynamic"


# The attributes `torch._dynamo.maybe_mark_dynamic` sets on a tensor.
_DYNAMO_MARKS = ("_dynamo_weak_dynamic_indices", "_has_dynamo_dim_marking")


def _attribute(tensor: torch.Tensor, name: str) -> tuple[bool, Any, Any]:
    """(present, value, a copy of its contents when it is a set) of a tensor's own attribute."""
    if name not in tensor.__dict__:
        return False, None, None
    value = tensor.__dict__[name]
    return True, value, set(value) if isinstance(value, set) else None


@contextlib.contextmanager
def _as_torch_compile_leaves():
    """The process state a program's own torch.compile runs in: its first compilation switches torch.distributions'
    argument checks off for the whole process (dynamo's TorchPatcher.patch, once per process), so the model's
    compiled forward never runs them; graphlint's capture switched them back on for the eager forward (where they
    run, GL103). Restored afterwards, for what runs next in this process."""
    import torch.distributions

    validating = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(False)
    try:
        yield
    finally:
        torch.distributions.Distribution.set_default_validate_args(validating)


def _analysis_from(data: dict) -> CompileAnalysis:
    """An analysis kept by graphlint.capture.compile_memo, as it was made."""

    def frame(value):
        return Frame(*value) if value is not None else None

    breaks = [GraphBreak(b["gb_type"], b["gb_id"], b["explanation"], tuple(b["hints"]),
                         tuple(frame(f) for f in b["stack"])) for b in data["breaks"]]
    recompiles = [Recompile(r["guard"], frame(r["function"]), r["call"], frame(r["line"]), r["instance"],
                            tuple(r["siblings"]), r["code"]) for r in data["recompiles"]]
    return CompileAnalysis(breaks=breaks, recompiles=recompiles, calls=list(data["calls"]),
                           recompile_limit=data["recompile_limit"], limit_hit=[frame(f) for f in data["limit_hit"]],
                           dropped=[tuple(d) for d in data["dropped"]], unavailable=data["unavailable"], reused=True)


def _shortcut(model, calls: list[tuple[str, tuple, dict]], device: str) -> CompileAnalysis | None:
    """The analysis with the repeated blocks compiled once (graphlint.capture.compile_regions), on a copy of the
    model; None where it does not apply or might differ from compiling the whole model."""
    from graphlint.capture.compile_regions import (compile_regions, globals_kept, has_alike_blocks, module_state,
                                                   shortcut_applies, shortcut_holds, shortcut_model)

    if not shortcut_applies(device) or not has_alike_blocks(model):
        return None
    with globals_kept(model):
        found = shortcut_model(model, device, (calls[0][1], calls[0][2]))
    if found is None:
        return None
    copied, groups = found
    grown = {label for label, _, _ in calls if label.split()[0] in dimensions.DIMENSIONS}  # `batch 3`, `seq 129`
    before = module_state(copied)
    with globals_kept(model) as kept:
        try:
            with compile_regions(copied, groups):
                analysis = analyse_compile(copied, calls, graphs_without_grad=True)
        except Exception:  # graphlint's own failure: whole-model compilation, as without the shortcut
            return None
        analysis.shortcut = shortcut_holds(analysis, before, module_state(copied), grown) and not kept.changed()
        kept.keep = analysis.shortcut  # the calls' effects stand, as whole-model compilation would leave them
    return analysis if analysis.shortcut else None


def _accepted(model, calls: list[tuple[str, tuple, dict]], device: str) -> tuple[list, list[tuple[str, str]]]:
    """The calls the model runs without torch.compile, and for each one it refuses, its label and the error."""
    kept, dropped = calls[:1], []
    for label, args, kwargs in calls[1:]:
        try:
            with torch.no_grad(), torch.device(device):
                model(*args, **kwargs)
        except Exception as error:  # the model's own refusal of an input graphlint made up
            dropped.append((label, one_line(error)))
            continue
        kept.append((label, args, kwargs))
    return kept, dropped


def _calls(made, device: str, vary: tuple[str, ...] | None) -> list[tuple[str, tuple, dict]]:
    from graphlint.capture import inputs_to_meta

    args, kwargs = made.args, made.kwargs
    if vary is None:
        return [("the factory's inputs", args, kwargs)]
    calls = [("the factory's inputs", args, kwargs), ("the same inputs again", args, kwargs),
             ("the same inputs a third time", args, kwargs)]
    found = dimensions.sizes(args, kwargs)
    for kind in vary:
        if kind not in found:
            continue
        size = found[kind]
        for extra in (1, 2):
            calls.append((f"{kind} {size + extra}", *grown(args, kwargs, kind, size, extra)))
    for index, (call_args, call_kwargs) in enumerate(made.calls):
        if device == "meta":
            call_args, call_kwargs = inputs_to_meta(call_args, call_kwargs)
        calls.append((f"Target.calls[{index}]", call_args, call_kwargs))
    return calls


def grown(args, kwargs, kind: str, size: int, extra: int):
    """The inputs with the batch or sequence (`kind`, of this `size`) made `extra` longer, in the tensors that carry
    it (graphlint.capture.dimensions), by repeating its first slice (ids stay valid ids, masks stay masks)."""
    return dimensions.resized(args, kwargs, {kind: size}, {kind: size + extra}, dimensions.repeat_first_row)


def warm_up() -> None:
    """Compile a small model once, so that a warm parent has dynamo's lazily imported machinery loaded and its
    children do not each pay for it (several seconds against under one for the analysis itself)."""
    from graphlint.capture.isolation import preserved_global_state

    # Preserved: dynamo's first compilation changes process-wide switches (distributions' argument checks).
    with preserved_global_state(), torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        analyse_compile(model, [("warm-up", (torch.ones(2, 4),), {}), ("warm-up, batch 3", (torch.ones(3, 4),), {})])

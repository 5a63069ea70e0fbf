"""GL301 graph-break: torch.compile splits the model's forward at a line of the user's code."""

from __future__ import annotations

import linecache
import re

from graphlint.capture import facts
from graphlint.capture.compile import WRAPPER_TYPES, GraphBreak
from graphlint.files import is_installed_file
from graphlint.lines import SourceLine
from graphlint.results import Severity
from graphlint.rule import Example, Problem, Rule

# Graph-break types GL302 reports (a recompilation limit is not a break in the user's code).
_NOT_BREAKS = frozenset({"Dynamo recompile limit exceeded", "Cache size limit exceeded"})


def _remedy(item: GraphBreak, line: str) -> str:
    """What to write instead, for the common kinds of break; dynamo's own hint otherwise."""
    kind, said = item.gb_type, f"{item.explanation} {line}"
    if kind == "Data-dependent branching":
        return ("compute both branches and pick with torch.where(condition, a, b), or apply the transform always "
                "(torch.clamp, torch.nan_to_num are no-ops on well-behaved values)")
    if kind == "Dynamic shape operator" or re.search(r"nonzero|unique|masked_select", said):
        return ("keep the shape fixed: multiply by the mask or use torch.where instead of selecting the elements "
                "(x[mask], nonzero(), unique() give data-dependent shapes)")
    if ("print" in said and "builtin" in said) or re.search(r"\bprint\(", line):
        return "remove the print from the forward, or guard it with `if not torch.compiler.is_compiling():`"
    if re.search(r"\bnumpy\b|\bnp\.", line):
        return "use the torch function instead of NumPy, on the tensor itself"
    if "item()" in said or "tolist" in said or "_local_scalar_dense" in said or "Data dependent operator" in kind:
        return ("keep the value a tensor (use `x.amax()` in the arithmetic, not `x.amax().item()`); a Python "
                "number read from a tensor ends the graph")
    if "logging" in said.lower() or re.search(r"\blog(ger)?\.\w+\(", line):
        return "log outside the compiled forward, or guard the call with `if not torch.compiler.is_compiling():`"
    if "warnings" in said or "warn" in line:
        return "warn once outside the forward (in __init__ or the caller), or guard it with `torch.compiler.is_compiling()`"
    if re.search(r"\btime\.|perf_counter|monotonic", said):
        return "time the model from the caller, not inside the forward"
    if re.search(r"Random|random\.", said):
        return "draw random numbers with torch (torch.rand, torch.randint), which compile into the graph"
    if kind == "Call to `torch._dynamo.graph_break()`":
        return "remove the explicit torch._dynamo.graph_break() call"
    if "marked as skipped" in kind or "skip" in kind.lower():
        return ("move the call out of the forward, or wrap it as a custom op (torch.library.custom_op); "
                "torch.compiler.allow_in_graph if it is traceable")
    return item.hints[0].rstrip(".") if item.hints else "see the break's hints with TORCH_LOGS=graph_breaks"


# Library paths a switch at the user's call avoids: (what the library's code around the break says, the switch).
_LIBRARY_SWITCHES = (
    (re.compile(r"use_cache.*gradient.checkpointing|gradient.checkpointing.*use_cache|Caching is incompatible with "
                r"gradient checkpointing", re.IGNORECASE | re.DOTALL),
     "pass `use_cache=False` in this call while training with gradient checkpointing: the library turns the "
     "cache off anyway, and the warning it logs about that breaks the graph"),
)


def _library_remedy(item: GraphBreak, capture) -> str:
    """What the user can change at their own line for a break inside a library: the switch that avoids the
    library's path where one is known, else where the break is and how much of the forward the call covers."""
    inner, user = item.stack[-1], _user_frame(item)
    for pattern, switch in _LIBRARY_SWITCHES:
        if pattern.search(_enclosing_block(inner.file, inner.line)):
            return switch
    ops = list(capture.ops)
    here = SourceLine.of(user)
    inside = sum(1 for node in ops if any(SourceLine.of(f) == here for f in facts(node).stack))
    share = f" ({inside} of the forward's {len(ops)} recorded ops run inside it)" if inside else ""
    return (f"the break is inside {_library(inner.file)} (`{inner.function}`, line {inner.line}), not in this "
            f"file, and graphlint knows no argument of this call that avoids it: torch.compile ends the graph "
            f"inside this call{share} and starts another after it")


def _enclosing_block(path: str, line: int, most: int = 80) -> str:
    """The source from the `def` that holds `line` down to the line after it (at most `most` lines up): what
    the library's code says about the path that led to the break."""
    text = linecache.getline(path, line)
    indent = len(text) - len(text.lstrip())
    start = line
    while start > max(line - most, 1):
        start -= 1
        above = linecache.getline(path, start)
        if re.match(r"\s*(async\s+)?def ", above) and len(above) - len(above.lstrip()) < indent:
            break
    return "".join(linecache.getline(path, n) for n in range(start, line + 2))


def _user_frame(item: GraphBreak):
    """The innermost frame of the break outside installed libraries (the user's line)."""
    return next((frame for frame in reversed(item.stack) if not is_installed_file(frame.file)), item.stack[-1])


def _library(path: str) -> str:
    """The installed package a file belongs to (`transformers`), from its path below site-packages."""
    parts = path.replace("\\", "/").split("/")
    for marker in ("site-packages", "dist-packages"):
        if marker in parts and parts.index(marker) + 1 < len(parts):
            return f"`{parts[parts.index(marker) + 1]}`"
    return "a library"


def root_causes(breaks: list[GraphBreak]) -> list[GraphBreak]:
    """One break per innermost line: chained logs and per-frame repeats merge, and a wrapper ("graph break in
    loop") gives way to the break it wraps."""
    chosen: dict[SourceLine, GraphBreak] = {}
    for item in breaks:
        if not item.stack or item.gb_type in _NOT_BREAKS:
            continue
        key = SourceLine.of(item.stack[-1])
        known = chosen.get(key)
        if known is None or (known.gb_type in WRAPPER_TYPES and item.gb_type not in WRAPPER_TYPES):
            chosen[key] = item
    return list(chosen.values())


def describe_break(item: GraphBreak) -> str:
    """`GB0170 "Data-dependent branching"`, or the type alone on a torch without IDs."""
    if item.gb_type and item.gb_id:
        return f'{item.gb_id} "{item.gb_type}"'
    return f'"{item.gb_type}"' if item.gb_type else "a graph break"


class GraphBreakRule(Rule):
    id = "GL301"
    name = "graph-break"
    severity = Severity.WARNING
    tags = ("performance", "torch.compile")
    precision = "high"
    summary = "torch.compile breaks the forward's graph at this line."
    what = """
        graphlint compiles each target with dynamo (`torch.compile`'s tracer), in the target's own process, on
        the meta device, where its backend computes nothing (or on the CPU rebuild when the forward needs real
        values, where each graph computes what eager PyTorch would), and reports every graph break at the
        innermost line of your code in dynamo's frame chain, with torch's graph-break ID and type from its
        registry (`GB0170 "Data-dependent branching"`), dynamo's explanation, and what to write instead:
        curated for printing a tensor, `.item()`/`.tolist()`, branches on tensor values, data-dependent shapes
        (`nonzero`, boolean-mask indexing, `unique`), NumPy on tensor values, `time` and `random`, logging and
        warnings, skipped or C-extension functions and explicit `torch._dynamo.graph_break()`; dynamo's own hint
        otherwise. A break in a loop over layers is one finding with its count; the chained logs of one break
        are one finding.

        A break inside a library (a `transformers` model's own code) called from your line is reported at your
        line, with the library line related, and its remedy is what you can change at that line: the argument
        that avoids the library's path where graphlint knows one (`use_cache=False` in a call that trains with
        gradient checkpointing, where transformers logs a warning that breaks the graph), else that the break
        is in the library and how many of the forward's ops the call covers. Breaks whose frames are all
        library code are not your findings: the target gets one note naming them. On by default; `--ignore GL3`
        (or `ignore = ["GL3"]`) turns off both torch.compile rules. A first run pays dynamo's tracing, about a
        second per small target; the result cache keeps the analysis for the next runs.
    """
    why = """
        Graph breaks do not change results, so nothing but a profile shows them: each one ends a compiled graph,
        runs Python in between, and starts another, so kernels are not fused across it and every piece pays
        its launch and guard overhead. One break in an attention helper called in every layer splits a forward
        into dozens of compiled pieces.
    """
    example = """
        def forward(self, x):
            h = self.fc(x)
            if h.abs().max() > 10:        # Python branch on a tensor value
                h = h / 10
            print(h.mean())               # printing a tensor
            return h
    """
    instead = """
        def forward(self, x):
            h = self.fc(x)
            h = torch.where(h.abs().amax() > 10, h / 10, h)   # both branches, picked on the device
            return h                                          # print from the caller, outside the model
    """
    bad_examples = (
        Example(
            title="a branch on a tensor value and a print in a block used in every layer",
            source='''
                import torch
                from torch import nn


                class Block(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.fc = nn.Linear(16, 16)

                    def forward(self, x):
                        h = self.fc(x)
                        if h.abs().amax() > 10:  # expect: GL301
                            h = h / 10
                        print(h.mean())  # expect: GL301
                        return h


                class Model(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.blocks = nn.ModuleList(Block() for _ in range(3))

                    def forward(self, x):
                        for block in self.blocks:
                            x = block(x)
                        return x


                def make():
                    return Model(), (torch.randn(4, 16),)
            ''',
        ),
        Example(
            title=".item() and data-dependent indexing",
            source='''
                import torch
                from torch import nn


                class Model(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.fc = nn.Linear(16, 16)

                    def forward(self, x):
                        h = self.fc(x)
                        scale = h.abs().max().item()  # expect: GL301
                        h = h / scale
                        return h[h > 0].sum()  # expect: GL301


                def make():
                    return Model(), (torch.randn(4, 16),)
            ''',
        ),
    )
    good_examples = (
        Example(
            title="the branch-free rewrites: torch.where, a tensor scale, a mask product",
            source='''
                import torch
                from torch import nn


                class Model(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.fc = nn.Linear(16, 16)

                    def forward(self, x):
                        h = self.fc(x)
                        h = torch.where(h.abs().amax() > 10, h / 10, h)
                        h = h / h.abs().amax()
                        if not torch.compiler.is_compiling():
                            print(h.shape)
                        return (h * (h > 0)).sum()


                def make():
                    return Model(), (torch.randn(4, 16),)
            ''',
        ),
    )

    def check(self, capture):
        compiled = capture.compiled
        if compiled is None:
            return
        for item in root_causes(compiled.breaks):
            if all(is_installed_file(frame.file) for frame in item.stack):
                continue  # a library's own break: the target's note names it (graphlint.pipeline)
            line = linecache.getline(item.stack[-1].file, item.stack[-1].line).strip()
            explanation = item.explanation.rstrip(".")
            remedy = _library_remedy(item, capture) if is_installed_file(item.stack[-1].file) else _remedy(item, line)
            message = (f"torch.compile breaks the graph here in {{where}}{{occurrences}}: {describe_break(item)}, "
                       f"{explanation[:1].lower() + explanation[1:]}; {remedy}.")
            paths = _module_paths(capture, item)
            for path in paths or [""]:
                yield Problem(stack=item.stack, module_path=path, message=message)


def _module_paths(capture, item: GraphBreak) -> list[str]:
    """The modules whose forward ran the break's line, from the capture's forward graph (a block in 12 layers
    breaks 12 times); empty when no recorded op ran on that line."""
    here = SourceLine.of(item.stack[-1])
    paths = {}
    for node in capture.ops:
        stack = facts(node).stack
        if any(SourceLine.of(f) == here for f in stack):
            paths.setdefault(facts(node).module_path, None)
    return list(paths)

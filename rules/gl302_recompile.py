"""GL302 recompile: torch.compile compiles the model again on calls it will really see, without settling."""

from __future__ import annotations

import re

from graphlint.capture.compile import Recompile
from graphlint.files import is_installed_file
from graphlint.lines import SourceLine
from graphlint.results import Severity
from graphlint.rule import Example, Problem, Rule


def hazards(recompiles: list[Recompile], first_call: str) -> dict[tuple, list[Recompile]]:
    """Recompilations that do not settle: the same guard of the same function failing on two or more calls
    after the first (a size change that dynamic shapes absorb recompiles once). Keyed by (the function's line,
    the line that read the value, what the guard is on)."""
    groups: dict[tuple, list[Recompile]] = {}
    for item in recompiles:
        if item.call == first_call:
            continue  # compiling the layers' variants on the first call settles once
        # One code object: a resume function can have several, each settling on its own (automatic dynamic
        # shapes absorb a size change once per code object), so their one-off recompiles are not one hazard.
        key = (SourceLine.of(item.function), item.line, item.subject, item.code)
        groups.setdefault(key, []).append(item)
    return {key[:3]: items for key, items in groups.items() if len({i.call for i in items}) >= 2}


# A guard on the value of an attribute of the module (`self.layer_idx == 3`, `self.kind == 'wide'`).
_ATTRIBUTE_VALUE = re.compile(r"(self(?:\.\w+)+) == ")


def per_instance(recompiles: list[Recompile], limit_hit: list) -> dict[tuple, list[Recompile]]:
    """Recompilations inside one call, one for each instance of a module class: a guard on a value that differs
    between instances (`self.layer_idx`) fails as each new instance runs, so the shared code compiles once per
    instance. Two or more such recompiles, each for another instance, that reach every instance of the class
    or recompile_limit; a few variants that the instances share (two kinds of layer) compile once each and are
    not a hazard, nor are shapes that differ between instances by design (the levels of a U-Net)."""
    groups: dict[tuple, list[Recompile]] = {}
    for item in recompiles:
        # An attribute's value, not a shape: each level of a U-Net has its own channels by design.
        if item.instance and _ATTRIBUTE_VALUE.match(item.guard):
            key = (item.call, SourceLine.of(item.function), item.line, item.subject)
            groups.setdefault(key, []).append(item)
    found: dict[tuple, list[Recompile]] = {}
    for (_, function, line, subject), items in groups.items():
        hit = any(SourceLine.of(frame) == function for frame in limit_hit)
        every = len(items) + 1 >= len(items[0].siblings)  # the first instance compiles without a recompile
        if len(items) >= 2 and len({item.instance for item in items}) == len(items) and (every or hit):
            found.setdefault((function, line, subject), items)
    return found


def _per_instance_message(items: list[Recompile], limit: int, hit: bool) -> str:
    siblings = items[0].siblings
    count, function = len(siblings), items[0].function.function
    value = _ATTRIBUTE_VALUE.match(items[0].guard).group(1)
    shown = f"{siblings[0]} … {siblings[-1]}" if count > 2 else ", ".join(siblings)
    if hit or count > limit:
        limit_text = (f"past recompile_limit ({limit}) the other {max(count - limit, 1)} run `{function}` "
                      "uncompiled")
    else:
        limit_text = f"recompile_limit ({limit}) is not reached with {count}, but a deeper model runs the rest uncompiled"
    return (f"torch.compile compiles `{function}` again for each of the {count} instances of its class ({shown}) "
            f"inside one call: guard `{items[0].guard}` fails for every new instance because `{value}` differs "
            f"between them; {limit_text}; pass the value as a tensor (a buffer), or make the branch the same for "
            "every instance.")


def _cause(guard: str) -> str:
    """The guard in words, and what to write instead."""
    size = re.match(r"tensor '([^']+)' (size|stride) mismatch at index (\d+)", guard)
    if size and "failed on a parameter" in guard:
        return ("the parameters that reach this code differ in shape between the modules that call it, and "
                "torch.compile specialises parameter shapes, so each shape compiles again; keep such calls inside "
                "one compiled graph (remove the graph break before them), or give the modules one shape")
    if size:
        name = re.sub(r"[LG]\['(\w+)'\]", r"\1", size.group(1))
        return (f"the {size.group(2)} of `{name}` along dimension {size.group(3)} is specialised, so every new size "
                "compiles again (a Python loop or branch over it, such as `range(x.shape[0])`, defeats dynamic "
                "shapes); use tensor ops over the dimension instead of Python control flow on its size")
    length = re.match(r"len\((.+?)\) == \d+", guard)
    if length:
        name = re.sub(r"[LG]\['(\w+)'\]", r"\1", length.group(1))
        return (f"the length of `{name}` changes between calls and each length compiles again; pass a tensor "
                "(stacked) instead of a Python list of varying length")
    value = re.match(r"(.+?) == -?[\d.]+$", guard)
    if value:
        name = re.sub(r"[LG]\['(\w+)'\]", r"\1", value.group(1))
        if "." in name:
            return (f"the Python number `{name}` changes on every call and torch.compile treats module attributes "
                    "as constants; keep it in a tensor buffer (`register_buffer`) or outside the model")
        return (f"the Python number `{name}` changes between calls and each value compiles again; pass it as a "
                "tensor, or keep it constant")
    return f"the guard `{guard}` fails on each new call; make what it checks the same on every call"


class RecompileRule(Rule):
    id = "GL302"
    name = "recompile"
    severity = Severity.WARNING
    tags = ("performance", "torch.compile", "recompile")
    precision = "high"
    summary = "torch.compile compiles this function again on every new call, until it hits recompile_limit."
    what = """
        graphlint compiles each target with dynamo and a backend that computes nothing, and runs it on the calls
        the model will really see: the factory's inputs three times (state that changes on every call shows on
        the second and third), the batch one and two larger (`--vary`, default `batch`; `--vary batch,seq` also
        grows the sequence, dimension 1; `vary = ["batch", "seq"]` in `[tool.graphlint]`), and the extra calls a
        factory lists: `graphlint.Target(model, args, kwargs, loss, calls=[(args2, kwargs2), ...])`.

        It reports each guard that fails on two or more of those calls after the first (a recompilation that
        never settles) at the line that reads the guarded value, with the guard in words and when it hits
        `recompile_limit` (after which torch.compile runs that function eagerly for good). A size change that
        dynamic shapes absorb after one recompile is not a finding, nor are a few variants compiled once each
        on the first call.

        Within one call it reports a module class whose forward is compiled again for every instance: a value
        that differs between instances (`self.layer_idx % 2`) is a guard, so when each instance's forward is
        compiled on its own (a graph break in the loop over the layers does that) the shared code compiles
        once per layer, and past `recompile_limit` the remaining layers run uncompiled. The finding is at the
        line that reads the value, with the number of instances and whether the limit is reached.

        Every call runs without torch.compile first, on the capture's device; a call the model refuses there
        (a grown input its own checks reject) is left out with a note, and nothing dynamo reports on it is a
        finding. Only the batch or sequence dimension grows: the size of that dimension in the leading input
        (the first tensor argument), in every input whose same dimension has that size; tables such as a
        rotary `freqs_cis` `(seq, dim/2)`, a graph's `edge_index` `(2, edges)` and broadcast dimensions stay as
        they are. On by default; `--ignore GL302` turns it off.
    """
    why = """
        Each recompilation costs as much as the first compile (seconds to minutes with Inductor), and after
        `recompile_limit` (8) recompilations the function silently runs uncompiled. Such models look fine in a
        quick test and degrade in production, where step counters, list lengths and batch sizes change.
    """
    example = """
        def forward(self, x):
            self.step += 1                       # an int attribute, a new constant on every call
            for i in range(x.shape[0]):          # a Python loop over a size: one graph per batch size
                x = x + self.bias[i]
            return x * self.step
    """
    instead = """
        def forward(self, x):
            self.step += 1                       # self.step is a buffer: torch.zeros((), dtype=torch.long)
            x = x + self.bias[: x.shape[0]]      # tensor ops over the dimension
            return x * self.step
    """
    bad_examples = (
        Example(
            title="a step counter attribute and a Python loop over the batch",
            source='''
                import torch
                from torch import nn


                class Model(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.fc = nn.Linear(16, 16)
                        self.step = 0

                    def forward(self, x):
                        self.step += 1  # expect: GL302
                        h = self.fc(x)
                        for i in range(x.shape[0]):  # expect: GL302
                            h[i] = h[i] * 2
                        return h * self.step


                def make():
                    return Model(), (torch.randn(4, 16),)
            ''',
        ),
        Example(
            title="a per-layer Python int read in every layer's forward, each layer compiled on its own",
            source='''
                import torch
                from torch import nn


                class Block(nn.Module):
                    def __init__(self, layer_idx):
                        super().__init__()
                        self.fc = nn.Linear(16, 16)
                        self.layer_idx = layer_idx

                    def forward(self, x):
                        h = self.fc(x)
                        if self.layer_idx % 2:  # expect: GL302
                            h = h * 2
                        return h


                class Model(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.blocks = nn.ModuleList(Block(i) for i in range(10))

                    def forward(self, x):
                        for block in self.blocks:
                            x = block(x)
                            print("layer done")
                        return x


                def make():
                    return Model(), (torch.randn(4, 16),)
            ''',
        ),
    )
    good_examples = (
        Example(
            title="the parity in a buffer, one compiled forward for every layer",
            source='''
                import torch
                from torch import nn


                class Block(nn.Module):
                    def __init__(self, layer_idx):
                        super().__init__()
                        self.fc = nn.Linear(16, 16)
                        self.register_buffer("odd", torch.tensor(layer_idx % 2 == 1))

                    def forward(self, x):
                        h = self.fc(x)
                        return torch.where(self.odd, h * 2, h)


                class Model(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.blocks = nn.ModuleList(Block(i) for i in range(10))

                    def forward(self, x):
                        for block in self.blocks:
                            x = block(x)
                            print("layer done")
                        return x


                def make():
                    return Model(), (torch.randn(4, 16),)
            ''',
        ),
        Example(
            title="the counter in a buffer, the loop as one tensor op, and a shape branch dynamic shapes absorb",
            source='''
                import torch
                from torch import nn


                class Model(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.fc = nn.Linear(16, 16)
                        self.register_buffer("step", torch.zeros((), dtype=torch.long))

                    def forward(self, x):
                        self.step += 1
                        h = self.fc(x) * 2
                        if x.shape[0] > 1:
                            h = h - h.mean(0)
                        return h * self.step


                def make():
                    return Model(), (torch.randn(4, 16),)
            ''',
        ),
    )

    def check(self, capture):
        compiled = capture.compiled
        if compiled is None or not compiled.calls:
            return
        limit = compiled.recompile_limit
        found = hazards(compiled.recompiles, compiled.calls[0])
        instances = per_instance(compiled.recompiles, compiled.limit_hit)
        reported = {function for function, _, _ in (*found, *instances)}
        for (function, line, _), items in instances.items():
            where = line or items[0].function
            if is_installed_file(where.file):
                continue  # a library's own guard: not the user's line
            hit = any(SourceLine.of(f) == function for f in compiled.limit_hit)
            yield Problem(stack=(where,), message=_per_instance_message(items, limit, hit))
        for frame in dict.fromkeys(compiled.limit_hit):
            if SourceLine.of(frame) in reported:
                continue
            reasons = [r for r in compiled.recompiles if SourceLine.of(r.function) == SourceLine.of(frame)]
            # At the line that read the value of the newest compilation's failed guard: torch's last reason.
            where = reasons[-1].line if reasons and reasons[-1].line else frame
            if is_installed_file(where.file):
                continue
            guard = f"; last guard `{reasons[-1].guard}`: {_cause(reasons[-1].guard)}" if reasons else ""
            yield Problem(stack=(where,), message=f"torch.compile hit recompile_limit ({limit}) compiling "
                                                  f"`{frame.function}` and runs it uncompiled from then on{guard}.")
        for (function_line, line, _), items in found.items():
            where = line or items[0].function
            if is_installed_file(where.file):
                continue  # a library's own guard: not the user's line
            calls = list(dict.fromkeys(item.call for item in items))
            function = items[0].function.function
            hit = any(f.file == function_line.file and f.function == function for f in compiled.limit_hit)
            when = (f"it already hit recompile_limit ({limit}) here" if hit else
                    f"it hits recompile_limit ({limit}) after {limit} more calls like these, then runs `{function}` "
                    "uncompiled")
            yield Problem(
                stack=(where,),
                message=f"torch.compile recompiles `{function}` on {len(calls)} of {len(compiled.calls)} calls "
                        f"({', '.join(calls)}): guard `{items[0].guard}` failed; {_cause(items[0].guard)}; "
                        f"{when}.",
            )

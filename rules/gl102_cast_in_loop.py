"""GL102 cast-in-loop: dtype conversions that run again on every pass of a loop."""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import fx

from graphlint.capture import facts
from graphlint.files import library_name
from graphlint.memory.savings import kept_output
from graphlint.ops import CAST, MATMUL_CLASS, MAX_PATTERN_STEPS, NUMERICALLY_SENSITIVE, VIEW, op, ran_in_library, tensor_meta
from graphlint.results import Severity
from graphlint.rule import Example, Problem, Rule
from graphlint.walk import UP, chain, reach

_PRECISION = {torch.float64: 3, torch.float32: 2, torch.bfloat16: 1, torch.float16: 1}


class CastInLoop(Rule):
    id = "GL102"
    name = "cast-in-loop"
    severity = Severity.WARNING
    tags = ("performance", "dtype", "memory")
    precision = "high"
    summary = "A dtype conversion that runs again on every pass of a loop or in every layer."
    what = """
        Dtype conversions (`.to(dtype)`, `.float()`, `.half()`, `.type_as(...)`) that one forward runs again
        and again from the same line, in a Python loop or once per layer:

        - loop-invariant casts: the same tensor converted on every pass (a mask converted to the state's dtype
          at each time step);
        - round trips around matrix work: an up-cast, a Linear, matmul or convolution, and a down-cast to the
          first dtype, in every layer of a half-precision model.

        The message says how many times the conversion ran in one forward. Not flagged: no-op casts (`.float()`
        of a float32 tensor), a cast that runs once (`logits.float()` at the end), and up-casts around
        numerically sensitive work such as softmax, normalisation, variance, log and exp, or the loss (the
        float32 RMSNorm in every layer of a bfloat16 Llama is right), and conversions inside installed libraries
        of the library's own tensors, which their users cannot move.

        A library converting one of the forward's inputs again and again (a diffusion transformer converting
        integer timesteps in every block, a boolean mask in every layer) is the input's dtype's doing: it is
        reported where the input is made (the target's factory), naming the input, the dtype to give it and
        the library's line. A library's round trip in every layer around weights the user's configuration left
        in another dtype than the rest of the model (LoRA adapters kept in float32 on a bfloat16 base) is
        reported at the user's call that built or configured those layers, naming the weights.
    """
    why = """
        Every conversion reads and writes the whole tensor and, in training, adds a `ToCopyBackward0` node
        whose backward converts the gradient again. A loop-invariant cast repeats that work on identical data;
        a round trip runs the layer's matrix work in float32 on hardware built for half precision, and keeps
        both copies of the activations for backward.
    """
    example = """
        for t in range(steps):
            h = self.cell(x[t], h)
            h = h * mask.to(h.dtype)[t]          # converts the whole mask at every step

        return x + self.fc(x.float()).half()     # in every layer of a float16 model
    """
    instead = """
        mask = mask.to(x.dtype)                  # once, before the loop
        for t in range(steps):
            h = self.cell(x[t], h) * mask[t]

        with torch.autocast("cuda", dtype=torch.float16):
            return x + self.fc(x)
    """
    bad_examples = (
        Example(
            title="a mask converted at every time step",
            source='''
                import torch
                from torch import nn


                class Decoder(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.cell = nn.GRUCell(16, 16)

                    def forward(self, x, mask):
                        h = x.new_zeros(x.shape[1], 16)
                        for t in range(x.shape[0]):
                            h = self.cell(x[t], h)
                            h = h * mask.to(h.dtype)[t]  # expect: GL102
                        return h


                def make():
                    return Decoder(), (torch.randn(6, 4, 16), torch.ones(6, 4, 1, dtype=torch.bool))
            ''',
        ),
        Example(
            title="a float32 round trip around the Linear of every layer of a float16 model",
            source='''
                import torch
                from torch import nn


                class Block(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.fc = nn.Linear(16, 16)

                    def forward(self, x):
                        return x + self.fc(x.float()).half()  # expect: GL102


                class Model(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.blocks = nn.ModuleList(Block() for _ in range(4))

                    def forward(self, x):
                        for block in self.blocks:
                            x = block(x)
                        return x


                def make():
                    return Model(), (torch.randn(2, 16, dtype=torch.float16),)
            ''',
        ),
    )
    good_examples = (
        Example(
            title="a bfloat16 model with float32 RMSNorm and softmax in every layer, and one cast at the end",
            source='''
                import torch
                from torch import nn


                class RMSNorm(nn.Module):
                    def __init__(self, dim):
                        super().__init__()
                        self.weight = nn.Parameter(torch.ones(dim))

                    def forward(self, x):
                        dtype = x.dtype
                        x = x.to(torch.float32)
                        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
                        return self.weight * x.to(dtype)


                class Block(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.norm = RMSNorm(16)
                        self.fc = nn.Linear(16, 16)

                    def forward(self, x):
                        h = self.fc(self.norm(x))
                        weights = torch.softmax(h, dim=-1, dtype=torch.float32).to(h.dtype)
                        return x + weights * h


                class Model(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.blocks = nn.ModuleList(Block() for _ in range(4))
                        self.head = nn.Linear(16, 8)

                    def forward(self, x):
                        for block in self.blocks:
                            x = block(x).to(torch.bfloat16)
                        return self.head(x).float()


                def make():
                    return Model().to(torch.bfloat16), (torch.randn(2, 16, dtype=torch.bfloat16),)
            ''',
        ),
    )

    def check(self, capture):
        converting = [n for n in capture.ops if op(n) in CAST and _dtypes(n) is not None]
        casts = [n for n in converting if not _in_library(n)]
        yield from _caused_by_inputs([n for n in converting if _in_library(n)])
        yield from _caused_by_configuration(capture, [n for n in converting if _in_library(n)])
        round_trips: dict[tuple, list[tuple[fx.Node, fx.Node, fx.Node]]] = defaultdict(list)
        for down in casts:
            match = _round_trip(down)
            if match is not None:
                round_trips[_site(match[0])].append(match)
        for trips in round_trips.values():
            if len(trips) < 2:
                continue  # ran once: not a loop
            for up, work, down in trips:
                source, target = _dtypes(up)
                yield Problem(
                    node=up,
                    message=f"The {_name(source)} → {_name(target)} → {op(work)} → {_name(source)} round trip runs "
                            "{count} times in one forward (in {where}); run the layer under torch.autocast or keep "
                            "one dtype.",
                    related=((work, f"{op(work)} in {_name(target)}"), (down, f"cast back to {_name(source)}")),
                )
        flagged = set(round_trips)
        invariant: dict[tuple, list[fx.Node]] = defaultdict(list)
        for cast in casts:
            if _site(cast) not in flagged:
                invariant[(_site(cast), _base(cast.args[0] if cast.args else None))].append(cast)
        for (_, base), repeats in invariant.items():
            if base is None or len(repeats) < 2:
                continue
            kept = [kept_output(capture, cast) for cast in repeats]
            for index, cast in enumerate(repeats):
                source, target = _dtypes(cast)
                yield Problem(
                    node=cast,
                    message=f"The same tensor is converted from {_name(source)} to {_name(target)} {{count}} times "
                            "in one forward (in {where}); convert it once, before the loop.",
                    # Converted once, backward would keep one copy instead of each pass's own.
                    saves_bytes=sum(kept) - max(kept) if index == 0 else 0,
                )


def _in_library(cast: fx.Node) -> bool:
    """Whether the cast ran in code the project does not own: an installed library's, or code with no frame of
    any file but torch's (a library's generated fx forward), which has no line of the project's to stand at."""
    return ran_in_library(cast) or not facts(cast).stack


def _caused_by_inputs(casts: list[fx.Node]):
    """A library converting one of the forward's inputs again and again (integer timesteps converted in every
    block of a diffusion transformer, a boolean mask in every layer): the user's input dtype causes it, so it is
    reported where the input is made (the factory), with the library's line as the cause. Casts of the
    library's own tensors happen whatever the user does and stay unreported."""
    by_input: dict[fx.Node, list[fx.Node]] = defaultdict(list)
    for cast in casts:
        base = _base(cast.args[0] if cast.args else None)
        if base is not None and base.op == "placeholder":
            by_input[base].append(cast)
    for given, repeats in by_input.items():
        if len(repeats) < 2:
            continue
        source, target = _dtypes(repeats[0])
        stack = facts(repeats[0]).stack
        library = f"`{library_name(stack[-1].file)}`" if stack else "the library's generated code"
        shape = tuple(tensor_meta(given).shape) if tensor_meta(given) is not None else ()
        number = given.name.removeprefix("arg")
        name = f"input {int(number) + 1}" if number.isdigit() else f"input `{given.name}`"
        for cast in repeats:
            yield Problem(
                node=given,
                message=f"The forward's {name} ({_name(source)}, shape {list(shape)}) is converted "
                        f"to {_name(target)} {{count}} times in one forward inside {library}; the input's dtype "
                        f"causes it: make the input {_name(target)} where it is created and the library uses it "
                        "as it is.",
                # The library's own line: the cast's node would be placed at the project's call instead.
                related=((facts(cast).stack[-1] if facts(cast).stack else cast,
                          f"converted to {_name(target)} in {library}"),),
            )


def _caused_by_configuration(capture, casts: list[fx.Node]):
    """A library's round trip in every layer around weights the user's configuration left in another dtype than
    the rest of the model (LoRA adapters kept in float32 on a bfloat16 base): reported where the user built or
    configured those layers, naming the weights. A round trip around weights in the model's own dtype is the
    library's design and stays unreported."""
    counts: dict[torch.dtype, int] = defaultdict(int)
    for node in capture.forward.nodes:
        meta = tensor_meta(node) if node.op == "get_attr" else None
        if meta is not None and meta.dtype.is_floating_point:
            counts[meta.dtype] += 1
    if not counts:
        return
    model_dtype = max(counts, key=counts.get)
    trips: dict[tuple, list[tuple[fx.Node, fx.Node, list[str]]]] = defaultdict(list)
    for down in casts:
        match = _round_trip(down)
        if match is None:
            continue
        up, work, _ = match
        source, target = _dtypes(up)
        weights = [n for n in work.all_input_nodes if n.op == "get_attr" and tensor_meta(n) is not None
                   and tensor_meta(n).dtype == target]
        if source == model_dtype and weights:
            trips[_site(up)].append((up, work, [str(w.target) for w in weights]))
    for repeats in trips.values():
        if len(repeats) < 2:
            continue
        for up, work, weights in repeats:
            source, target = _dtypes(up)
            stack = facts(up).stack
            library = f"`{library_name(stack[-1].file)}`" if stack else "the library"
            yield Problem(
                node=work,
                at_build_site=True,
                parameters=tuple(weights),
                message=f"{library} runs a {_name(source)} → {_name(target)} → {op(work)} → {_name(source)} round "
                        f"trip {{count}} times in one forward because {{parameters}} are {_name(target)} "
                        f"in a {_name(source)} model; the configuration built here decides that dtype: keep "
                        f"{{them}} in {_name(source)} (for peft, autocast_adapter_dtype=False).",
                related=((stack[-1] if stack else up, f"converted to {_name(target)} in {library}"),),
            )


def _dtypes(cast: fx.Node) -> tuple[torch.dtype, torch.dtype] | None:
    """(source, target) dtypes of a conversion that changes the dtype; None for no-op casts."""
    source = tensor_meta(cast.args[0]) if cast.args else None
    target = tensor_meta(cast)
    if source is None or target is None or source.dtype == target.dtype:
        return None
    return source.dtype, target.dtype


def _site(node: fx.Node) -> tuple:
    """The source position that ran the op: the same in every pass of a loop and every layer."""
    stack = facts(node).stack
    return stack[-1] if stack else ()


def _base(node) -> fx.Node | None:
    """The tensor behind views and indexing: `mask.to(dtype)[t]` and `mask[t].to(dtype)` both convert `mask`."""
    base = chain(node, VIEW).end
    return base if isinstance(base, fx.Node) else None


def _round_trip(down: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node] | None:
    """(up-cast, matrix op, down-cast) when `down` lowers precision back to what an up-cast raised it from,
    with matrix work and no numerically sensitive op in between."""
    dtypes = _dtypes(down)
    if dtypes is None or _PRECISION.get(dtypes[1], 0) >= _PRECISION.get(dtypes[0], 0):
        return None
    low = dtypes[1]

    def between(node: fx.Node) -> bool:  # the search ends at a cast, and never passes a sensitive op
        return op(node) not in NUMERICALLY_SENSITIVE and op(node) not in CAST

    for step in reach(down.all_input_nodes, UP, through=between, limit=MAX_PATTERN_STEPS):
        if op(step.node) in CAST and op(step.node) not in NUMERICALLY_SENSITIVE:
            pair = _dtypes(step.node)
            # The matrix work nearest the down-cast on the way.
            work = next((n for n in step.path()[:-1] if op(n) in MATMUL_CLASS), None)
            if pair is not None and pair[0] == low and work is not None:
                return step.node, work, down
    return None


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")

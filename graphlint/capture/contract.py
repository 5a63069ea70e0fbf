"""What rules may read: the `Capture` of one target and the typed facts of each forward-graph node.

The recorder (graphlint.capture.forward) stores a node's facts in its `meta` dict, where torch.fx tooling
expects them (`stack_trace`, `tensor_meta`); `facts(node)` reads them as one typed record, so a rule asks
for `facts(node).grad_region`, never for a string key.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import fx
from torch.fx.passes.shape_prop import TensorMetadata

from graphlint.capture.autograd import AutogradGraph
from graphlint.capture.debug import DebugSwitch
from graphlint.capture.forward import GradDisabledRegion, MutatedTensor, recorded_ops
from graphlint.capture.frames import Frame
from graphlint.capture.modules import ModuleInfo

if TYPE_CHECKING:
    from graphlint.capture.compile import CompileAnalysis
    from graphlint.memory.estimate import MemoryEstimate


@dataclass(frozen=True)
class ParameterInfo:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool
    built_at: tuple[Frame, ...] = ()  # the user stack that registered it; () when unknown

    @property
    def module_path(self) -> str:
        return self.name.rpartition(".")[0]


@dataclass
class Capture:
    """Everything one capture saw. Rules read it and never run the model again."""

    target: str
    device: str
    forward: fx.Graph  # each node's facts: `facts(node)`
    autograd: AutogradGraph
    parameters: dict[str, ParameterInfo]
    modules: dict[str, ModuleInfo]  # by qualified path; "" is the model itself
    factory: Frame | None = None  # the target factory's definition, the last resort for locations
    notes: list[str] = field(default_factory=list)
    # Debugging modes (anomaly detection, profilers) the target's code switched on before or during the forward.
    debug_switches: tuple[DebugSwitch, ...] = ()
    # Generators outside torch the forward drew from (`random`, `numpy.random`): what it ran may hold for this
    # draw only (a number of steps from `random.randrange`), though every capture draws the same.
    python_draws: tuple[str, ...] = ()
    # (recorded sequence, grown sequence, the trainable parameters that get a gradient at the grown one), from the
    # step run again with the inputs' dimension 1 grown (graphlint.capture.longer); None when not asked or unknown.
    longer_sequence: tuple[int, int, frozenset[str]] | None = None
    # What compiling the model with torch.compile showed (graphlint.capture.compile); None when not asked for.
    compiled: CompileAnalysis | None = None
    # The training step's memory (graphlint.memory), measured when a memory budget is set; None otherwise.
    memory: MemoryEstimate | None = None
    # Answers to questions several rules ask (graphlint.flow), computed once per capture; read-only once made.
    answers: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @functools.cached_property
    def ops(self) -> list[fx.Node]:
        """The recorded calls in execution order (computed once; every rule reads them)."""
        return recorded_ops(self.forward)

    @property
    def source_files(self) -> set[str]:
        """Every source file (user or library) that ran an op or built a module or parameter."""
        files = {frame.file for node in self.forward.nodes for frame in facts(node).stack}
        files |= {frame.file for info in self.modules.values() for frame in info.built_at}
        files |= {frame.file for info in self.parameters.values() for frame in info.built_at}
        if self.factory is not None:
            files.add(self.factory.file)
        return files


class NodeFacts:
    """The facts the capture recorded about one node of the forward graph, typed. A view of the node: it costs
    nothing to make and always agrees with the graph."""

    __slots__ = ("_meta",)

    def __init__(self, node: fx.Node) -> None:
        self._meta = node.meta

    @property
    def op(self) -> str | None:
        """The canonical op name (graphlint.opnames): `matmul` for `@`, `torch.matmul` and `torch.linalg.matmul`."""
        return self._meta.get("op")

    @property
    def stack(self) -> tuple[Frame, ...]:
        """The user frames that led to the call, outermost first; () when none was seen."""
        return self._meta.get("stack") or ()

    @property
    def module_stack(self) -> tuple[ModuleInfo, ...]:
        """The modules whose forward was running, outermost first."""
        return self._meta.get("module_stack") or ()

    @property
    def module_path(self) -> str:
        """The qualified path of the innermost running module ("" for the model itself or none)."""
        return self._meta.get("module_path", "")

    @property
    def library_module(self) -> ModuleInfo | None:
        """The innermost running module when it is torch.nn's (or another library's), not the project's own."""
        modules = self.module_stack
        return modules[-1] if modules and modules[-1].library else None

    @property
    def tensor_meta(self) -> TensorMetadata | tuple | None:
        """Shape, dtype and stride of the output (a tuple of them for several outputs)."""
        return self._meta.get("tensor_meta")

    @property
    def grad_mode(self) -> str:
        """`"enabled"`, `"no_grad"` or `"inference_mode"` while the op ran."""
        return self._meta.get("grad_mode", "enabled")

    @property
    def grad_region(self) -> GradDisabledRegion | None:
        """While autograd was off: the one entry into the `no_grad` or `inference_mode` block the op ran in.
        Ops of the same entry share the same object, so it can key a dict."""
        return self._meta.get("grad_region")

    @property
    def phase(self) -> str:
        """`"forward"`, or `"loss"` for ops that computed the loss from the output."""
        return self._meta.get("phase", "forward")

    @property
    def is_loss(self) -> bool:
        """Whether this node computed the loss the backward differentiated."""
        return bool(self._meta.get("loss"))

    @property
    def is_parameter(self) -> bool:
        """Whether this `get_attr` node reads one of the model's parameters or buffers (not a constant)."""
        return bool(self._meta.get("parameter"))

    @property
    def mutated(self) -> tuple[MutatedTensor, ...]:
        """The inputs the op wrote in place; () for out-of-place ops."""
        return self._meta.get("mutated", ())

    def ran_after_saving(self, saved_index: int) -> bool:
        """Whether the op ran after autograd saved the tensor numbered `saved_index` (graphlint numbers saved
        tensors in the order autograd saved them)."""
        saved_range = self._meta.get("saved_range")
        return saved_range is not None and saved_range[0] > saved_index

    @property
    def torch_helper(self) -> tuple[Frame, Frame] | None:
        """For a call made inside torch's own Python helper (not a module's forward): the user's call of the
        helper and torch's line in it; None otherwise."""
        return self._meta.get("torch_helper")

    @property
    def host_made(self) -> bool:
        """For a `get_attr` node of a tensor no recorded call produced: whether it was made on the host during
        the forward by a call the recorder cannot see (`torch.from_numpy`, `torch.FloatTensor(n)`)."""
        return bool(self._meta.get("host_made"))

    @property
    def made_at(self) -> tuple[Frame, ...]:
        """For such a tensor: the user stack of the assignment that made it; () when unknown."""
        return self._meta.get("made_at") or ()

    @property
    def sequence_nr(self) -> int | None:
        """The highest autograd sequence number among the outputs' grad_fns (links the node to the autograd
        graph); None when no output has one."""
        return self._meta.get("sequence_nr")


def facts(node: fx.Node) -> NodeFacts:
    """The typed facts of one forward-graph node."""
    return NodeFacts(node)

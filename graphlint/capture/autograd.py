"""The autograd capture: the `grad_fn` graph of one real forward, what each node saved, and one backward.

Saved tensors are watched with `saved_tensors_hooks`. Installing them switches off autograd's own in-place
check, so each pack records the tensor's version counter and storage and graphlint compares them itself; a
backward that would have raised "modified by an inplace operation" therefore runs, and the in-place write is
reported as a finding instead of a traceback.
"""

from __future__ import annotations

import bisect
import contextlib
from dataclasses import dataclass, field

import torch
from torch import fx

from graphlint.capture.forward import storage_key
from graphlint.capture.patches import Patches
from graphlint.errors import call_user_code, one_line, raised_by_graphlint

ACCUMULATE_GRAD = "torch::autograd::AccumulateGrad"


@dataclass(frozen=True)
class SavedTensor:
    """A tensor an autograd node kept for its backward."""

    index: int  # order of saving during the forward
    attribute: str  # the node attribute that holds it, e.g. "_saved_result"
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int  # the tensor's own bytes
    storage_nbytes: int  # the bytes its storage keeps alive (more than nbytes for a view of a larger tensor)
    storage: int | None
    version_saved: int  # version counter when saved
    version_after_forward: int  # version counter once the forward (and loss) finished
    parameter: bool = False  # a parameter or buffer (a weight kept for backward), not an activation

    @property
    def modified_after_save(self) -> bool:
        return self.version_after_forward != self.version_saved


@dataclass(eq=False)
class AutogradNode:
    """One node of the grad_fn graph."""

    index: int
    name: str  # e.g. "SoftmaxBackward0", "torch::autograd::AccumulateGrad"
    next: tuple[int, ...] = ()  # indices of the nodes this one sends gradients to
    saved: tuple[SavedTensor, ...] = ()
    parameter: str | None = None  # for AccumulateGrad: the parameter's qualified name
    sequence_nr: int | None = None
    forward_node: fx.Node | None = None  # the forward call that created it


@dataclass(frozen=True)
class BackwardOutcome:
    ran: bool
    error: str | None = None  # the exception backward raised, in one line
    reached: frozenset[str] = frozenset()  # parameters that received a gradient


@dataclass
class AutogradGraph:
    """The grad_fn graph reachable from the loss, in the order of a depth-first walk from it."""

    nodes: list[AutogradNode] = field(default_factory=list)
    root: AutogradNode | None = None
    backward: BackwardOutcome = BackwardOutcome(ran=False)

    @property
    def accumulate_grad(self) -> dict[str, AutogradNode]:
        return {n.parameter: n for n in self.nodes if n.parameter is not None}

    @property
    def saved(self) -> list[tuple[AutogradNode, SavedTensor]]:
        return [(n, s) for n in self.nodes for s in n.saved]


class _Packed:
    __slots__ = ("tensor", "index", "version", "storage")


class SavedTensorRecorder:
    """Packs every saved tensor into a record of its version and storage, and unpacks it unchanged."""

    def __init__(self) -> None:
        self.records: list[_Packed] = []
        self.unpacked: list[_Packed] = []
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._aside = 0  # how many torch.func transforms graphlint's hooks currently step aside for
        self._patches = Patches()

    def count(self) -> int:
        return len(self.records)

    def _pack(self, tensor: torch.Tensor) -> _Packed:
        record = _Packed()
        record.tensor = tensor
        record.index = len(self.records)
        record.version = tensor._version
        record.storage = storage_key(tensor)
        self.records.append(record)
        return record

    def _unpack(self, record: _Packed) -> torch.Tensor:
        self.unpacked.append(record)
        return record.tensor

    def __enter__(self) -> SavedTensorRecorder:
        self._hooks.__enter__()
        self._disable = torch.autograd.graph.disable_saved_tensors_hooks
        self._patches.replace(torch.autograd.graph, "disable_saved_tensors_hooks", self._stepping_aside)
        return self

    def __exit__(self, *exc) -> None:
        self._patches.restore()
        self._hooks.__exit__(*exc)

    @contextlib.contextmanager
    def _stepping_aside(self, error_message: str):
        """torch.func's grad, vjp and jacrev (and vmap before torch 2.5) refuse to run while any saved-tensor
        hook is set: graphlint's hooks step aside for them (their internals are not the model's autograd
        graph) and return after. Nested transforms (`vmap(grad(f))`) step aside once, at the outermost."""
        outermost = self._aside == 0
        if outermost:
            self._hooks.__exit__(None, None, None)
        self._aside += 1
        try:
            with self._disable(error_message):
                yield
        finally:
            self._aside -= 1
            if outermost:
                self._hooks.__enter__()

    def release(self) -> None:
        """Drop the tensors once backward is done, so the capture holds no activation memory."""
        for record in self.records:
            record.tensor = None


_saved_attributes: dict[type, tuple[str, ...]] = {}


def _saved_attribute_names(node) -> tuple[str, ...]:
    cls = type(node)
    names = _saved_attributes.get(cls)
    if names is None:
        names = tuple(a for a in dir(node) if a.startswith("_saved_"))
        if hasattr(node, "saved_tensors"):  # custom autograd.Function nodes
            names += ("saved_tensors",)
        _saved_attributes[cls] = names
    return names


def walk_autograd_graph(
    loss: torch.Tensor,
    recorder: SavedTensorRecorder,
    parameter_names: dict[int, str],
    forward_nodes: list[fx.Node],
    weight_storages: frozenset[int] = frozenset(),
) -> AutogradGraph:
    """Walk the grad_fn graph from the loss (before backward frees it) into an AutogradGraph.
    `weight_storages` are the storages of parameters and buffers, to tell weights from activations."""
    graph = AutogradGraph()
    if loss.grad_fn is None:
        return graph
    link = _ForwardLinker(forward_nodes)
    index_of: dict[object, int] = {}
    order: list = []
    stack = [loss.grad_fn]
    while stack:
        fn = stack.pop()
        if fn in index_of:
            continue
        index_of[fn] = len(order)
        order.append(fn)
        for next_fn, _ in reversed(fn.next_functions):
            if next_fn is not None and next_fn not in index_of:
                stack.append(next_fn)
    for index, fn in enumerate(order):
        name = fn.name()
        node = AutogradNode(
            index=index,
            name=name,
            next=tuple(index_of[n] for n, _ in fn.next_functions if n is not None),
            saved=_saved_by(fn, recorder, weight_storages),
        )
        if name == ACCUMULATE_GRAD:
            node.parameter = parameter_names.get(id(fn.variable), "<leaf tensor>")
        else:
            node.sequence_nr = fn._sequence_nr()
            node.forward_node = link(node.sequence_nr)
        graph.nodes.append(node)
    graph.root = graph.nodes[0]
    return graph


def _saved_by(fn, recorder: SavedTensorRecorder, weight_storages: frozenset[int]) -> tuple[SavedTensor, ...]:
    saved = []
    for attribute in _saved_attribute_names(fn):
        start = len(recorder.unpacked)
        try:
            getattr(fn, attribute)  # reading it runs our unpack hook, which names the packed record
        except Exception:  # already freed, or not readable on this node type
            continue
        for record in recorder.unpacked[start:]:
            tensor = record.tensor
            saved.append(
                SavedTensor(
                    index=record.index,
                    attribute=attribute,
                    shape=tuple(tensor.shape),
                    dtype=tensor.dtype,
                    nbytes=tensor.numel() * tensor.element_size(),
                    storage_nbytes=_storage_nbytes(tensor),
                    storage=record.storage,
                    version_saved=record.version,
                    version_after_forward=tensor._version,
                    parameter=record.storage in weight_storages,
                )
            )
    return tuple(saved)


def _storage_nbytes(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().nbytes()
    except Exception:  # tensors without a single storage: count the tensor itself
        return tensor.numel() * tensor.element_size()


class _ForwardLinker:
    """Finds the forward call that created an autograd node from sequence numbers: nodes are numbered in
    creation order, so a node belongs to the first call whose outputs' highest number is not below its own."""

    def __init__(self, forward_nodes: list[fx.Node]) -> None:
        pairs = [(n.meta["sequence_nr"], i, n) for i, n in enumerate(forward_nodes)
                 if n.meta.get("sequence_nr") is not None]
        pairs.sort(key=lambda p: (p[0], p[1]))
        self._numbers = [p[0] for p in pairs]
        self._nodes = [p[2] for p in pairs]

    def __call__(self, sequence_nr: int) -> fx.Node | None:
        position = bisect.bisect_left(self._numbers, sequence_nr)
        return self._nodes[position] if position < len(self._nodes) else None


# Reentrant activation checkpointing (torch.utils.checkpoint with use_reentrant=True) hides its block behind
# this node and refuses torch.autograd.grad: only a plain .backward() reaches the parameters inside.
REENTRANT_CHECKPOINT = "CheckpointFunctionBackward"


def run_backward(loss: torch.Tensor, parameters: dict[str, torch.Tensor],
                 graph: AutogradGraph | None = None) -> BackwardOutcome:
    """One real backward into the trainable parameters, leaving every `.grad` as it was."""
    trainable = [(name, p) for name, p in parameters.items() if p.requires_grad]
    if loss.grad_fn is None or not trainable:
        return BackwardOutcome(ran=False)
    reentrant = graph is not None and any(node.name == REENTRANT_CHECKPOINT for node in graph.nodes)
    try:
        if reentrant:
            reached = _backward_into_grads(loss, trainable)
        else:
            grads = call_user_code(torch.autograd.grad, loss, [p for _, p in trainable], allow_unused=True)
            reached = frozenset(name for (name, _), grad in zip(trainable, grads, strict=True) if grad is not None)
    except Exception as error:  # the capture keeps everything seen so far; rules still run
        if raised_by_graphlint(error):
            raise  # a bug in graphlint's hooks is not the model's backward failing
        return BackwardOutcome(ran=True, error=one_line(error))
    return BackwardOutcome(ran=True, reached=reached)


def _backward_into_grads(loss: torch.Tensor, trainable: list[tuple[str, torch.Tensor]]) -> frozenset[str]:
    """`.backward()`, reading which parameters got a `.grad`; every leaf's `.grad` is put back afterwards
    (the inputs' too: a leaf input that requires grad accumulates one as well)."""
    leaves = {id(p): p for _, p in trainable}
    for node in _graph_nodes(loss.grad_fn):
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):
            leaves.setdefault(id(variable), variable)
    before = {key: leaf.grad for key, leaf in leaves.items()}
    try:
        for leaf in leaves.values():
            leaf.grad = None
        call_user_code(torch.autograd.backward, loss)
        return frozenset(name for name, p in trainable if p.grad is not None)
    finally:
        for key, leaf in leaves.items():
            leaf.grad = before[key]


def _graph_nodes(root):
    seen, stack = set(), [root]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        yield node
        stack.extend(next_node for next_node, _ in node.next_functions)

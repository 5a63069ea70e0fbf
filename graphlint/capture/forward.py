"""The forward graph: every torch call the model made, at the level the user wrote it, as a `torch.fx.Graph`.

A `TorchFunctionMode` sees each torch function, tensor method and operator once, before dispatch (so
`F.scaled_dot_product_attention` is one node even on devices that lower it to matmul + softmax, and an
`nn.MultiheadAttention` is one `multi_head_attention_forward` node). The Python code simply runs, so
data-dependent branches, graph breaks and library objects in outputs cost nothing.

Each node's `meta` carries (rules read these through `graphlint.capture.contract.facts(node)`):
- `op`: the canonical op name (`"matmul"` for `@`, `torch.matmul` and `Tensor.matmul`; `"mul"` for
  `torch.multiply`, every alias folded by graphlint.opnames; `"data"` for `.data`).
- `stack`: user frames (`Frame`), outermost first; `stack_trace`: the same in torch.fx's text form.
- `module_stack`: the running modules (`ModuleInfo`), outermost first; `module_path`: the innermost one's path.
- `tensor_meta`: `torch.fx.passes.shape_prop.TensorMetadata` of the output (a tuple for several outputs).
- `grad_mode`: `"enabled"`, `"no_grad"` or `"inference_mode"`; `grad_region`: while disabled, the
  `GradDisabledRegion` (one entry of a `with torch.no_grad():` block); `phase`: `"forward"` or `"loss"`;
  `loss`: True on the node that computed the loss the backward differentiates.
- `mutated`: for in-place ops, `MutatedTensor`s (which input, its storage, its version before and after).
- `saved_range`: `(start, stop)` indices of the tensors autograd saved while this op ran.
- `sequence_nr`: the highest autograd sequence number among its outputs' `grad_fn`s (links the two graphs).
- `torch_helper`: for a call made by torch's own Python helper (not a module's forward), the helper the user
  called and the helper's line that made the call (`Frame`s), such as `pad_packed_sequence`.
- `host_made` (on `get_attr` nodes of tensors no recorded call produced): made on the host during the forward by a
  call the capture cannot see (`torch.from_numpy`, legacy constructors such as `torch.FloatTensor(n)`).
"""

from __future__ import annotations

import linecache
import operator
import os
import re
import sys
import types
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

import torch
from torch import fx
from torch.fx.passes.shape_prop import TensorMetadata
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from graphlint.capture.frames import Frame, StackRecorder, format_stack
from graphlint.errors import call_user_code
from graphlint.capture.modules import ModuleCallTracker
from graphlint.opnames import canonical

# Calls that return no tensor but are still worth a node: the model's values leave torch here.
HOST_OPS = frozenset({"item", "tolist", "numpy", "bool", "int", "float", "index"})
# Also kept although they return strings: printing or formatting a tensor reads its values on the host.
PRINT_OPS = frozenset({"repr", "format"})
_TENSOR_BASE = torch._C.TensorBase
_PLAIN_TYPES = (int, float, bool, str, complex, type(None), type(Ellipsis), torch.dtype, torch.device,
                torch.memory_format, torch.layout)


def op_name(func: Callable) -> str:
    """The name rules match on: `softmax` for F.softmax, torch.softmax and Tensor.softmax alike, and one
    name for all of an op's aliases (`mul` for torch.multiply; graphlint.opnames)."""
    name = getattr(func, "__name__", None)
    if name == "__get__":  # a tensor attribute read, such as `.data` or `.T`
        return getattr(getattr(func, "__self__", None), "__name__", "getattr")
    if name is None:
        return type(func).__name__
    if name.startswith("__") and name.endswith("__"):
        name = name[2:-2]  # __getitem__ -> getitem, __rsub__ -> rsub
    return canonical(name)


def _fx_call(func: Callable, name: str) -> tuple[str, Any]:
    """The torch.fx (op, target) pair for a call, matching what `torch.fx.symbolic_trace` records."""
    if name == "getitem":
        return "call_function", operator.getitem
    if name == "setitem":
        return "call_function", operator.setitem
    if getattr(func, "__name__", None) == "__get__":
        return "call_function", getattr
    owner = getattr(func, "__objclass__", None)
    qualname = getattr(func, "__qualname__", "")
    if owner is _TENSOR_BASE or qualname.startswith(("Tensor.", "TensorBase.")):
        return "call_method", func.__name__
    return "call_function", func


@dataclass(eq=False)
class GradDisabledRegion:
    """One stretch of the forward with autograd off: an entry into `with torch.no_grad():` or
    `with torch.inference_mode():` (a new object each time the block is entered)."""

    mode: str  # "no_grad" or "inference_mode"
    entered_at: tuple[Frame, ...] = ()  # the `with` statement's user stack; torch does not show inference_mode's
    common: tuple[Frame, ...] | None = None  # the stack prefix, by function, that all its ops share
    # torch.utils.checkpoint's own no_grad (reentrant mode): its backward recomputes the block with grad on,
    # so nothing inside is cut by it.
    checkpoint: bool = False
    # For a context entered by a decorator (`@torch.no_grad()` on a forward): the decorator's line, as a frame of
    # the decorated function; the whole call of that function runs with autograd off.
    decorator: Frame | None = None

    def include(self, stack: tuple[Frame, ...]) -> None:
        if self.common is None:
            self.common = stack
            return
        length = 0
        for mine, theirs in zip(self.common, stack, strict=False):  # stacks of different depths
            if (mine.file, mine.function) != (theirs.file, theirs.function):
                break
            length += 1
        self.common = self.common[:length]

    def statement_of(self, stack: tuple[Frame, ...]) -> tuple[Frame, ...]:
        """An op's stack cut at the function that holds the block: its last frame is the statement inside the
        block that led to the op, even when the op itself ran deeper (inside a submodule's forward)."""
        if self.entered_at:
            block = self.entered_at[-1]
            for index in range(len(stack) - 1, -1, -1):
                frame = stack[index]
                if (frame.file, frame.function) == (block.file, block.function) and frame.line >= block.line:
                    return stack[: index + 1]
            return stack
        return stack[: len(self.common)] if self.common else stack


@dataclass(frozen=True)
class MutatedTensor:
    """An input that an op wrote in place (found by its version counter moving)."""

    position: int | str  # positional index or keyword name
    storage: int | None  # identity of the storage written, shared by views and `.data`
    version_before: int
    version_after: int


def storage_key(tensor: torch.Tensor) -> int | None:
    """An identity for the memory a tensor lives in; views, `.data` and `.detach()` share it."""
    try:
        return tensor.untyped_storage()._cdata
    except Exception:  # sparse, nested or exotic subclass tensors have no single storage
        return None


def _tensor_meta(t: torch.Tensor) -> TensorMetadata | None:
    try:
        stride = t.stride()
    except Exception:
        stride = ()
    return TensorMetadata(tuple(t.shape), t.dtype, t.requires_grad, stride, None, False, {})


class ForwardRecorder(TorchFunctionMode):
    """Records torch calls into `self.graph` while active."""

    def __init__(
        self,
        stacks: StackRecorder,
        modules: ModuleCallTracker,
        names: dict[int, str],
        saved_count: Callable[[], int],
        kept: Callable[[], frozenset[int]] = frozenset,
    ) -> None:
        super().__init__()
        self.graph = fx.Graph()
        self.phase = "forward"
        self.failed_op: tuple[str, tuple[Frame, ...]] | None = None  # the op that raised, if one did
        self._stacks = stacks
        self._modules = modules
        self._names = names  # id(parameter or buffer) -> qualified name
        # The ids of the tensors held by the model, its inputs and globals, found when first needed (rarely).
        self._find_kept = kept
        self._kept: frozenset[int] | None = None
        self._fresh_host: list[tuple[fx.Node, torch.Tensor]] = []  # host-made tensors met in the call being recorded
        self._saved_count = saved_count
        self._node_of: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._attr_nodes: dict[int, fx.Node] = {}  # id(parameter or buffer) -> its get_attr node
        self._constants = 0
        self._first_call: fx.Node | None = None
        self._grad_region: GradDisabledRegion | None = None
        # One entry per grad-mode context entered and not yet left: the region it interrupted (None: grad was on).
        self._grad_contexts: list[GradDisabledRegion | None] = []

    # -- graph inputs ---------------------------------------------------------------------------------------

    def add_inputs(self, args: tuple, kwargs: dict) -> None:
        """Placeholders for every tensor the forward receives, named after its argument."""
        for index, value in enumerate(args):
            self._add_placeholders(value, f"arg{index}")
        for key, value in kwargs.items():
            self._add_placeholders(value, key)

    def _add_placeholders(self, value: Any, name: str) -> None:
        leaves, _ = torch.utils._pytree.tree_flatten(value)
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        for index, tensor in enumerate(tensors):
            node = self.graph.placeholder(name if len(tensors) == 1 else f"{name}_{index}")
            node.meta["tensor_meta"] = _tensor_meta(tensor)
            self._node_of[tensor] = node

    def add_output(self, value: Any) -> None:
        leaves, _ = torch.utils._pytree.tree_flatten(value)
        nodes = tuple(self._node_of[t] for t in leaves if isinstance(t, torch.Tensor) and t in self._node_of)
        self.graph.output(nodes)

    def mark_loss(self, loss: Any) -> None:
        """Mark the node that computed the loss (`meta["loss"]`), so that data flow can ask what reaches it."""
        node = self._node_of.get(loss) if isinstance(loss, torch.Tensor) else None
        if node is not None:
            node.meta["loss"] = True

    # -- recording ------------------------------------------------------------------------------------------

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        versions = [(key, t, t._version) for key, t in _top_level_tensors(args, kwargs) if not t.is_inference()]
        saved_start = self._saved_count()
        name = op_name(func)
        grad_was_enabled = name != "_set_grad_enabled" or torch.is_grad_enabled()
        try:
            out = call_user_code(func, *args, **kwargs)
        except Exception:
            if self.failed_op is None:
                self.failed_op = (op_name(func), self._stacks.user_stack(sys._getframe(1)))
            raise
        mutated = tuple(
            MutatedTensor(key, storage_key(t), before, t._version)
            for key, t, before in versions
            if t._version != before
        )  # inference tensors have no version counter: writes to them cannot break a backward
        if name == "_set_grad_enabled":  # entering or leaving `with torch.no_grad():`
            self._grad_mode_switched(sys._getframe(1), grad_was_enabled)
        if mutated or name in HOST_OPS or name in PRINT_OPS or _has_tensor(out):
            self._record(func, name, args, kwargs, out, mutated, (saved_start, self._saved_count()))
        return out

    def _grad_mode_switched(self, caller: types.FrameType, was_enabled: bool) -> None:
        """Leaving a grad-mode context returns to the region it interrupted (a user's no_grad inside a
        checkpointed block returns to the checkpoint's); entering one starts a region, owned by the checkpoint
        when torch.utils.checkpoint entered it."""
        owner, leaving, decorated = _grad_switch_owner(caller)
        if leaving and self._grad_contexts:
            self._grad_region = self._grad_contexts.pop()
            if not torch.is_grad_enabled() and self._grad_region is None:
                self._grad_region = GradDisabledRegion("no_grad", self._stacks.user_stack(caller))
            return
        # The region that was open; autograd may have been switched back on where torch did not show it.
        enclosing, self._grad_region = None if was_enabled else self._grad_region, None
        if enclosing is None and torch.is_inference_mode_enabled():
            enclosing = self._unseen_region("inference_mode", caller)  # entered before any op ran in it
        if not torch.is_grad_enabled():
            if enclosing is not None and not enclosing.checkpoint and owner != "checkpoint":
                self._grad_region = enclosing  # autograd was already off: the enclosing context is the cut
            else:
                decorator = self._stacks.decorator_of(decorated, _DECORATOR_NAMES) if decorated else None
                self._grad_region = GradDisabledRegion("no_grad", self._stacks.user_stack(caller),
                                                       checkpoint=owner == "checkpoint", decorator=decorator)
        self._grad_contexts.append(enclosing)

    def _unseen_region(self, mode: str, frame: types.FrameType) -> GradDisabledRegion:
        """A region entered where torch did not show it (inference_mode is switched in C++): only a decorator
        that entered it can still be seen, on the stack."""
        decorated = _decorated_by_inference_mode(frame, self._stacks.boundary) if mode == "inference_mode" else None
        decorator = self._stacks.decorator_of(decorated, _DECORATOR_NAMES) if decorated is not None else None
        return GradDisabledRegion(mode, decorator=decorator)

    def _record(self, func, name, args, kwargs, out, mutated, saved_range) -> None:
        kind, target = _fx_call(func, name)
        if target is getattr:
            fx_args, fx_kwargs = (self._arg(args[0]), name), {}
        else:
            fx_args, fx_kwargs = self._arg(tuple(args)), self._arg(dict(kwargs))
        node = self.graph.create_node(kind, target, fx_args, fx_kwargs)
        if self._first_call is None:
            self._first_call = node  # attributes are inserted before it, so inputs stay on top
        stack = self._stacks.user_stack(sys._getframe(2))  # 0: _record, 1: __torch_function__, 2: the caller
        module_stack = self._modules.current
        meta = node.meta
        meta["op"] = name
        meta["stack"] = stack
        meta["stack_trace"] = format_stack(stack)
        meta["module_stack"] = module_stack
        meta["module_path"] = module_stack[-1].path if module_stack else ""
        meta["grad_mode"] = mode = _grad_mode()
        if mode == "enabled":
            self._grad_region = None
        else:
            if self._grad_region is None or self._grad_region.mode != mode:
                self._grad_region = self._unseen_region(mode, sys._getframe(2))
            self._grad_region.include(stack)
            meta["grad_region"] = self._grad_region
        meta["phase"] = self.phase
        meta["saved_range"] = saved_range
        helper = self._stacks.torch_helper(sys._getframe(2))
        if helper is not None:
            meta["torch_helper"] = helper
        while self._fresh_host:
            made, tensor = self._fresh_host.pop()
            made.meta["made_at"] = _assignment_of(tensor, stack, sys._getframe(2))
        if mutated:
            meta["mutated"] = mutated
            for key, tensor in _top_level_tensors(args, kwargs):
                if any(m.position == key for m in mutated):
                    self._node_of[tensor] = node  # later reads of this tensor see the written value
        meta["tensor_meta"], meta["sequence_nr"] = self._bind_outputs(node, out)

    def _bind_outputs(self, node: fx.Node, out: Any):
        if isinstance(out, torch.Tensor):
            self._node_of[out] = node
            return _tensor_meta(out), _sequence_nr(out)
        if isinstance(out, (tuple, list)):
            metas, sequence = [], None
            for index, item in enumerate(out):
                if isinstance(item, torch.Tensor):
                    item_node = self.graph.call_function(operator.getitem, (node, index))
                    item_node.meta.update(node.meta)
                    item_node.meta["op"] = "getitem"
                    item_node.meta["tensor_meta"] = _tensor_meta(item)
                    self._node_of[item] = item_node
                    metas.append(item_node.meta["tensor_meta"])
                    nr = _sequence_nr(item)
                    sequence = nr if sequence is None or (nr is not None and nr > sequence) else sequence
                else:
                    metas.append(None)
            return tuple(metas), sequence
        return None, None

    def _arg(self, value: Any) -> Any:
        """A call argument as torch.fx stores it: tensors become the nodes that produced them."""
        if isinstance(value, torch.Tensor):
            return self._node_for(value)
        if isinstance(value, _PLAIN_TYPES):
            return value
        if isinstance(value, (tuple, list)):
            mapped = [self._arg(v) for v in value]
            return mapped if isinstance(value, list) else tuple(mapped)
        if isinstance(value, dict):
            return {k: self._arg(v) for k, v in value.items()}
        if isinstance(value, slice):
            return slice(self._arg(value.start), self._arg(value.stop), self._arg(value.step))
        return f"<{type(value).__name__}>"  # opaque objects are named, not kept alive

    def _node_for(self, tensor: torch.Tensor) -> fx.Node:
        node = self._node_of.get(tensor)
        if node is not None:
            return node
        key = id(tensor)
        # Only the model's own tensors are looked up by id: they live as long as the model, while the id of a
        # temporary that died is reused by the next tensor Python makes.
        node = self._attr_nodes.get(key) if key in self._names else None
        if node is None:
            name = self._names.get(key)
            if name is None:
                name = f"_tensor_constant{self._constants}"
                self._constants += 1
            if self._first_call is None:
                node = self.graph.get_attr(name)
            else:
                with self.graph.inserting_before(self._first_call):
                    node = self.graph.get_attr(name)
            node.meta["tensor_meta"] = _tensor_meta(tensor)
            node.meta["parameter"] = key in self._names
            node.meta["host_made"] = key not in self._names and self._made_on_host(tensor)
            if node.meta["host_made"]:
                self._fresh_host.append((node, tensor))
            if key in self._names:
                self._attr_nodes[key] = node
            self._node_of[tensor] = node
        return node


    def _made_on_host(self, tensor: torch.Tensor) -> bool:
        """Whether a tensor that no recorded call produced was made on the host during the forward, by a call
        torch does not route through the capture (`torch.from_numpy`, `torch.FloatTensor(n)`, `frombuffer`):
        on the CPU, not held by the model, its inputs or a module's globals, and not a view of a recorded tensor
        (iterating a tensor yields such views)."""
        if tensor.device.type != "cpu" or tensor._base is not None:
            return False
        if self._kept is None:
            self._kept = self._find_kept()
        if id(tensor) in self._kept:
            return False
        storage = storage_key(tensor)
        return storage is not None and all(storage_key(known) != storage for known in self._node_of.keys())


_GRAD_MODE_FILE = os.path.join("torch", "autograd", "grad_mode.py")
_CHECKPOINT_FILE = os.path.join("torch", "utils", "checkpoint.py")
_CONTEXTLIB_FILE = os.path.join("torch", "utils", "_contextlib.py")
# How the grad-mode decorators are spelled, to find the decorator's line among a function's decorators.
_DECORATOR_NAMES = ("no_grad", "inference_mode", "set_grad_enabled")


def _grad_switch_owner(frame: types.FrameType | None) -> tuple[str, bool, Callable | None]:
    """Who switched grad mode ("checkpoint" for torch.utils.checkpoint, else "user"), whether it was a
    context being left, and the function whose decorator entered it (None for a `with` statement): read from
    the frames above torch's grad-mode context managers."""
    leaving = False
    while frame is not None and frame.f_code.co_filename.endswith(_GRAD_MODE_FILE):
        leaving = leaving or frame.f_code.co_name == "__exit__"
        frame = frame.f_back
    owner = "checkpoint" if frame is not None and frame.f_code.co_filename.endswith(_CHECKPOINT_FILE) else "user"
    return owner, leaving, _decorated_function(frame)


def _decorated_function(frame: types.FrameType | None) -> Callable | None:
    """The function a torch grad-mode decorator wraps, when `frame` is that decorator's wrapper running it."""
    if frame is None or not frame.f_code.co_filename.endswith(_CONTEXTLIB_FILE):
        return None
    if frame.f_code.co_name not in ("decorate_context", "generator_context"):
        return None
    function = frame.f_locals.get("func")
    return function if callable(function) else None


def _decorated_by_inference_mode(frame: types.FrameType | None, boundary: types.FrameType | None) -> Callable | None:
    """The outermost function on the stack whose `@torch.inference_mode()` decorator is running it (the
    decorator that switched inference mode on), or None."""
    found = None
    while frame is not None and frame is not boundary:
        function = _decorated_function(frame)
        if function is not None:
            factory = frame.f_locals.get("ctx_factory")
            context = getattr(factory, "__self__", None)  # the decorator object: ctx_factory is its `clone`
            if isinstance(context, torch.inference_mode) and getattr(context, "mode", True):
                found = function
        frame = frame.f_back
    return found


def _assignment_of(tensor: torch.Tensor, stack: tuple[Frame, ...], frame: types.FrameType | None) -> tuple[Frame, ...]:
    """Where a tensor first used in the statement at the end of `stack` was made: when a local variable of that
    function holds it, the nearest earlier line of the function that assigns the variable from something else;
    else that statement (a temporary, as in `torch.FloatTensor(n).uniform_()`)."""
    if not stack:
        return stack
    here = stack[-1]
    while frame is not None and not (frame.f_code.co_name == here.function and frame.f_lineno >= here.line
                                     and os.path.abspath(frame.f_code.co_filename) == here.file):
        frame = frame.f_back
    if frame is None:
        return stack
    names = [name for name, value in frame.f_locals.items() if value is tensor]
    if not names:
        return stack
    alternatives = "|".join(map(re.escape, names))
    assigns = re.compile(r"^\s*(?:[\w.\[\], ]*[, ]\s*)?(?:" + alternatives + r")\s*(?:,[\w.\[\], ]*)?(?::[^=]*)?=(?!=)")
    mentions = re.compile(r"\b(?:" + alternatives + r")\b")
    for line in range(here.line - 1, frame.f_code.co_firstlineno, -1):
        text = linecache.getline(here.file, line)
        found = assigns.match(text)
        # `v = v.cuda()` (perhaps on a path not taken) moves the tensor; the line that made it assigns something else
        if found and not mentions.search(text[found.end():]):
            return (*stack[:-1], Frame(here.file, line, here.function))
    return stack


def _grad_mode() -> str:
    if torch.is_grad_enabled():
        return "enabled"
    return "inference_mode" if torch.is_inference_mode_enabled() else "no_grad"


def _top_level_tensors(args: tuple, kwargs: dict):
    for index, value in enumerate(args):
        if isinstance(value, torch.Tensor):
            yield index, value
    for key, value in kwargs.items():
        if isinstance(value, torch.Tensor):
            yield key, value


def _has_tensor(out: Any) -> bool:
    if isinstance(out, torch.Tensor):
        return True
    if isinstance(out, (tuple, list)):
        return any(isinstance(item, torch.Tensor) for item in out)
    return False


def _sequence_nr(tensor: torch.Tensor) -> int | None:
    grad_fn = tensor.grad_fn
    return grad_fn._sequence_nr() if grad_fn is not None else None


def kept_tensors(model: torch.nn.Module, args: tuple, kwargs: dict) -> frozenset[int]:
    """The ids of the tensors that exist before the forward and that it may read without recording where they
    came from: attributes of the model's modules and classes, the globals of the files that define them, and
    tensors anywhere inside the inputs (a cache object's fields)."""
    found: set[int] = set()
    seen: set[int] = set()

    def walk(value: Any, depth: int) -> None:
        if isinstance(value, torch.Tensor):
            found.add(id(value))
            return
        if depth <= 0 or id(value) in seen or isinstance(value, (*_PLAIN_TYPES, types.ModuleType, type)):
            return
        seen.add(id(value))
        if isinstance(value, dict):
            items = list(value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            items = list(value)
        elif isinstance(value, torch.nn.Module) or callable(value):
            return  # modules are walked on their own; functions hold no inputs
        else:
            items = list(getattr(value, "__dict__", {}).values())
        for item in items:
            walk(item, depth - 1)

    defining = set()
    for module in model.modules():
        for value in vars(module).values():
            walk(value, 2)
        for cls in type(module).__mro__:
            defining.add(cls.__module__)
            for value in vars(cls).values():
                walk(value, 1)
    for name in defining:
        for value in vars(sys.modules.get(name, types)).values():
            walk(value, 2)
    walk(list(args), 4)
    walk(list(kwargs.values()), 4)
    return frozenset(found)


def recorded_ops(graph: fx.Graph) -> list[fx.Node]:
    """The call nodes of a forward graph in execution order (no placeholders, attributes or output)."""
    return [n for n in graph.nodes if n.op in ("call_function", "call_method")]

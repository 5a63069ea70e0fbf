"""Modules of the captured model: where the user built each one, and which ones are running at each op.

The build site matters because an op inside a torch.nn module (the ReLU of `nn.ReLU(inplace=True)` in an
`nn.Sequential`) is best shown where the user wrote that module, not inside torch.
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from graphlint.capture.frames import Frame, StackRecorder
from graphlint.capture.patches import Patches
from graphlint.errors import call_user_code


@dataclass(frozen=True)
class ModuleInfo:
    """One submodule of the captured model."""

    path: str  # qualified name, "" for the model itself
    type_name: str  # "torch.nn.modules.linear.Linear"
    library: bool  # defined by torch (torch.nn), so its forward is not the user's code
    built_at: tuple[Frame, ...] = ()  # user frames that constructed it, outermost first; () when unknown
    # A `transformers` model class's `_supports_sdpa`: whether it can be built with attn_implementation="sdpa";
    # None for any other class.
    supports_sdpa: bool | None = None
    # What code outside the model can observe of its calls, in the model as built: the kinds of hook that
    # would fire on it ("forward", "global forward-pre", ...), and how many parameters and buffers it holds.
    hooks: tuple[str, ...] = ()
    tensors: int = 0

    @property
    def class_name(self) -> str:
        return self.type_name.rsplit(".", 1)[-1]


def _type_name(module: nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


class BuildSiteRecorder:
    """While active, remembers the user stack at every `nn.Module.__init__` and parameter registration.

    Parameters have torch's registration hook. Modules have no construction hook, so `nn.Module.__init__` is
    wrapped for the duration of the factory call only and always restored.
    """

    def __init__(self, stacks: StackRecorder) -> None:
        self._stacks = stacks
        self._sites: dict[int, tuple[weakref.ref, tuple[Frame, ...]]] = {}
        self._patches = Patches()
        self._parameter_hook = None

    def __enter__(self) -> BuildSiteRecorder:
        original = nn.Module.__init__
        recorder = self

        def __init__(module, *args, **kwargs):
            if not recorder._has(module):
                caller = _outside_own_init(sys._getframe(1), module)
                recorder._sites[id(module)] = (weakref.ref(module), recorder._stacks.user_stack(caller))
            call_user_code(original, module, *args, **kwargs)

        def parameter_registered(module, name, parameter):
            if parameter is not None and not recorder._has(parameter):
                recorder._sites[id(parameter)] = (weakref.ref(parameter), recorder._stacks.user_stack(sys._getframe(1)))

        self._patches.replace(nn.Module, "__init__", __init__)
        self._parameter_hook = torch.nn.modules.module.register_module_parameter_registration_hook(parameter_registered)
        return self

    def __exit__(self, *exc) -> None:
        self._patches.restore()
        self._parameter_hook.remove()

    def _has(self, thing) -> bool:
        """Whether this very object's site is recorded (a nested `__init__` of one module keeps the outermost).
        An entry under its id whose object was freed belongs to another object: CPython reuses the id of a
        module the factory built and dropped, and keeping that entry left the new module without a site."""
        entry = self._sites.get(id(thing))
        return entry is not None and entry[0]() is thing

    def built_at(self, thing: nn.Module | nn.Parameter) -> tuple[Frame, ...]:
        """The user stack that constructed a module or registered a parameter; () when unknown."""
        entry = self._sites.get(id(thing))
        if entry is None or entry[0]() is not thing:
            return ()
        return entry[1]


def _outside_own_init(frame, module: nn.Module):
    """The first frame that is not one of the module's own `__init__`s (its class's and its bases'), so a
    user-defined module is placed where it was constructed, not at its `super().__init__()` line."""
    while frame is not None and frame.f_code.co_name == "__init__" and frame.f_code.co_argcount:
        if frame.f_locals.get(frame.f_code.co_varnames[0]) is not module:
            break
        frame = frame.f_back
    return frame


def describe_modules(model: nn.Module, build_sites: BuildSiteRecorder | None) -> dict[int, ModuleInfo]:
    """ModuleInfo for every submodule, keyed by `id(module)`; a shared module keeps its first name."""
    infos: dict[int, ModuleInfo] = {}
    everywhere = _global_hooks()
    for path, module in model.named_modules():
        infos[id(module)] = ModuleInfo(
            path=path,
            type_name=_type_name(module),
            library=type(module).__module__.startswith("torch."),
            built_at=build_sites.built_at(module) if build_sites else (),
            supports_sdpa=_supports_sdpa(type(module)),
            hooks=(*_own_hooks(module), *everywhere),
            tensors=sum(1 for _ in module.parameters()) + sum(1 for _ in module.buffers()),
        )
    return infos


_HOOKS = {"forward-pre": ("_forward_pre_hooks",), "forward": ("_forward_hooks",),
          "backward-pre": ("_backward_pre_hooks",), "backward": ("_backward_hooks",)}


def _own_hooks(module: nn.Module) -> list[str]:
    """The kinds of call hook registered on this module (a full backward hook is a "backward" one)."""
    return [kind for kind, names in _HOOKS.items() if any(getattr(module, name, None) for name in names)]


def _global_hooks() -> list[str]:
    """The kinds of global module call hook registered now, other than graphlint's own (none is, before the
    capture's forward starts; a recorder of graphlint's might be)."""
    hooks = torch.nn.modules.module
    found = []
    for kind, name in (("forward-pre", "_global_forward_pre_hooks"), ("forward", "_global_forward_hooks"),
                       ("backward-pre", "_global_backward_pre_hooks"), ("backward", "_global_backward_hooks")):
        registered = getattr(hooks, name, None) or {}
        if any(not str(getattr(hook, "__module__", "") or "").startswith("graphlint") for hook in registered.values()):
            found.append(f"global {kind}")
    return found


def _supports_sdpa(kind: type) -> bool | None:
    value = getattr(kind, "_supports_sdpa", None)
    return value if isinstance(value, bool) else None


class ModuleCallTracker:
    """Keeps the stack of running modules of the captured model with global forward hooks.

    `current` is one shared tuple per module entry, so ops in the same module share it at no cost.
    """

    def __init__(self, modules: dict[int, ModuleInfo]) -> None:
        self._modules = modules
        self._stack: list[ModuleInfo | None] = []
        self.current: tuple[ModuleInfo, ...] = ()
        self._handles: list = []

    def _enter(self, module, args) -> None:
        self._stack.append(self._modules.get(id(module)))
        self._refresh()

    def _leave(self, module, args, output) -> None:
        if self._stack:
            self._stack.pop()
            self._refresh()

    def _refresh(self) -> None:
        self.current = tuple(info for info in self._stack if info is not None)

    def __enter__(self) -> ModuleCallTracker:
        hooks = torch.nn.modules.module
        self._handles = [
            hooks.register_module_forward_pre_hook(self._enter),
            hooks.register_module_forward_hook(self._leave, always_call=True),
        ]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

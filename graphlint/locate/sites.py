"""Which source line a forward-graph node belongs to, before its exact span is found.

The rules, in order:
- an op inside a torch.nn module goes where the user called it, or, for a module inside a container such as
  `nn.Sequential(...)` (or when the rule asks for it), where the user built it;
- otherwise the innermost first-party frame; when the op itself ran in a library (a `transformers` model),
  the library line becomes a related location;
- with no first-party frame at all: where the user built the enclosing model, else the target factory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from graphlint.project import Project

if TYPE_CHECKING:  # type names only: locating spans must not need torch (a cached run never imports it)
    from torch import fx

    from graphlint.capture.frames import Frame


@dataclass(frozen=True)
class Site:
    """A frame plus what kind of expression to look for in it.

    `style`: "call" (a function call), "method" (a tensor method call), "build" (the module constructor call),
    "def" (a function definition). `op` is the op's name when the frame is the op's own call site.
    """

    frame: Frame
    style: str = "call"
    op: str | None = None


def own_site(node: fx.Node) -> Site | None:
    """The node's innermost frame, as the expression that called the op."""
    stack = node.meta.get("stack") or ()
    if not stack:
        return None
    return Site(stack[-1], "method" if node.op == "call_method" else "call", node.meta.get("op"))


def node_sites(node: fx.Node, project: Project, factory: Frame | None, at_build_site: bool = False):
    """(primary site, library site or None) for a node."""
    stack = node.meta.get("stack") or ()
    modules = node.meta.get("module_stack") or ()
    innermost = own_site(node)
    library_module = modules[-1] if modules and modules[-1].library else None
    if library_module is not None:
        built = _first_party(library_module.built_at, project)
        in_container = len(modules) >= 2 and modules[-2].library
        if built is not None and (at_build_site or in_container):
            return Site(built, "build"), None
        if innermost is not None:  # the op ran inside torch: its innermost frame is the module's call
            innermost = Site(innermost.frame, "call")
    if innermost is not None and project.is_first_party(innermost.frame.file):
        return innermost, None
    called_from = _first_party(stack, project)
    if called_from is not None:
        return Site(called_from, "call"), innermost
    for module in reversed(modules):
        built = _first_party(module.built_at, project)
        if built is not None:
            return Site(built, "build"), innermost
    if factory is not None:
        return Site(factory, "def"), innermost
    return innermost, None


def _first_party(frames: tuple[Frame, ...], project: Project) -> Frame | None:
    for frame in reversed(frames):
        if project.is_first_party(frame.file):
            return frame
    return None


def stack_sites(stack: tuple[Frame, ...], project: Project, factory: Frame | None):
    """(primary site, library site or None) for a problem anchored at a user stack rather than a node."""
    innermost = Site(stack[-1], "call") if stack else None
    own = _first_party(stack, project)
    if own is not None:
        return Site(own, "call"), None if own == stack[-1] else innermost
    if factory is not None:
        return Site(factory, "def"), innermost
    return innermost, None

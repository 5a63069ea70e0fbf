"""The one way a capture patches torch for the duration of a recording (a wrapped `nn.Module.__init__`, watched
`set_anomaly_enabled` and profiler entries, saved-tensor hooks that step aside): each replacement remembers what
it found, and `restore` undoes them all in reverse order, so nothing of graphlint's stays in torch whatever the
model raised.
"""

from __future__ import annotations

_INHERITED = object()  # a replaced attribute that its owner only inherited: removed again, not set back


class Patches:
    """Attribute replacements, undone together."""

    def __init__(self) -> None:
        self._undo: list[tuple[object, str, object]] = []

    def replace(self, owner: object, name: str, value: object) -> None:
        """Set `owner.name` to `value` until `restore`."""
        self._undo.append((owner, name, vars(owner).get(name, _INHERITED)))
        setattr(owner, name, value)

    def restore(self) -> None:
        """Put back every replaced attribute, the last replaced first."""
        while self._undo:
            owner, name, original = self._undo.pop()
            if original is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


def compiled_code_eager():
    """A context in which code the model compiled (`@torch.compile` on a method, `torch.compile(fn)` in its
    forward) runs eagerly: the recorders see its torch calls, and dynamo never traces the recorders themselves
    (which fails on the meta device, prints its recompile warnings and shows dynamo's own switches as the
    model's). `torch._dynamo.config.disable` reads the same on every torch graphlint supports."""
    import torch._dynamo

    return torch._dynamo.config.patch(disable=True)

"""The training step run again at a longer sequence, to tell which trainable parameters get gradients only there
(a layer a chunked model uses from its second chunk on): a finding that they get none then holds for the
recorded length only (GL203 says both lengths).

The inputs grow as the torch.compile analysis grows them (graphlint.capture.compile), along the sequence
(graphlint.capture.dimensions). The
step runs on a copy of the model under preserved global state, with its prints and warnings kept from the user:
nothing it does reaches the model, the capture or the user's state. Any failure leaves the question unanswered.
"""

from __future__ import annotations

import contextlib
import copy
import io
import warnings

import torch

from graphlint.capture import dimensions
from graphlint.capture.compile import grown
from graphlint.capture.debug import debug_modes_off
from graphlint.capture.isolation import preserved_global_state
from graphlint.capture.loss import choose_loss
from graphlint.capture.patches import compiled_code_eager
from graphlint.target import Target

GROWTH = 4  # four times the recorded sequence: a recorded 32 below a chunk of 64 reaches the second chunk
_LONGEST = 4096  # longer steps cost more than the answer is worth


def gradients_at_longer_sequence(made: Target) -> tuple[int, int, frozenset[str]] | None:
    """(recorded sequence, grown sequence, the trainable parameters that get a gradient at the grown one); None
    when the inputs have no sequence, the grown length is too long, or the step cannot run at it."""
    size = dimensions.sizes(made.args, made.kwargs or {}).get("seq")
    if size is None or size * GROWTH > _LONGEST:
        return None
    try:
        # Its prints and warnings would repeat the capture's own: the user sees one step's.
        with preserved_global_state(), torch.enable_grad(), debug_modes_off(), compiled_code_eager(), \
                warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            twin = copy.deepcopy(made.model)
            args, kwargs = grown(made.args, made.kwargs or {}, "seq", size, size * (GROWTH - 1))
            loss = choose_loss(twin(*args, **kwargs), made.loss)
            trainable = [(name, p) for name, p in twin.named_parameters() if p.requires_grad]
            if loss is None or loss.grad_fn is None or not trainable:
                return None
            grads = torch.autograd.grad(loss, [p for _, p in trainable], allow_unused=True)
    except Exception:  # the model cannot run at that length, or cannot be copied: nothing is known
        return None
    reached = frozenset(name for (name, _), grad in zip(trainable, grads, strict=True) if grad is not None)
    return size, size * GROWTH, reached

"""Global state a capture may change, saved before and restored after, so one target cannot affect the next."""

from __future__ import annotations

import contextlib
import sys

import torch


@contextlib.contextmanager
def preserved_global_state():
    """Restore torch's default dtype, grad mode, anomaly mode, CPU random state and `sys.path` on exit."""
    dtype = torch.get_default_dtype()
    grad = torch.is_grad_enabled()
    anomaly = torch.is_anomaly_enabled()
    rng = torch.get_rng_state()
    path = list(sys.path)
    try:
        yield
    finally:
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
        torch.set_anomaly_enabled(anomaly)
        torch.set_rng_state(rng)
        sys.path[:] = path

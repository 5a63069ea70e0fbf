"""Global state a capture may change, saved before and restored after, so one target cannot affect the next:
torch's default dtype and device, grad and anomaly modes, autocast, global flags (deterministic algorithms, matmul
precision, cuDNN and TF32 switches, threads), every random state (torch's CPU and CUDA generators, Python's,
NumPy's), and `sys.path`. Every capture also starts from the same seeds (`seed_everything`), so a run is
repeatable even where the forward draws from Python's or NumPy's generators (`random.randrange` choosing a
number of steps), and `python_draws` tells whether it did: a verdict may then hold for this draw only.
"""

from __future__ import annotations

import contextlib
import importlib.util
import random
import sys

import torch
import torch.utils._device


_ABSENT = object()  # an attribute that was not set, as opposed to one set to None


def _device_and_modes():
    """The default device as torch keeps it: the global device context, the current device, and the stack
    of torch-function modes that holds it. set_default_device cannot restore this: setting even "cpu"
    installs a mode, and a context entered inside another one remembers it and pushes it back on exit."""
    holder = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)
    return (getattr(holder, "device_context", _ABSENT), getattr(torch.utils._device, "CURRENT_DEVICE", _ABSENT),
            torch.overrides._get_current_function_mode_stack())


def _restore_device_and_modes(state) -> None:
    context, current, modes = state
    while torch.overrides._len_torch_function_stack():
        torch.overrides._pop_mode()
    for mode in modes:
        torch.overrides._push_mode(mode)
    holder = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)
    # Before torch 2.10, get_default_device reads `.device_context.device` whenever the attribute exists, so
    # an attribute that was absent must be absent again, never None.
    _restore_attribute(holder, "device_context", context)
    _restore_attribute(torch.utils._device, "CURRENT_DEVICE", current)


def _restore_attribute(owner, name: str, value) -> None:
    if owner is None:
        return
    if value is _ABSENT:
        if hasattr(owner, name):
            delattr(owner, name)
    else:
        setattr(owner, name, value)


def _flags():
    """(name, read, write) for torch's process-wide switches."""
    backends = torch.backends
    return [
        ("default dtype", torch.get_default_dtype, torch.set_default_dtype),
        ("default device", _device_and_modes, _restore_device_and_modes),
        ("grad mode", torch.is_grad_enabled, torch.set_grad_enabled),
        ("anomaly mode", torch.is_anomaly_enabled, torch.set_anomaly_enabled),
        ("deterministic algorithms",
         lambda: (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()),
         lambda value: torch.use_deterministic_algorithms(value[0], warn_only=value[1])),
        ("float32 matmul precision", torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        ("distribution argument checks", _validating_distributions, _validate_distributions),
        ("threads", torch.get_num_threads, torch.set_num_threads),
        ("autocast", _autocast, _set_autocast),
        ("cudnn", lambda: (backends.cudnn.enabled, backends.cudnn.benchmark, backends.cudnn.deterministic),
         lambda v: (setattr(backends.cudnn, "enabled", v[0]), setattr(backends.cudnn, "benchmark", v[1]),
                    setattr(backends.cudnn, "deterministic", v[2]))),
        ("tf32", lambda: (backends.cuda.matmul.allow_tf32, backends.cudnn.allow_tf32),
         lambda v: (setattr(backends.cuda.matmul, "allow_tf32", v[0]), setattr(backends.cudnn, "allow_tf32", v[1]))),
    ]


def _autocast():
    return [(kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)) for kind in ("cpu", "cuda")]


def _set_autocast(state) -> None:
    for kind, enabled, dtype in state:
        torch.set_autocast_enabled(kind, enabled)
        torch.set_autocast_dtype(kind, dtype)


def _random_states():
    """(read, write) for every random generator a factory or forward may seed or draw from."""
    states = [(torch.get_rng_state, torch.set_rng_state), (random.getstate, random.setstate)]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states.append((torch.cuda.get_rng_state_all, torch.cuda.set_rng_state_all))
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        states.append((numpy.random.get_state, numpy.random.set_state))
    return states


@contextlib.contextmanager
def preserved_global_state():
    """Restore all of the module docstring's state on exit, whatever happened inside."""
    saved = [(write, read()) for _, read, write in _flags()]
    randoms = [(write, read()) for read, write in _random_states()]
    path = list(sys.path)
    try:
        yield
    finally:
        for write, value in saved:
            write(value)
        for write, value in randoms:
            write(value)
        sys.path[:] = path


SEED = 0


def seed_everything(seed: int = SEED) -> None:
    """Seed torch's, Python's and NumPy's generators; NumPy is imported for it when installed, since a factory
    that imports it later would otherwise draw from a generator seeded by the operating system."""
    torch.manual_seed(seed)
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is None and importlib.util.find_spec("numpy") is not None:
        import numpy
    if numpy is not None:
        numpy.random.seed(seed)


def python_states() -> dict[str, object]:
    """The states of the generators Python code draws from outside torch: Python's, and NumPy's if loaded."""
    states = {"random": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kind, keys, position, has_gauss, gauss = numpy.random.get_state()
        states["numpy.random"] = (kind, keys.tobytes(), position, has_gauss, gauss)
    return states


def python_draws(before: dict[str, object]) -> tuple[str, ...]:
    """Which of those generators were drawn from since `before` (a `python_states()`)."""
    after = python_states()
    return tuple(name for name, state in after.items() if name in before and before[name] != state)


def _validating_distributions() -> bool:
    import torch.distributions

    return torch.distributions.Distribution._validate_args


def _validate_distributions(value: bool) -> None:
    import torch.distributions

    torch.distributions.Distribution.set_default_validate_args(value)


def torch_defaults() -> None:
    """Undo what graphlint's own use of torch changed for the whole process before the user's code runs: the first
    torch.compile in a process (the warm parent's, for the torch.compile rules) switches off torch.distributions'
    argument checks everywhere, which would hide their host syncs (GL103) from every later capture."""
    _validate_distributions(__debug__)

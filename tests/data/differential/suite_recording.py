"""Tests whose arguments, inputs or tracing once made the recorder raise inside them."""

import warnings

import pytest
import torch

from zoo import Flagged, LazyShape, Lookup, Settings, Shaped


def test_a_shape_whose_length_raises():
    model = Shaped(LazyShape((2, 8)), settings=Settings(8))
    assert model(torch.randn(3, 8)).shape == (3, 8)


@pytest.mark.filterwarnings("error::torch.jit.TracerWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_jit_trace_with_tracer_warnings_as_errors():
    ids = torch.randint(0, 16, (2, 5))
    traced = torch.jit.trace(Lookup(), (ids,))
    print(traced(ids).shape)


def test_fx_symbolic_trace():
    graph = torch.fx.symbolic_trace(Lookup())
    print(sorted(node.op for node in graph.graph.nodes))


def test_keyword_inputs():
    model = Flagged()
    assert model(torch.randn(2, 8), flag=True).shape == (2, 8)


def test_float64_by_default():
    torch.set_default_dtype(torch.float64)
    try:
        model = Flagged()
        out = model(torch.randn(4, 8), flag=True)
        print(out.dtype, model.fc.weight.dtype)
    finally:
        torch.set_default_dtype(torch.float32)


def test_autocast_and_no_grad():
    model = Flagged()
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        out = model(torch.randn(2, 8))
    print(out.dtype, out.requires_grad)


def test_inference_mode():
    model = Shaped((1,), dim=4)
    with torch.inference_mode():
        out = model(torch.randn(2, 4))
    print(out.is_inference())


def test_compiled_with_eager_backend():
    model = Lookup()
    compiled = torch.compile(model, backend="eager")
    print(compiled(torch.randint(0, 16, (2, 3))).shape)


def test_state_left_as_found():
    Flagged()(torch.randn(1, 8), flag=True)
    with warnings.catch_warnings():
        filters = len(warnings.filters)
    print(torch.get_default_dtype(), torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"), filters,
          torch.distributions.Distribution._validate_args)

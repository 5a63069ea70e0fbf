"""Tests whose results, draws, warnings and prints must be what they are without graphlint."""

import copy
import random
import sys

import pytest
import torch

from zoo import Dropper, Gate, Noisy, PerSampleGrads, Sampler, Talker


def test_dropout_and_noise_draw_the_same_numbers():
    torch.manual_seed(0)
    random.seed(0)
    model = Dropper()
    out = model(torch.randn(4, 8))
    print(f"{out.sum().item():.6f} {torch.rand(1).item():.6f} {random.random():.6f}")


def test_warns():
    with pytest.warns(UserWarning, match="deprecated"):
        Noisy()(torch.randn(2, 8))


@pytest.mark.filterwarnings("error")
def test_warnings_as_errors():
    with pytest.raises(UserWarning):
        Noisy()(torch.randn(2, 8))


def test_a_warning_left_to_the_summary():
    random.seed(1)
    print(Noisy()(torch.randn(1, 8)).shape)


def test_torch_func_in_the_forward_called_through_forward():
    model = PerSampleGrads()
    print(model.forward(torch.randn(5, 4)).shape)


def test_torch_func_in_the_forward_called_as_a_model():
    torch.manual_seed(2)
    print(f"{PerSampleGrads()(torch.randn(3, 4)).sum().item():.6f}")


def test_a_model_driven_by_its_own_method():
    torch.manual_seed(3)
    print(f"{Sampler().sample(3).sum().item():.6f}")


def test_distributions_gate_under_gradients():
    torch.manual_seed(0)
    gate = Gate()
    out = gate(torch.randn(3, 8))
    out.sum().backward()
    print(f"{out.sum().item():.6f}", torch.distributions.Distribution._validate_args)


def test_prints_to_both_streams():
    Talker()(torch.ones(2, 8))
    print("to stderr", file=sys.stderr)


def test_a_deep_copy():
    model = copy.deepcopy(Talker())
    model(torch.ones(1, 8))


def test_expected_to_fail():
    out = Talker()(torch.ones(3, 8))
    assert out.shape == (3, 4), "the test's own mistake"


@pytest.mark.xfail(reason="a known bug of the project", strict=True)
def test_xfail():
    Gate()(torch.randn(2, 8)).sum().item()
    raise ValueError("known")


def test_an_error_raised_by_the_model():
    with pytest.raises(RuntimeError, match="mat1 and mat2"):
        Talker()(torch.ones(2, 5))

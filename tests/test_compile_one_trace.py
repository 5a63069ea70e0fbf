"""The torch.compile analysis traces a model once where it does not specialise on the batch: the grown calls'
dimensions are dynamic from the first compilation on, so GL302's later calls only check guards, and a model that
does specialise is still compiled again on each grown call and reported. The marks that make the first
compilation dynamic are taken off the inputs afterwards. Dynamo's timing of the guards it builds (a cache flush
each) is left out of the analysis and only of it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import findings_of, line_of, lint_file, write
from graphlint import Target
from graphlint.capture import compile as compile_analysis
from graphlint.capture.compile import analyse_target

pytestmark = pytest.mark.compile


class Settles(nn.Module):
    """Reads the batch size only where dynamic shapes keep it symbolic."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        if x.shape[0] > 1:
            h = h - h.mean(0)
        return h.reshape(x.shape[0], -1) * 2


class Specialises(nn.Module):
    """A Python loop over the batch: every batch size is a graph of its own."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        for i in range(x.shape[0]):
            h[i] = h[i] * 2
        return h


@torch.library.custom_op("graphlint_tests::static_batch", mutates_args=())
def static_batch(x: torch.Tensor) -> torch.Tensor:
    """A custom op whose shape function accepts only a plain batch size (not dynamo's symbolic one)."""
    return x.clone()


@static_batch.register_fake
def _static_batch_shape(x):
    if not isinstance(x.shape[0], int):
        raise TypeError("this kernel needs a static batch size")
    return torch.empty_like(x)


class RefusesSymbolicSizes(nn.Module):
    """Dynamo cannot trace it with the batch size symbolic: the custom op's shape function refuses it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return static_batch(self.fc(x))


@pytest.fixture
def traces(monkeypatch):
    """The number of graphs dynamo handed the analysis's backend: one per trace of a frame."""
    count = [0]
    backend = compile_analysis._run_graph

    def counting(gm, example_inputs):
        count[0] += 1
        return backend(gm, example_inputs)

    monkeypatch.setattr(compile_analysis, "_run_graph", counting)
    return count


def test_a_model_that_does_not_specialise_on_the_batch_is_traced_once(traces):
    with torch.device("meta"):
        model, x = Settles(), torch.randn(4, 8)
    analysis = analyse_target(Target(model, (x,), {}), "meta")
    assert analysis.calls == ["the factory's inputs", "the same inputs again", "the same inputs a third time",
                              "batch 5", "batch 6"]
    assert traces[0] == 1
    assert analysis.recompiles == []


def test_a_model_that_specialises_on_the_batch_is_analysed_as_dynamo_compiles_it_unmarked():
    with torch.device("meta"):
        model, x = Specialises(), torch.randn(4, 8)
    analysis = analyse_target(Target(model, (x,), {}), "meta")
    assert [(r.call, r.guard) for r in analysis.recompiles] == [
        ("batch 5", "tensor 'x' size mismatch at index 0. expected 4, actual 5"),
        ("batch 6", "tensor 'x' size mismatch at index 0. expected 5, actual 6")]


class Counts(nn.Module):
    """A Python counter read in the forward: a new constant on every call."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.fc(x) * self.calls


def test_a_model_that_recompiles_is_analysed_from_its_untouched_state():
    # The counter's guards name its values: the analysis that reports them starts where the user's model was.
    with torch.device("meta"):
        model, x = Counts(), torch.randn(4, 8)
    analysis = analyse_target(Target(model, (x,), {}), "meta")
    # Four eager calls check that the model accepts the calls (calls 1 to 4), then the compiled calls run.
    assert [(r.call, r.guard) for r in analysis.recompiles] == [
        ("the same inputs again", "self.calls == 4"), ("the same inputs a third time", "self.calls == 5"),
        ("batch 5", "tensor 'x' size mismatch at index 0. expected 4, actual 5"), ("batch 6", "self.calls == 7")]
    assert model.calls == 4 + 5


def test_a_batch_of_one_is_not_marked_and_settles_after_one_recompile(traces):
    # Dynamo keeps sizes 0 and 1 static even when marked: the first grown call compiles again, dynamically.
    with torch.device("meta"):
        model, x = Settles(), torch.randn(1, 8)
    analysis = analyse_target(Target(model, (x,), {}), "meta")
    assert "(failed under" not in " ".join(analysis.calls)
    assert traces[0] == 2
    assert [r.call for r in analysis.recompiles] == ["batch 2"]


def test_a_model_dynamo_cannot_trace_with_a_symbolic_batch_is_analysed_as_without_the_marks():
    # Without the marks the first call compiles with static sizes and only the grown call's dynamic recompile
    # fails; the analysis says the same, not that the factory's inputs fail.
    with torch.device("meta"):
        model, x = RefusesSymbolicSizes(), torch.randn(4, 8)
    analysis = analyse_target(Target(model, (x,), {}), "meta")
    assert analysis.calls[:3] == ["the factory's inputs", "the same inputs again", "the same inputs a third time"]
    assert analysis.calls[3].startswith("batch 5 (failed under torch.compile: TorchRuntimeError")
    assert len(analysis.calls) == 4


def test_the_inputs_carry_no_mark_of_dynamo_after_the_analysis_and_the_users_own_marks_stay(traces):
    with torch.device("meta"):
        model, bilinear = Settles(), nn.Bilinear(8, 8, 8)
        x, mask = torch.randn(4, 8), torch.ones(4, 8)
    torch._dynamo.maybe_mark_dynamic(mask, 1)
    own = mask._dynamo_weak_dynamic_indices
    analyse_target(Target(model, (x,), {}), "meta")
    assert traces[0] == 1  # marked, and traced once
    assert "_dynamo_weak_dynamic_indices" not in vars(x) and "_has_dynamo_dim_marking" not in vars(x)
    analyse_target(Target(bilinear, (x, mask), {}), "meta")
    assert mask._dynamo_weak_dynamic_indices is own and own == {1}
    assert "_dynamo_weak_dynamic_indices" not in vars(x)


def test_with_automatic_dynamic_shapes_off_every_new_batch_size_compiles_again_as_dynamo_would(traces):
    # The marks stand in for what dynamo does on a size change; a program that turned that off recompiles for good.
    import torch._dynamo

    with torch.device("meta"):
        model, x = Settles(), torch.randn(4, 8)
    with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
        analysis = analyse_target(Target(model, (x,), {}), "meta")
    assert traces[0] == 3
    assert [r.call for r in analysis.recompiles] == ["batch 5", "batch 6"]


def test_gl302_still_reports_a_loop_over_the_batch_at_its_line(tmp_path):
    path = write(tmp_path, "model.py", '''
        import torch
        from torch import nn


        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)

            def forward(self, x):
                h = self.fc(x)
                for i in range(x.shape[0]):  # the loop
                    h[i] = h[i] * 2
                return h


        def make():
            return Model(), (torch.randn(4, 8),)
    ''')
    found = findings_of(lint_file(path, select=("GL302",)), "GL302")
    assert [f.location.line for f in found] == [line_of(path, "# the loop")]
    assert found[0].message.startswith("torch.compile recompiles `forward` on 2 of 5 calls (batch 5, batch 6): "
                                       "guard `tensor 'x' size mismatch at index 0. expected 4, actual 5` failed")


def test_the_analysis_builds_guards_without_timing_them_and_leaves_the_timing_to_plain_torch_compile(monkeypatch):
    from torch._dynamo import guards

    timed = []
    original = guards.profile_guard_manager

    def spy(*args):
        timed.append(True)
        return original(*args)

    monkeypatch.setattr(guards, "profile_guard_manager", spy)
    with torch.device("meta"):
        model, x = Specialises(), torch.randn(4, 8)
    analysis = analyse_target(Target(model, (x,), {}), "meta")
    assert len(analysis.recompiles) == 2 and timed == []  # three frames compiled, none timed
    assert guards.profile_guard_manager is spy
    torch._dynamo.reset()
    torch.compile(nn.Linear(4, 4), backend="eager")(torch.randn(2, 4))
    torch._dynamo.reset()
    assert timed == [True]  # plain torch.compile still times its guards

"""The batch and sequence dimensions, known in one place (graphlint.capture.dimensions) and read alike by the memory
step's --batch/--seq, the graph report's --vary and the torch.compile analysis's grown calls."""

from __future__ import annotations

import pytest
import torch

from graphlint.capture import dimensions
from graphlint.capture.compile import grown
from graphlint.errors import TargetFailure
from graphlint.graph import vary_inputs
from graphlint.memory.measure import resize_inputs
from graphlint.target import Target


@pytest.mark.parametrize(("inputs", "expected"), [
    ((torch.zeros(4, 7, dtype=torch.long),), {"batch": 4, "seq": 7}),  # token ids
    ((torch.zeros(4, 7, 3, dtype=torch.long),), {"batch": 4, "seq": 7}),  # codebook ids
    ((torch.randn(4, 7, 16),), {"batch": 4, "seq": 7}),  # embeddings
    ((torch.randn(4, 3, 8, 8),), {"batch": 4}),  # images: no sequence
    ((torch.randn(4, 10),), {"batch": 4}),  # features: no sequence
    ((torch.randn(4, 10), torch.zeros(4, 9, dtype=torch.long)), {"batch": 4, "seq": 9}),  # the first with one
    ((torch.zeros(0, 5, dtype=torch.long),), {"seq": 5}),  # an empty batch is no batch to grow
    ((3,), {}),
])
def test_the_batch_leads_and_the_sequence_is_the_first_input_that_has_one(inputs, expected):
    assert dimensions.sizes(inputs, {}) == expected


def test_a_mask_carries_the_sequence_in_both_its_dimensions_and_a_rotary_table_carries_nothing():
    assert dimensions.carried(torch.zeros(2, 8, 8), "seq", 8) == [1, 2]
    assert dimensions.carried(torch.zeros(8, 4), "seq", 8) == []  # (T, D/2): dimension 0 is never the sequence
    assert dimensions.carried(torch.zeros(8, 4), "batch", 2) == []
    assert dimensions.carried(torch.zeros(2, 8, 8), "batch", 2) == [0]


IDS, MASK, TABLE = torch.arange(16).reshape(2, 8), torch.ones(2, 8, 8, dtype=torch.bool), torch.randn(8, 4)


def test_the_memory_step_the_graph_report_and_the_compile_analysis_grow_the_same_tensors():
    made = Target(torch.nn.Identity(), (IDS, MASK, TABLE), {})
    assert resize_inputs(made, {"seq": 16}) == {"batch": 2, "seq": 16}
    doubled, _ = vary_inputs("seq")((IDS, MASK, TABLE), {})
    one_more, _ = grown((IDS, MASK, TABLE), {}, "seq", 8, 1)
    assert [tuple(t.shape) for t in made.args] == [tuple(t.shape) for t in doubled] == [(2, 16), (2, 16, 16), (8, 4)]
    assert [tuple(t.shape) for t in one_more] == [(2, 9), (2, 9, 9), (8, 4)]
    assert torch.equal(doubled[0], torch.cat([IDS, IDS], dim=1))  # ids stay valid ids: rows repeat
    assert torch.equal(one_more[0][:, -1], IDS[:, 0])  # the analysis repeats the first slice


def test_one_tensor_given_twice_stays_one_tensor():
    args, kwargs = dimensions.resized((IDS,), {"labels": IDS}, {"batch": 2}, {"batch": 3})
    assert args[0] is kwargs["labels"] and args[0].shape == (3, 8)


def test_varying_a_dimension_the_inputs_lack_is_one_clear_failure():
    with pytest.raises(TargetFailure, match=r"--vary seq does not apply: no input tensor of the target has a "
                                            r"sequence dimension"):
        vary_inputs("seq")((torch.randn(2, 3, 8, 8),), {})

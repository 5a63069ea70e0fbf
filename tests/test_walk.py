"""graphlint.walk, the searches rules share, on a graph the capture recorded (canonical op names, real users)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from graphlint.capture import capture_model
from graphlint.walk import DOWN, UP, chain, find, line, op, operands, reach, reachable


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        a = x.float().view(4, 4).t()
        s = torch.softmax(a @ self.w, dim=-1)
        late = s.exp().neg().abs()
        mixed = s * late  # reached from s in one step, and from late in four
        return ((mixed * 2 + 1) * mixed).sum()


@pytest.fixture(scope="module")
def nodes():
    """The recorded nodes by name (x, w, float, view, t, matmul, softmax, exp, neg, abs, mixed, double, plus, times)."""
    graph = capture_model(Net(), (torch.randn(16),), {}).forward
    found = {n.name: n for n in graph.nodes}
    named = {"x": found["arg0"], "w": found["w"], "float": found["float_1"], "mixed": found["mul"],
             "double": found["mul_1"], "plus": found["add"], "times": found["mul_2"]}
    named.update({name: found[name] for name in ("view", "t", "matmul", "softmax", "exp", "neg")}, abs=found["abs_1"])
    assert [op(named[name]) for name in ("float", "view", "t", "matmul", "mixed", "plus")] == \
        ["float", "view", "t", "matmul", "mul", "add"]
    return named


def names(found, nodes) -> list[str]:
    by_node = {node: name for name, node in nodes.items()}
    return [by_node[node] for node in found]


def test_chain_passes_the_given_ops_back_to_the_value_behind_them(nodes):
    walked = chain(nodes["t"], {"t", "view", "float"})
    assert names(walked.nodes, nodes) == ["t", "view", "float"]
    assert walked.end is nodes["x"] and not walked.found


def test_chain_ends_at_the_first_op_it_does_not_pass(nodes):
    walked = chain(nodes["t"], {"t", "float"})
    assert walked.end is nodes["view"] and names(walked.nodes, nodes) == ["t"]


def test_chain_finds_a_stop_within_its_limit_and_asks_nothing_where_the_last_step_led(nodes):
    def placeholder(node):
        return node.op == "placeholder"

    assert chain(nodes["t"], {"t", "view", "float"}, stop=placeholder, limit=4).found
    beyond = chain(nodes["t"], {"t", "view", "float"}, stop=placeholder, limit=3)
    assert beyond.end is nodes["x"] and not beyond.found


def test_chain_accepts_a_predicate_and_a_value_that_is_no_node(nodes):
    assert chain(nodes["t"], lambda n: n.op == "call_method").end is nodes["x"]
    assert chain(2.0, {"t"}) == ((), 2.0, False)


def test_reach_is_breadth_first_each_node_once_with_its_path(nodes):
    steps = list(reach([nodes["matmul"]], UP))
    assert names([s.node for s in steps], nodes) == ["matmul", "t", "w", "view", "float", "x"]
    assert [s.depth for s in steps] == [0, 1, 1, 2, 3, 4]
    assert names(steps[-1].path(), nodes) == ["matmul", "t", "view", "float", "x"]
    assert steps[-1].came_from is nodes["float"] and steps[0].came_from is None


def test_reach_goes_no_further_than_its_limit(nodes):
    assert names([s.node for s in reach([nodes["matmul"]], UP, limit=2)], nodes) == ["matmul", "t", "w", "view"]


def test_reach_passes_only_through_the_given_ops(nodes):
    reached = [s.node for s in reach([nodes["softmax"]], DOWN, through={"softmax", "exp"})]
    assert names(reached, nodes) == ["softmax", "exp", "mixed", "neg"]


def test_reachable_is_the_set_reach_yields(nodes):
    assert reachable([nodes["matmul"]], UP) == {s.node for s in reach([nodes["matmul"]], UP)} == \
        {nodes[name] for name in ("matmul", "t", "w", "view", "float", "x")}
    assert reachable([nodes["softmax"]], DOWN, through={"softmax", "exp"}) == \
        {nodes[name] for name in ("softmax", "exp", "mixed", "neg")}
    known = {nodes["view"]}  # taken as reached: the search does not go past it to float and x
    assert reachable([nodes["matmul"]], UP, found=known) is known == \
        {nodes[name] for name in ("matmul", "t", "w", "view")}


def test_find_yields_the_stops_nearest_first_and_never_passes_one(nodes):
    def stop(node):
        return op(node) in ("neg", "abs", "add")

    assert names([s.node for s in find([nodes["softmax"]], DOWN, stop)], nodes) == ["neg", "plus"]


def test_find_again_asks_a_node_again_once_more_of_its_inputs_were_passed(nodes):
    """`mixed` is reached from softmax before `late` (abs) is passed: only a search that asks it again, as
    GL104's host values need, gets past it to the add."""
    def found(again: bool) -> list[str]:
        passed: set = set()
        start = nodes["softmax"]

        def computed_from_passed(node):
            return node is start or all(n in passed for n in node.all_input_nodes)

        return names([s.node for s in find([start], DOWN, lambda n: op(n) == "add", through=computed_from_passed,
                                           again=again, passed=passed)], nodes)

    assert found(again=True) == ["plus"]
    assert found(again=False) == []


def test_line_follows_one_next_node_and_counts_the_start_in_its_limit(nodes):
    def only_user(node):
        return next(iter(node.users)) if len(node.users) == 1 else None

    assert names(line(nodes["x"], only_user), nodes) == ["x", "float", "view", "t", "matmul", "softmax"]
    assert names(line(nodes["x"], only_user, limit=3), nodes) == ["x", "float", "view"]
    assert list(line(None, only_user)) == []


def test_operands_counts_every_occurrence_of_a_term(nodes):
    def spread(term):  # products and sums of `mixed`, read as a term of its own
        return isinstance(term, torch.fx.Node) and op(term) in ("mul", "add") and term is not nodes["mixed"]

    terms = operands(nodes["times"], spread, limit=7)
    assert terms is not None and len(terms) == 7  # times, plus, 1, double, 2 and mixed twice
    assert terms.count(nodes["mixed"]) == 2 and 1 in terms and 2 in terms
    assert operands(nodes["times"], spread, limit=6) is None

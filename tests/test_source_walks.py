"""The two walks over libcst trees that the fixers read the user's code with, `collect` and `find`
(graphlint/rewrite/source.py): what they return, in which order, and what `prune` leaves out; checked on
hand-written code and, against a plain recursion over libcst's `children`, on generated Python."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from graphlint.rewrite.contract import code_of, names_read
from graphlint.rewrite.source import collect, find, path_to, substituted


def _every(node: cst.CSTNode) -> list[cst.CSTNode]:
    """Every node in source order, by libcst's own `children`: what the walks must agree with."""
    return [node, *(n for child in node.children for n in _every(child))]


def _path(root: cst.CSTNode, target: cst.CSTNode) -> list[cst.CSTNode] | None:
    if root is target:
        return [root]
    for child in root.children:
        below = _path(child, target)
        if below is not None:
            return [root, *below]
    return None


def test_collect_gives_the_matching_nodes_in_source_order_the_root_included():
    call = cst.parse_expression("f(g(x), h(y))")
    assert [code_of(c.func) for c in collect(call, m.Call())] == ["f", "g", "h"]
    assert collect(call, m.Call())[0] is call


def test_collect_without_a_matcher_gives_every_node():
    module = cst.parse_module("for i in range(3):\n    x[i] += i  # count\n")
    assert [id(n) for n in collect(module)] == [id(n) for n in _every(module)]


def test_a_pruned_node_is_matched_but_not_walked_into():
    function = cst.parse_module("def f():\n    a()\n    def g():\n        b()\n    c()\n").body[0]
    assert [code_of(c) for c in collect(function.body, m.Call(), prune=m.FunctionDef())] == ["a()", "c()"]
    assert [f.name.value for f in collect(function.body, m.FunctionDef(), prune=m.FunctionDef())] == ["g"]


def test_pruning_else_leaves_the_else_blocks_out():
    statement = cst.parse_statement("if p:\n    a()\nelse:\n    b()\n")
    assert [code_of(c) for c in collect(statement, m.Call(), prune=m.Else())] == ["a()"]
    assert [code_of(c) for c in collect(statement, m.Call())] == ["a()", "b()"]


def test_collect_takes_a_bare_match_if_true_as_findall_does():
    # m.matches declines a MatchIfTrue at the top; the walks take it, as m.findall and m.replace do.
    module = cst.parse_module("x = 1 + 2\ny = 2\n")
    twos = collect(module, m.MatchIfTrue(lambda n: isinstance(n, cst.Integer) and n.value == "2"))
    assert [code_of(n) for n in twos] == ["2", "2"]


def test_find_gives_the_path_down_to_the_first_match():
    module = cst.parse_module("x = 1\nif c:\n    y = g(2)\n    z = g(3)\n")
    path = find(module, m.Call())
    assert path is not None and path[0] is module and code_of(path[-1]) == "g(2)"
    assert [type(n).__name__ for n in path] == ["Module", "If", "IndentedBlock", "SimpleStatementLine", "Assign",
                                                "Call"]


def test_find_does_not_enter_what_it_prunes_and_answers_none_without_a_match():
    module = cst.parse_module("def f():\n    return g()\nh = 1\n")
    assert find(module, m.Call(), prune=m.FunctionDef()) is None
    assert find(module, m.Lambda()) is None


def test_substituted_replaces_variables_not_attribute_or_keyword_names():
    expression = cst.parse_expression("mask + self.mask + f(mask=mask)")
    value = cst.parse_expression("a + b")
    assert code_of(substituted(expression, {"mask": value})) == "(a + b) + self.mask + f(mask=(a + b))"


def _python_sources():
    import hypothesmith

    return hypothesmith.from_grammar()


# Python's grammar takes seconds to build: built when the test first draws, not when the file is collected.
SOURCES = st.deferred(_python_sources)


def _parsed(source: str) -> cst.Module:
    try:
        return cst.parse_module(source)
    except Exception:  # the grammar allows a little that libcst's parser does not
        assume(False)
        raise


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(source=SOURCES, which=st.integers(min_value=0))
def test_the_walks_agree_with_libcsts_children_on_any_python(source, which):
    module = _parsed(source)
    every = _every(module)
    assert [id(n) for n in collect(module)] == [id(n) for n in every]
    target = every[which % len(every)]
    assert [id(n) for n in path_to(module, target)] == [id(n) for n in _path(module, target)]
    names = [n for n in every if isinstance(n, cst.Name)]
    others = {id(n.attr) for n in every if isinstance(n, cst.Attribute)} | \
        {id(n.keyword) for n in every if isinstance(n, cst.Arg) and n.keyword is not None}
    assert [id(n) for n in names_read(module)] == [id(n) for n in names if id(n) not in others]


@pytest.mark.parametrize("source", ["", "x", "# only a comment\n"])
def test_the_walks_take_a_module_with_nothing_to_find(source):
    module = cst.parse_module(source)
    assert find(module, m.Call()) is None
    assert collect(module, m.Call()) == []

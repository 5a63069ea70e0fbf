"""Shapes of target found while linting real repositories' packages as their users would (a `vit_small(**kwargs)`
helper that fixes some constructor arguments, a model configured by a dataclass): each case is written here
for the test, in the same class of code, and run through the real command."""

from __future__ import annotations

import pytest

from conftest import line_of, run_graphlint, write

NET = """
    from torch import nn


    class Net(nn.Module):
        def __init__(self, depth=1, width=4):
            super().__init__()
            self.layers = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])

        def forward(self, x):
            return self.layers(x)


    def small(**kwargs):
        return Net(depth=2, **kwargs)
"""


@pytest.mark.parametrize("command", ["check", "memory"])
def test_an_error_of_the_users_call_reads_as_python_raises_it_after_the_cpu_rebuild(project_dir, command):
    # The CPU rebuild used to run inside the meta attempt's `except`, where Python 3.11 reports a keyword given
    # twice as KeyError: 'depth' instead of its TypeError.
    path = write(project_dir, "zoo.py", NET)
    result = run_graphlint(command, "zoo.py:small", "--init", "depth=3", "--input", "float32[2,4]", cwd=project_dir)
    assert result.returncode == 2, result.stderr
    assert "got multiple values for keyword argument 'depth'" in result.stderr, result.stderr
    assert "KeyError" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert f"(at zoo.py:{line_of(path, 'return Net(depth=2')})" in result.stderr, result.stderr


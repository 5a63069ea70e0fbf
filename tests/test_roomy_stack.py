"""A child's deep stacks beneath one roomy frame (graphlint.run.stack): Python 3.11+ maps and unmaps a 16 KiB chunk
of its frame stack whenever calls cross a chunk's end, which torch's dispatch and dynamo's trace do all the time."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from conftest import lint_file, write

# Calls that end at every depth from 0 to 600 frames, so that some of them cross a chunk's end each time; the minor
# page faults each way are counted (every fresh chunk's pages fault on first touch).
HOVERING = """
import resource, sys
from graphlint.run.stack import roomy

def depth(n):
    return 1 if n == 0 else depth(n - 1)

def hover():
    for d in range(600):
        for _ in range(20):
            depth(d)

hover()  # once first, so that whatever a first run allocates is not counted
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
{call}
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(call: str) -> int:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(HOVERING.format(call=call))], capture_output=True,
                          text=True, check=True)
    return int(done.stdout)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="frames live in data-stack chunks since Python 3.11")
def test_calls_beneath_the_roomy_frame_stop_mapping_fresh_stack_chunks():
    plain, beneath = _faults("hover()"), _faults("roomy(hover)")
    assert plain > 1000  # 600 depths x 20 calls cross chunk ends: each crossing maps fresh pages
    assert beneath * 10 < plain, (plain, beneath)


def test_roomy_returns_what_the_call_returns_and_lets_its_errors_through():
    from graphlint.run.stack import roomy

    assert roomy(lambda: 42) == 42
    with pytest.raises(KeyError):
        roomy(lambda: {}["missing"])


def test_a_targets_child_runs_its_job_beneath_the_roomy_frame(tmp_path):
    seen = tmp_path / "seen.txt"
    path = write(tmp_path, "model.py", f"""
        import inspect
        import torch


        def make():
            frames = [(frame.function, frame.filename) for frame in inspect.stack()]
            beneath = any(name == "roomy" and file.endswith("stack.py") for name, file in frames)
            open({str(seen)!r}, "w").write(str(beneath))
            return torch.nn.Linear(4, 4), (torch.randn(2, 4),)
    """)
    result = lint_file(path)
    assert not result.errors
    assert seen.read_text() == "True"

"""GL402 against DistributedDataParallel itself: the model that the rule reports fails at DDP's second step on a
real two-rank gloo run, with the error and the parameter indices the finding names; a model whose trainable
parameters all get a gradient passes both."""

from __future__ import annotations

import sys

import pytest

from conftest import REPO, WITHOUT_COMPILE, lint_file, run_graphlint, write
from graphlint.config import read_config
from graphlint.errors import UsageError

sys.path.insert(0, str(REPO / "benchmarks"))

import distributed_runs  # noqa: E402

from graphlint.rules.gl402_ddp_unused_parameters import DDP_ERROR  # noqa: E402

UNUSED = '''
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(8, 8)
            self.heads = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 2)])
            self.scale = nn.Parameter(torch.ones(8))

        def forward(self, x):
            return self.heads[0](self.embed(x)) * self.scale


    def make():
        return Net(), (torch.randn(4, 8),)
'''
ALL_USED = UNUSED.replace("return self.heads[0](self.embed(x)) * self.scale",
                          "return self.heads[1](self.heads[0](self.embed(x)) * self.scale)")


def _gl402(report):
    return [f for f in report.findings if f.rule_id == "GL402"]


def test_gl402_reports_what_ddp_refuses_at_the_parameters_construction_line(tmp_path):
    path = write(tmp_path, "net.py", UNUSED)
    [finding] = _gl402(lint_file(path, distributed="ddp"))
    assert finding.location.line == 9  # the nn.ModuleList([...]) line that built heads.1
    assert "heads.1.weight" in finding.message and "heads.1.bias" in finding.message
    assert "indices 5, 6" in finding.message  # scale (the module's own parameters first), embed.*, heads.0.*
    assert DDP_ERROR in finding.message and "find_unused_parameters=True" in finding.message
    assert not _gl402(lint_file(write(tmp_path, "good.py", ALL_USED), distributed="ddp"))


def test_gl402_is_off_unless_the_target_is_meant_for_ddp(tmp_path):
    report = lint_file(write(tmp_path, "net.py", UNUSED))
    assert not _gl402(report) and any(f.rule_id == "GL203" for f in report.findings)


def test_distributed_is_read_from_pyproject_and_checked(tmp_path):
    good = write(tmp_path / "a", "pyproject.toml", '[tool.graphlint]\ndistributed = "ddp"\n')
    assert read_config(good).distributed == "ddp"
    bad = write(tmp_path / "b", "pyproject.toml", '[tool.graphlint]\ndistributed = "horovod"\n')
    with pytest.raises(UsageError, match="distributed must be one of none, ddp"):
        read_config(bad)


@pytest.mark.distributed
def test_real_ddp_fails_where_gl402_reports_and_passes_where_it_does_not(tmp_path):
    bad, good = write(tmp_path, "net.py", UNUSED), write(tmp_path, "good.py", ALL_USED)
    ranks = distributed_runs.run_ranks(2, distributed_runs.ddp_two_steps, str(bad), "make")
    for rank, (status, text) in enumerate(ranks):
        assert status == "error" and DDP_ERROR in text, text
        assert f"did not receive grad for rank {rank}: 5 6" in text  # the indices GL402 names
    assert distributed_runs.run_ranks(2, distributed_runs.ddp_two_steps, str(good), "make") == [("ok", "two steps")] * 2


@pytest.mark.cli
def test_check_ddp_turns_gl402_on_and_a_bad_rank_count_is_one_line(tmp_path):
    write(tmp_path, "net.py", UNUSED)
    found = run_graphlint("check", "net.py:make", "--ddp", "2", "--no-cache", *WITHOUT_COMPILE, cwd=tmp_path)
    assert found.returncode == 1 and "net.py:9:" in found.stdout and "GL402" in found.stdout, found.stdout
    wrong = run_graphlint("check", "net.py:make", "--ddp", "0", cwd=tmp_path)
    assert wrong.returncode == 2 and wrong.stderr.strip().count("\n") == 0 and "--ddp" in wrong.stderr

"""The command line's options: each flag is declared once and means one thing in every command that takes it;
`time` names the device it prices on with --gpu or --cpu, and --device is where the step runs, as for memory; a
configured value a command cannot use is said, never silently replaced."""

from __future__ import annotations

import argparse
import inspect

import pytest

import graphlint.cli
from conftest import run_graphlint, write
from graphlint.cli import _parser
from graphlint.cli_reference import _subcommands


def _options_by_flag() -> dict[str, list[tuple[str, argparse.Action]]]:
    found: dict[str, list[tuple[str, argparse.Action]]] = {}
    for name, command in _subcommands(_parser()).items():
        for action in command._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    found.setdefault(flag, []).append((name, action))
    return found


def test_a_flag_taken_by_several_commands_has_one_meaning():
    shared = {flag: uses for flag, uses in _options_by_flag().items() if len(uses) > 1}
    assert {"--format", "--device", "--debug", "--output", "--timeout", "--ddp", "--gpu"} <= set(shared)
    for flag, uses in shared.items():
        helps = {action.help for _, action in uses}
        dests = {action.dest for _, action in uses}
        assert len(helps) == 1 and len(dests) == 1, (flag, [(name, action.help) for name, action in uses])


def test_no_function_of_the_command_line_is_over_100_lines():
    for name, function in inspect.getmembers(graphlint.cli, inspect.isfunction):
        if function.__module__ == "graphlint.cli":
            assert len(inspect.getsource(function).splitlines()) <= 100, name


def test_time_prices_on_the_cpu_with_cpu_and_runs_the_step_where_device_says():
    args = _parser().parse_args(["time", "--cpu", "--device", "meta", "model.py:make"])
    assert args.cpu is True and args.device == "meta" and args.gpu is None



@pytest.mark.cli
@pytest.mark.parametrize("arguments, said", [
    (["--device", "cpu"], "--cpu (this machine; --device says where the step runs"),
    (["--gpu", "h100", "--cpu"], "--gpu and --cpu are two devices"),
])
def test_time_without_a_device_to_price_on_says_the_spelling(project_dir, arguments, said):
    result = run_graphlint("time", "model.py:make", *arguments, cwd=project_dir)
    assert result.returncode == 2 and said in result.stderr and result.stderr.count("\n") == 1, result.stderr


@pytest.mark.cli
def test_a_configured_cuda_device_is_said_by_memory_not_silently_replaced(tmp_path):
    write(tmp_path, "pyproject.toml", '[project]\nname = "p"\nversion = "0"\n[tool.graphlint]\ndevice = "cuda"\n')
    result = run_graphlint("memory", "missing.py:make", cwd=tmp_path)
    notes = [line for line in result.stderr.splitlines() if "note" in line]
    assert notes == ['graphlint: note: [tool.graphlint] device = "cuda" is where check and graph capture; memory '
                     "runs the step on the meta device, or on CPU when it needs real values (as --device auto), "
                     "with CUDA's kernels unless --train-on cpu"], result.stderr
    assert result.returncode == 2 and "missing.py" in result.stderr


@pytest.mark.cli
def test_a_configured_ddp_without_ranks_is_said_by_memory(tmp_path):
    write(tmp_path, "pyproject.toml", '[project]\nname = "p"\nversion = "0"\n[tool.graphlint]\ndistributed = "ddp"\n')
    result = run_graphlint("memory", "missing.py:make", cwd=tmp_path)
    assert 'distributed = "ddp" names no number of ranks' in result.stderr, result.stderr
    assert result.returncode == 2

"""The result cache, parallel targets with -j, --timeout, and progress on a terminal."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys

from conftest import run_graphlint, write
from test_cli import ATTENTION, CLEAN

# Runs graphlint with `import torch` made impossible: only a run the cache answers in full can succeed.
WITHOUT_TORCH = "import sys; sys.modules['torch'] = None; from graphlint.cli import main; sys.exit(main(sys.argv[1:]))"


def run_without_torch(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_TORCH, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_a_second_run_with_nothing_changed_comes_from_the_cache_without_torch(project_dir):
    write(project_dir, "model.py", ATTENTION)
    first = run_graphlint("check", "model.py:make", "--format", "json", cwd=project_dir)
    second = run_without_torch("check", "model.py:make", "--format", "json", cwd=project_dir)
    assert second.returncode == first.returncode == 1, second.stderr
    assert second.stdout == first.stdout
    assert (project_dir / ".graphlint_cache" / ".gitignore").read_text().strip().endswith("*")


def test_editing_an_imported_file_or_the_configuration_lints_again(project_dir):
    write(project_dir, "layers.py", ATTENTION.replace("def make():", "def unused():"))
    write(project_dir, "model.py", "import torch\nfrom layers import Attention\n\n\n"
                                   "def make():\n    return Attention(), (torch.randn(2, 8, 16),)\n")
    assert run_graphlint("check", "model.py:make", cwd=project_dir).returncode == 1
    assert run_without_torch("check", "model.py:make", cwd=project_dir).returncode == 1  # cached

    fused = ATTENTION.replace("def make():", "def unused():").replace(
        "torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v",
        "torch.nn.functional.scaled_dot_product_attention(q, k, v)")
    write(project_dir, "layers.py", fused)
    assert run_without_torch("check", "model.py:make", cwd=project_dir).returncode != 1  # needs a capture
    assert run_graphlint("check", "model.py:make", cwd=project_dir).returncode == 0  # the new code is clean

    write(project_dir, "pyproject.toml", '[project]\nname = "p"\nversion = "0"\n\n[tool.graphlint]\nfail-on = "note"\n')
    assert run_without_torch("check", "model.py:make", cwd=project_dir).returncode != 0  # new configuration


def test_no_cache_always_captures(project_dir):
    write(project_dir, "model.py", CLEAN)
    assert run_graphlint("check", "model.py:make", cwd=project_dir).returncode == 0
    assert run_without_torch("check", "model.py:make", cwd=project_dir).returncode == 0
    without = run_without_torch("check", "model.py:make", "--no-cache", cwd=project_dir)
    assert without.returncode == 2
    assert without.stderr.startswith("graphlint: error: cannot import torch") and "Traceback" not in without.stderr


def test_corrupt_or_unwritable_caches_are_ignored(project_dir):
    write(project_dir, "model.py", ATTENTION)
    expected = run_graphlint("check", "model.py:make", cwd=project_dir)
    for entry in (project_dir / ".graphlint_cache").rglob("*.json"):
        entry.write_text("{ this is not json")
    damaged = run_graphlint("check", "model.py:make", cwd=project_dir)
    assert (damaged.returncode, damaged.stdout) == (expected.returncode, expected.stdout)
    assert "Traceback" not in damaged.stderr
    write(project_dir, "not-a-folder", "a file where the cache folder should be\n")
    unwritable = run_graphlint("check", "model.py:make", "--cache-dir", "not-a-folder", cwd=project_dir)
    assert (unwritable.returncode, unwritable.stdout) == (expected.returncode, expected.stdout)


def test_the_cache_folder_can_be_moved_with_an_option_or_the_environment(project_dir, tmp_path):
    write(project_dir, "model.py", CLEAN)
    run_graphlint("check", "model.py:make", "--cache-dir", str(tmp_path / "by-option"), cwd=project_dir)
    run_graphlint("check", "model.py:make", cwd=project_dir, env={"GRAPHLINT_CACHE_DIR": str(tmp_path / "by-env")})
    assert list((tmp_path / "by-option").rglob("targets/*.json")) and list((tmp_path / "by-env").rglob("targets/*.json"))
    assert not (project_dir / ".graphlint_cache").exists()


HANGS = '''
import torch
from torch import nn


class Hangs(nn.Module):
    def forward(self, x):
        while True:
            x = x + 0


def make():
    return Hangs(), (torch.randn(2),)
'''

CRASHES = '''
import os


def make():
    os.abort()
'''


def test_parallel_targets_keep_their_order_and_survive_a_hang_and_a_crash(project_dir):
    write(project_dir, "good.py", ATTENTION)
    write(project_dir, "clean.py", CLEAN)
    write(project_dir, "hangs.py", HANGS)
    write(project_dir, "crashes.py", CRASHES)
    targets = ["hangs.py:make", "good.py:make", "crashes.py:make", "clean.py:make"]
    result = run_graphlint("check", *targets, "-j", "2", "--timeout", "20", "--no-cache", "--format", "json",
                           cwd=project_dir)
    assert result.returncode == 2
    report = json.loads(result.stdout)
    assert [f["rule"] for f in report["findings"]] == ["GL101"]
    assert report["findings"][0]["location"]["path"] == "good.py"
    errors = {e["target"]: e["message"] for e in report["errors"]}
    assert list(errors) == ["hangs.py:make", "crashes.py:make"]
    assert errors["hangs.py:make"].startswith("did not finish within 20 s (--timeout)")
    assert errors["crashes.py:make"].startswith("the capture process crashed (signal 6)")
    assert report["summary"]["targets"] == 4 and report["summary"]["failed_targets"] == 2


def test_progress_is_shown_on_a_terminal_only(project_dir):
    write(project_dir, "model.py", CLEAN)
    controller, terminal = pty.openpty()
    try:
        on_terminal = subprocess.run([sys.executable, "-m", "graphlint", "check", "model.py:make", "--no-cache"],
                                     cwd=project_dir, stdout=subprocess.PIPE, stderr=terminal, timeout=300)
        os.close(terminal)
        shown = os.read(controller, 65536).decode()
    finally:
        os.close(controller)
    assert on_terminal.returncode == 0
    assert "capturing model.py:make" in shown and "model.py:make: captured on meta in" in shown
    piped = run_graphlint("check", "model.py:make", "--no-cache", cwd=project_dir)
    assert piped.stderr == ""

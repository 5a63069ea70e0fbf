"""The pre-commit hook, run by the real `pre-commit` program against a throwaway repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, write
from test_cli import ATTENTION, CLEAN

# pre-commit installs graphlint from this repository into a fresh environment
pytestmark = [pytest.mark.packaging,
              pytest.mark.skipif(shutil.which("git") is None, reason="pre-commit needs git")]


@pytest.fixture
def user_repo(tmp_path):
    """A user's repository: a pyproject naming a target, and git."""
    repo = tmp_path / "user-repo"
    write(repo, "pyproject.toml", '[project]\nname = "user"\nversion = "0"\n\n'
                                  '[tool.graphlint]\ntargets = ["model.py:make"]\n')
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    return repo


def try_hook(repo, tmp_path) -> subprocess.CompletedProcess:
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    env = {
        **os.environ,
        "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"),
        "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}",
        "GIT_AUTHOR_NAME": "test", "GIT_AUTHOR_EMAIL": "test@example.com",
        "GIT_COMMITTER_NAME": "test", "GIT_COMMITTER_EMAIL": "test@example.com",
    }
    return subprocess.run([sys.executable, "-m", "pre_commit", "try-repo", str(REPO), "graphlint"],
                           cwd=repo, env=env, capture_output=True, text=True, timeout=600)


def test_the_hook_fails_the_commit_on_findings(user_repo, tmp_path):
    write(user_repo, "model.py", ATTENTION)
    result = try_hook(user_repo, tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "graphlint" in result.stdout and "Failed" in result.stdout
    assert "model.py:" in result.stdout and "GL101 Hand-written softmax attention" in result.stdout


def test_the_hook_passes_a_clean_model(user_repo, tmp_path):
    write(user_repo, "model.py", CLEAN)
    result = try_hook(user_repo, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Passed" in result.stdout


def test_the_hook_skips_commits_without_python_changes(user_repo, tmp_path):
    write(user_repo, "model.py", ATTENTION)
    subprocess.run(["git", "add", "-A"], cwd=user_repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "model"],
                   cwd=user_repo, check=True)
    write(user_repo, "NOTES.md", "nothing to lint here\n")
    result = try_hook(user_repo, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Skipped" in result.stdout


def test_the_hook_keeps_the_result_cache_in_the_repository_between_commits(user_repo, tmp_path):
    write(user_repo, "model.py", ATTENTION)
    first = try_hook(user_repo, tmp_path)
    assert first.returncode == 1, first.stdout + first.stderr
    entries = sorted((user_repo / ".graphlint_cache").glob("v*/targets/*.json"))
    assert len(entries) == 1  # the target's result, kept beside pyproject.toml
    written = entries[0].stat().st_mtime_ns
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=user_repo,
                            capture_output=True, text=True, check=True).stdout
    assert ".graphlint_cache" not in status  # never committed
    write(user_repo, "other.py", "x = 1\n")  # not imported by the target: its cached result still holds
    second = try_hook(user_repo, tmp_path)
    assert second.returncode == 1 and "GL101 Hand-written softmax attention" in second.stdout, second.stdout
    # Answered from the cache: a hit is never written back, a new capture would have written the entry again.
    assert sorted((user_repo / ".graphlint_cache").glob("v*/targets/*.json")) == entries
    assert entries[0].stat().st_mtime_ns == written

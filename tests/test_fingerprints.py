"""Fingerprints: GitHub's primaryLocationLineHash exactly, and graphlint's own identity that survives moves."""

from __future__ import annotations

import json

import pytest

from conftest import lint_file, write
from graphlint.fingerprint import github_line_hashes
from graphlint.report.sarif import render_sarif
from test_cli import ATTENTION

# The vectors GitHub publishes with its upload action (codeql-action, src/fingerprints.test.ts).
GITHUB_VECTORS = [
    ("", ["c129715d7a2bc9a3:1"]),
    (" a\nb\n  \t\tc\n d", ["271789c17abda88f:1", "54703d4cd895b18:1", "180aee12dab6264:1", "a23a3dc5e078b07b:1"]),
    (" hello; \t\nworld!!!\n\n\n  \t\tGreetings\n End",
     ["8b7cf3e952e7aeb2:1", "b1ae1287ec4718d9:1", "bff680108adb0fcc:1", "c6805c5e1288b612:1",
      "b86d3392aea1be30:1", "e6ceba753e1a442:1"]),
    (" hello; \t\nworld!!!\n\n\n  \t\tGreetings\n End\n",
     ["e9496ae3ebfced30:1", "fb7c023a8b9ccb3f:1", "ce8ba1a563dcdaca:1", "e20e36e16fcb0cc8:1",
      "b3edc88f2938467e:1", "c8e28b0b4002a3a0:1", "c129715d7a2bc9a3:1"]),
    (" hello; \t\nworld!!!\r\r\r  \t\tGreetings\r End\r",
     ["e9496ae3ebfced30:1", "fb7c023a8b9ccb3f:1", "ce8ba1a563dcdaca:1", "e20e36e16fcb0cc8:1",
      "b3edc88f2938467e:1", "c8e28b0b4002a3a0:1", "c129715d7a2bc9a3:1"]),
    (" hello; \t\r\nworld!!!\r\n\r\n\r\n  \t\tGreetings\r\n End\r\n",
     ["e9496ae3ebfced30:1", "fb7c023a8b9ccb3f:1", "ce8ba1a563dcdaca:1", "e20e36e16fcb0cc8:1",
      "b3edc88f2938467e:1", "c8e28b0b4002a3a0:1", "c129715d7a2bc9a3:1"]),
    (" hello; \t\nworld!!!\r\n\n\r  \t\tGreetings\r End\r\n",
     ["e9496ae3ebfced30:1", "fb7c023a8b9ccb3f:1", "ce8ba1a563dcdaca:1", "e20e36e16fcb0cc8:1",
      "b3edc88f2938467e:1", "c8e28b0b4002a3a0:1", "c129715d7a2bc9a3:1"]),
    ("Lorem ipsum dolor sit amet.\n" * 10,
     ["a7f2ff13bc495cf2:1", "a7f2ff13bc495cf2:2", "a7f2ff13bc495cf2:3", "a7f2ff13bc495cf2:4",
      "a7f2ff13bc495cf2:5", "a7f2ff13bc495cf2:6", "a7f2ff1481e87703:1", "a9cf91f7bbf1862b:1",
      "55ec222b86bcae53:1", "cc97dc7b1d7d8f7b:1", "c129715d7a2bc9a3:1"]),
]


@pytest.mark.parametrize(("text", "expected"), GITHUB_VECTORS, ids=range(len(GITHUB_VECTORS)))
def test_line_hashes_match_githubs_published_vectors(text, expected):
    assert github_line_hashes(text) == expected


def sarif_result(path):
    return json.loads(render_sarif(lint_file(path)))["runs"][0]["results"][0]


def test_sarif_results_carry_githubs_line_hash_of_their_line(tmp_path):
    path = write(tmp_path, "model.py", ATTENTION)
    result = sarif_result(path)
    line = result["locations"][0]["physicalLocation"]["region"]["startLine"]
    hashes = github_line_hashes(path.read_text())
    assert result["partialFingerprints"]["primaryLocationLineHash"] == hashes[line - 1]


def test_graphlints_fingerprint_survives_moving_the_code_and_changes_with_the_line(tmp_path):
    path = write(tmp_path, "model.py", ATTENTION)
    before = sarif_result(path)["partialFingerprints"]["graphlint/v1"]
    moved = write(tmp_path / "moved", "model.py", "# a header comment\n\n\nimport math\n" + ATTENTION.lstrip())
    after_move = sarif_result(moved)
    assert after_move["locations"][0]["physicalLocation"]["region"]["startLine"] > \
        sarif_result(path)["locations"][0]["physicalLocation"]["region"]["startLine"]
    assert after_move["partialFingerprints"]["graphlint/v1"] == before
    edited = write(tmp_path / "edited", "model.py", ATTENTION.replace("dim=-1) @ v", "dim=-1) @ v  # note"))
    assert sarif_result(edited)["partialFingerprints"]["graphlint/v1"] != before

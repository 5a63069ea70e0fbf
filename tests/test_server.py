"""`graphlint server`, driven by a real Language Server client (pytest-lsp) over stdio, as an editor drives it:
diagnostics where they belong, cleared and brought back by saves, quick fixes, hovers, failures that leave the
server serving, and a clean exit with no child left."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_asyncio
from lsprotocol import types
from pytest_lsp import client_capabilities, make_test_lsp_client

from conftest import line_of, write

pytestmark = [pytest.mark.cli]

# Long enough for a cold server on a loaded machine; a safety net, not a measure of speed.
PATIENCE = 180

PYPROJECT = '''
[project]
name = "user-project"
version = "0"

[tool.graphlint]
targets = ["model.py:make"]
{extra}
'''

ATTENTION = '''
import math

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        {body}
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


def make():
    {setup}return Attention(), (torch.randn(2, 16, 32),)
'''
UNFUSED = '''att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mood = "😀 naïve"; att = F.softmax(att, dim=-1)
        y = att @ v'''
FUSED = "y = F.scaled_dot_product_attention(q, k, v)"

GATE = '''
import torch
from torch import nn


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x):
        gate = torch.sigmoid(self.proj(x))
        gate *= 2
        return gate


def make():
    return Gate(), (torch.randn(4, 16),)
'''


def attention(body: str = UNFUSED, setup: str = "") -> str:
    return ATTENTION.replace("{body}", body).replace("{setup}", setup)


def project_with(folder: Path, model: str, extra: str = "") -> Path:
    write(folder, "pyproject.toml", PYPROJECT.replace("{extra}", extra))
    return write(folder, "model.py", model)


async def start_server(folder: Path, editor: str = "visual-studio-code", *options: str):
    client = make_test_lsp_client()
    await client.start_io(sys.executable, "-m", "graphlint", "server", *options, cwd=str(folder),
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    await client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities(editor),
        root_uri=folder.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=folder.as_uri(), name=folder.name)],
    ))
    return client


@pytest_asyncio.fixture
async def servers():
    """Starts servers on folders; each is shut down at the end of the test if the test did not."""
    started = []

    async def start(folder: Path, editor: str = "visual-studio-code", *options: str):
        client = await start_server(folder, editor, *options)
        started.append(client)
        return client

    yield start
    for client in started:
        if client._server is not None and client._server.returncode is None:
            await client.shutdown_session()
        await client.stop()


def open_file(client, path: Path) -> None:
    client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
        uri=path.as_uri(), language_id="python", version=1, text=path.read_text(encoding="utf-8"))))


def save_file(client, path: Path, text: str) -> None:
    """What an editor does when the user saves: the new text is on disk, then didSave."""
    path.write_text(text, encoding="utf-8")
    client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(
        uri=path.as_uri())))


async def diagnostics_until(client, path: Path, wanted, patience: float = PATIENCE) -> list[types.Diagnostic]:
    """The file's published diagnostics once they satisfy `wanted`."""
    uri = path.as_uri()

    async def poll():
        while True:
            found = client.diagnostics.get(uri)
            if found is not None and wanted(found):
                return list(found)
            await asyncio.sleep(0.05)

    try:
        return await asyncio.wait_for(poll(), patience)
    except asyncio.TimeoutError:
        raise AssertionError(f"diagnostics of {path.name} never satisfied the test; last: "
                             f"{client.diagnostics.get(uri)!r}; messages: {client.messages!r}") from None


def codes(diagnostics) -> list:
    return [d.code for d in diagnostics]


def has(code: str):
    return lambda diagnostics: code in codes(diagnostics)


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux's /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                    if int(handle.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def a_child_of(client) -> int:
    async def poll():
        while not (found := children_of(client._server.pid)):
            await asyncio.sleep(0.05)
        return found[0]

    return await asyncio.wait_for(poll(), PATIENCE)


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads processes from /proc")


@pytest.mark.asyncio
async def test_opening_a_model_file_shows_gl101_at_the_softmax_call_in_utf16_columns(servers, tmp_path):
    model = project_with(tmp_path, attention())
    client = await servers(tmp_path)
    open_file(client, model)
    [diagnostic] = await diagnostics_until(client, model, has("GL101"))
    line = line_of(model, "F.softmax")
    text = model.read_text(encoding="utf-8").splitlines()[line - 1]
    start = text.index("F.softmax")
    utf16 = len(text[:start].encode("utf-16-le")) // 2  # the emoji counts twice
    assert diagnostic.range == types.Range(
        start=types.Position(line=line - 1, character=utf16),
        end=types.Position(line=line - 1, character=utf16 + len("F.softmax(att, dim=-1)")),
    )
    assert diagnostic.severity == types.DiagnosticSeverity.Warning
    assert diagnostic.source == "graphlint"
    assert diagnostic.code_description.href.endswith("docs/rules.md#gl101-unfused-attention")
    assert "scaled_dot_product_attention" in diagnostic.message
    related = {r.message: r.location for r in diagnostic.related_information}
    assert "attention scores: matmul" in related
    assert related["attention scores: matmul"].range.start.line == line_of(model, "q @ k.transpose") - 1
    assert client.messages == []


@pytest.mark.asyncio
async def test_a_client_that_counts_utf8_bytes_gets_utf8_columns(servers, tmp_path):
    model = project_with(tmp_path, attention())
    client = await servers(tmp_path, "neovim")  # Neovim 0.11 prefers UTF-8 positions
    open_file(client, model)
    [diagnostic] = await diagnostics_until(client, model, has("GL101"))
    text = model.read_text(encoding="utf-8").splitlines()[line_of(model, "F.softmax") - 1]
    assert diagnostic.range.start.character == len(text[:text.index("F.softmax")].encode("utf-8"))


@pytest.mark.asyncio
async def test_saving_a_fix_clears_the_diagnostic_and_saving_the_bug_again_brings_it_back(servers, tmp_path):
    model = project_with(tmp_path, attention())
    client = await servers(tmp_path)
    open_file(client, model)
    await diagnostics_until(client, model, has("GL101"))
    save_file(client, model, attention(FUSED))
    assert await diagnostics_until(client, model, lambda d: not d) == []
    save_file(client, model, attention())
    [diagnostic] = await diagnostics_until(client, model, has("GL101"))
    assert diagnostic.range.start.line == line_of(model, "F.softmax") - 1


@pytest.mark.asyncio
async def test_a_syntax_error_is_one_diagnostic_at_its_line_and_the_server_keeps_serving(servers, tmp_path):
    model = project_with(tmp_path, attention())
    client = await servers(tmp_path)
    open_file(client, model)
    await diagnostics_until(client, model, has("GL101"))
    broken = attention().replace("def make():", "def make(:")
    save_file(client, model, broken)
    [diagnostic] = await diagnostics_until(client, model, lambda d: len(d) == 1 and d[0].code is None)
    assert "syntax error" in diagnostic.message and "model.py:make" in diagnostic.message
    assert diagnostic.severity == types.DiagnosticSeverity.Error
    assert diagnostic.range.start.line == line_of(model, "def make(:") - 1
    save_file(client, model, attention())
    await diagnostics_until(client, model, has("GL101"))


@pytest.mark.asyncio
@pytest.mark.parametrize(("setup", "expected"), [
    ("import os; os._exit(3)\n    ", "exited with code 3"),
    ("import time; time.sleep(600)\n    ", "did not finish within 2 s"),
    ('raise ValueError("no weights here")\n    ', "the factory raised ValueError: no weights here"),
], ids=["crash", "hang", "raises"])
async def test_a_target_that_crashes_hangs_or_raises_is_one_diagnostic_that_says_so(servers, tmp_path, setup, expected):
    model = project_with(tmp_path, attention(setup=setup), extra="timeout = 2")
    client = await servers(tmp_path)
    open_file(client, model)
    [diagnostic] = await diagnostics_until(client, model, lambda d: len(d) == 1)
    assert expected in diagnostic.message
    save_file(client, model, attention())  # and the server goes on serving
    await diagnostics_until(client, model, has("GL101"))


@pytest.mark.asyncio
@linux_only
async def test_a_newer_save_kills_the_older_lint_of_the_same_target(servers, tmp_path):
    model = project_with(tmp_path, attention(setup="import time; time.sleep(600)\n    "))
    client = await servers(tmp_path)
    open_file(client, model)
    hanging = await a_child_of(client)
    save_file(client, model, attention())
    await diagnostics_until(client, model, has("GL101"))
    assert not alive(hanging)


@pytest.mark.asyncio
async def test_a_fixable_finding_offers_a_quick_fix_that_rewrites_the_line(servers, tmp_path):
    model = project_with(tmp_path, GATE)
    client = await servers(tmp_path)
    open_file(client, model)
    [diagnostic] = await diagnostics_until(client, model, has("GL201"))
    actions = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=model.as_uri()), range=diagnostic.range,
        context=types.CodeActionContext(diagnostics=[diagnostic])))
    [action] = actions
    assert action.kind == types.CodeActionKind.QuickFix
    assert action.title == "Fix GL201: gate *= 2 → gate = gate * 2"
    [edit] = action.edit.changes[model.as_uri()]
    line = line_of(model, "gate *= 2") - 1
    assert edit.range.start.line == edit.range.end.line == line
    lines = model.read_text(encoding="utf-8").splitlines()
    lines[line] = lines[line][:edit.range.start.character] + edit.new_text + lines[line][edit.range.end.character:]
    assert lines[line] == "        gate = gate * 2"


@pytest.mark.asyncio
async def test_no_quick_fix_for_a_finding_whose_line_changed_since_the_save(servers, tmp_path):
    model = project_with(tmp_path, GATE)
    client = await servers(tmp_path)
    open_file(client, model)
    [diagnostic] = await diagnostics_until(client, model, has("GL201"))
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=model.as_uri(), version=2),
        content_changes=[types.TextDocumentContentChangeWholeDocument(text="# edited\n" + GATE)]))
    actions = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=model.as_uri()), range=diagnostic.range,
        context=types.CodeActionContext(diagnostics=[diagnostic])))
    assert actions is None


@pytest.mark.asyncio
async def test_hovering_a_diagnostic_shows_its_rules_documentation(servers, tmp_path):
    model = project_with(tmp_path, attention())
    client = await servers(tmp_path)
    open_file(client, model)
    [diagnostic] = await diagnostics_until(client, model, has("GL101"))
    hover = await client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=model.as_uri()), position=diagnostic.range.start))
    assert hover.contents.kind == types.MarkupKind.Markdown
    assert hover.contents.value.startswith("# GL101 unfused-attention")
    assert "## Why it matters" in hover.contents.value and "## Use instead" in hover.contents.value
    elsewhere = await client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=model.as_uri()), position=types.Position(line=0, character=0)))
    assert elsewhere is None


GATED = UNFUSED + """
        y = torch.sigmoid(y)
        y *= 2"""


@pytest.mark.asyncio
async def test_severities_suppressions_and_per_file_ignores_apply_as_on_the_command_line(servers, tmp_path):
    model = project_with(tmp_path, attention(GATED.replace("y *= 2", "y *= 2  # graphlint: ignore[GL201]")),
                         extra='per-file-ignores = { "legacy/*.py" = ["GL101"] }\n'
                               '[tool.graphlint.severity]\nGL101 = "error"')
    model.parent.joinpath("pyproject.toml").write_text(
        model.parent.joinpath("pyproject.toml").read_text().replace('["model.py:make"]',
                                                                    '["model.py:make", "legacy/old.py:make"]'))
    legacy = write(tmp_path / "legacy", "old.py", attention(GATED))
    client = await servers(tmp_path)
    open_file(client, model)
    [diagnostic] = await diagnostics_until(client, model, has("GL101"))
    assert diagnostic.severity == types.DiagnosticSeverity.Error  # and GL201 is suppressed by its comment
    assert codes(await diagnostics_until(client, legacy, has("GL201"))) == ["GL201"]  # GL101 ignored there


@pytest.mark.asyncio
async def test_files_of_no_target_get_nothing(servers, tmp_path):
    model = project_with(tmp_path, attention())
    helpers = write(tmp_path, "helpers.py", attention())  # nothing imports it
    client = await servers(tmp_path)
    open_file(client, helpers)
    open_file(client, model)
    await diagnostics_until(client, model, has("GL101"))
    save_file(client, helpers, attention() + "\n")
    save_file(client, model, attention(FUSED))
    await diagnostics_until(client, model, lambda d: not d)
    assert helpers.as_uri() not in client.diagnostics


@pytest.mark.asyncio
async def test_baselined_findings_are_not_shown(servers, tmp_path):
    model = project_with(tmp_path, attention(GATED))
    baseline = write(tmp_path, "baseline.json", '{"version": 1, "tool": "graphlint", "findings": []}')
    client = await servers(tmp_path, "visual-studio-code", "--baseline", str(baseline))
    open_file(client, model)
    diagnostics = await diagnostics_until(client, model, lambda d: set(codes(d)) == {"GL101", "GL201"})
    [gl101] = [d for d in diagnostics if d.code == "GL101"]
    baseline.write_text(json.dumps({"version": 1, "tool": "graphlint", "findings": [
        {"rule": "GL101", "path": "model.py", "fingerprint": gl101.data["fingerprint"], "message": gl101.message}]}))
    pyproject = tmp_path / "pyproject.toml"
    save_file(client, pyproject, pyproject.read_text())  # the configuration is read again, with the baseline
    assert codes(await diagnostics_until(client, model, lambda d: codes(d) == ["GL201"])) == ["GL201"]


@pytest.mark.asyncio
async def test_a_finding_in_a_sibling_module_is_shown_there_and_saving_the_sibling_lints_again(servers, tmp_path):
    write(tmp_path, "layers.py", attention())
    model = project_with(tmp_path, "from layers import Attention, make  # noqa: F401\n")
    layers = tmp_path / "layers.py"
    client = await servers(tmp_path)
    open_file(client, model)
    await diagnostics_until(client, layers, has("GL101"))
    save_file(client, layers, attention(FUSED))
    await diagnostics_until(client, layers, lambda d: not d)


@pytest.mark.asyncio
@linux_only
async def test_shutdown_and_exit_end_the_server_and_its_children(tmp_path):
    model = project_with(tmp_path, attention(setup="import time; time.sleep(600)\n    "))
    client = await start_server(tmp_path)
    try:
        open_file(client, model)
        hanging = await a_child_of(client)
        await asyncio.wait_for(client.shutdown_session(), PATIENCE)
        assert client._server.returncode == 0
        assert not alive(hanging)
    finally:
        await client.stop()


def test_without_pygls_the_command_says_which_extra_to_install(tmp_path):
    blocker = write(tmp_path / "blocker", "pygls.py", 'raise ModuleNotFoundError("No module named \'pygls\'", name="pygls")\n')
    completed = subprocess.run(
        [sys.executable, "-m", "graphlint", "server"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(blocker.parent)}, stdin=subprocess.DEVNULL,
    )
    assert completed.returncode == 2
    assert completed.stderr == "graphlint server needs the server extra: pip install 'torch-graphlint[server]'\n"
    assert completed.stdout == ""

"""`graphlint server`, driven by a real Language Server client (pytest-lsp) over stdio, as an editor drives it:
diagnostics where they belong, cleared and brought back by saves, quick fixes, hovers, failures that leave the
server serving, and a clean exit with no child left."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import pytest_asyncio
from lsprotocol import types
from pytest_lsp import client_capabilities, make_test_lsp_client

import test_fix_observable
import test_fix_safety
from conftest import line_of, write

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

# The torch.compile rules (a dynamo trace per lint) left out of a server test not about them (CONTRIBUTING.md).
WITHOUT_GL3 = 'ignore = ["GL3"]\n'

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


def niceness(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[16])


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


# One server and one project for several behaviours, each checked where its comment says: a server's start is
# what these tests cost.
@pytest.mark.server
@pytest.mark.cli
@pytest.mark.asyncio
async def test_gl101_shows_in_utf16_columns_with_its_documentation_and_goes_and_comes_with_saves_and_syntax_errors(
        servers, tmp_path):
    model = project_with(tmp_path, attention(), WITHOUT_GL3)
    client = await servers(tmp_path)
    open_file(client, model)
    # Opening a model file shows GL101 at the softmax call, in UTF-16 columns.
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
    # Hovering the diagnostic shows its rule's documentation; hovering elsewhere shows nothing.
    hover = await client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=model.as_uri()), position=diagnostic.range.start))
    assert hover.contents.kind == types.MarkupKind.Markdown
    assert hover.contents.value.startswith("# GL101 unfused-attention")
    assert "## Why it matters" in hover.contents.value and "## Use instead" in hover.contents.value
    elsewhere = await client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=model.as_uri()), position=types.Position(line=0, character=0)))
    assert elsewhere is None
    # A syntax error is one diagnostic at its line, and the server keeps serving.
    broken = attention().replace("def make():", "def make(:")
    save_file(client, model, broken)
    [diagnostic] = await diagnostics_until(client, model, lambda d: len(d) == 1 and d[0].code is None)
    assert "syntax error" in diagnostic.message and "model.py:make" in diagnostic.message
    assert diagnostic.severity == types.DiagnosticSeverity.Error
    assert diagnostic.range.start.line == line_of(model, "def make(:") - 1
    save_file(client, model, attention())
    await diagnostics_until(client, model, has("GL101"))
    # Saving a fix clears the diagnostic, and saving the bug again brings it back.
    save_file(client, model, attention(FUSED))
    assert await diagnostics_until(client, model, lambda d: not d) == []
    save_file(client, model, attention())
    [diagnostic] = await diagnostics_until(client, model, has("GL101"))
    assert diagnostic.range.start.line == line_of(model, "F.softmax") - 1


@pytest.mark.server
@pytest.mark.cli
@pytest.mark.asyncio
async def test_a_client_that_counts_utf8_bytes_gets_utf8_columns(servers, tmp_path):
    model = project_with(tmp_path, attention(), WITHOUT_GL3)
    client = await servers(tmp_path, "neovim")  # Neovim 0.11 prefers UTF-8 positions
    open_file(client, model)
    [diagnostic] = await diagnostics_until(client, model, has("GL101"))
    text = model.read_text(encoding="utf-8").splitlines()[line_of(model, "F.softmax") - 1]
    assert diagnostic.range.start.character == len(text[:text.index("F.softmax")].encode("utf-8"))


@pytest.mark.server
@pytest.mark.cli
@pytest.mark.asyncio
async def test_a_target_that_crashes_hangs_or_raises_is_one_diagnostic_that_says_so(servers, tmp_path):
    # 4 s: the good model saved after the failures is linted under the same bound, on a loaded CI machine too.
    # One server for the three failures, each saved over the last: a server's start is what these tests cost.
    model = project_with(tmp_path, attention(setup="import os; os._exit(3)\n    "), extra=WITHOUT_GL3 + "timeout = 4")
    client = await servers(tmp_path)
    open_file(client, model)
    for setup, expected in ((None, "exited with code 3"),
                            ('raise ValueError("no weights here")\n    ', "the factory raised ValueError: no weights here"),
                            ("import time; time.sleep(600)\n    ", "did not finish within 4 s")):
        if setup is not None:
            save_file(client, model, attention(setup=setup))
        await diagnostics_until(client, model, lambda d, says=expected: len(d) == 1 and says in d[0].message)
    save_file(client, model, attention())  # and the server goes on serving
    await diagnostics_until(client, model, has("GL101"))


@pytest.mark.server
@pytest.mark.cli
@pytest.mark.asyncio
@linux_only
async def test_a_newer_save_kills_the_older_lint_of_the_same_target(servers, tmp_path):
    model = project_with(tmp_path, attention(setup="import time; time.sleep(600)\n    "), WITHOUT_GL3)
    client = await servers(tmp_path)
    open_file(client, model)
    hanging = await a_child_of(client)
    save_file(client, model, attention())
    await diagnostics_until(client, model, has("GL101"))
    assert not alive(hanging)


@pytest.mark.server
@pytest.mark.cli
@pytest.mark.asyncio
async def test_a_fixable_finding_offers_a_quick_fix_that_rewrites_the_line_until_the_line_changes(servers, tmp_path):
    model = project_with(tmp_path, GATE, WITHOUT_GL3)
    client = await servers(tmp_path)
    open_file(client, model)
    [diagnostic] = await diagnostics_until(client, model, has("GL201"))
    # The saved file's finding offers one quick fix, which rewrites its line.
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
    # No quick fix once the finding's line changed in the editor since the save.
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=model.as_uri(), version=2),
        content_changes=[types.TextDocumentContentChangeWholeDocument(text="# edited\n" + GATE)]))
    actions = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=model.as_uri()), range=diagnostic.range,
        context=types.CodeActionContext(diagnostics=[diagnostic])))
    assert actions is None


GATED = UNFUSED + """
        y = torch.sigmoid(y)
        y *= 2"""


@pytest.mark.server
@pytest.mark.cli
@pytest.mark.asyncio
async def test_severities_suppressions_and_per_file_ignores_apply_as_on_the_command_line(servers, tmp_path):
    model = project_with(tmp_path, attention(GATED.replace("y *= 2", "y *= 2  # graphlint: ignore[GL201]")),
                         extra=WITHOUT_GL3 + 'per-file-ignores = { "legacy/*.py" = ["GL101"] }\n'
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


@pytest.mark.server
@pytest.mark.cli
@pytest.mark.asyncio
async def test_files_of_no_target_get_nothing(servers, tmp_path):
    model = project_with(tmp_path, attention(), WITHOUT_GL3)
    helpers = write(tmp_path, "helpers.py", attention())  # nothing imports it
    client = await servers(tmp_path)
    open_file(client, helpers)
    open_file(client, model)
    await diagnostics_until(client, model, has("GL101"))
    save_file(client, helpers, attention() + "\n")
    save_file(client, model, attention(FUSED))
    await diagnostics_until(client, model, lambda d: not d)
    assert helpers.as_uri() not in client.diagnostics


@pytest.mark.server
@pytest.mark.cli
@pytest.mark.asyncio
async def test_baselined_findings_are_not_shown(servers, tmp_path):
    model = project_with(tmp_path, attention(GATED), WITHOUT_GL3)
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


@pytest.mark.server
@pytest.mark.cli
@pytest.mark.asyncio
async def test_a_finding_in_a_sibling_module_is_shown_there_and_saving_the_sibling_lints_again(servers, tmp_path):
    write(tmp_path, "layers.py", attention())
    model = project_with(tmp_path, "from layers import Attention, make  # noqa: F401\n", WITHOUT_GL3)
    layers = tmp_path / "layers.py"
    client = await servers(tmp_path)
    open_file(client, model)
    await diagnostics_until(client, layers, has("GL101"))
    save_file(client, layers, attention(FUSED))
    await diagnostics_until(client, layers, lambda d: not d)


@pytest.mark.server
@pytest.mark.cli
@pytest.mark.asyncio
@linux_only
async def test_shutdown_and_exit_end_the_server_and_its_children(tmp_path):
    model = project_with(tmp_path, attention(setup="import time; time.sleep(600)\n    "), WITHOUT_GL3)
    client = await start_server(tmp_path)
    try:
        open_file(client, model)
        hanging = await a_child_of(client)
        await asyncio.wait_for(client.shutdown_session(), PATIENCE)
        assert client._server.returncode == 0
        assert not alive(hanging)
    finally:
        await client.stop()


@pytest.mark.server
@pytest.mark.cli
def test_without_pygls_the_command_says_which_extra_to_install(tmp_path):
    blocker = write(tmp_path / "blocker", "pygls.py", 'raise ModuleNotFoundError("No module named \'pygls\'", name="pygls")\n')
    completed = subprocess.run(
        [sys.executable, "-m", "graphlint", "server"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(blocker.parent)}, stdin=subprocess.DEVNULL,
    )
    assert completed.returncode == 2
    message = completed.stderr.splitlines()
    assert len(message) == 1 and message[0].startswith("graphlint server needs the server extra: pip install ")
    assert "torch-graphlint[server] @ git+" in message[0]  # the package is not on PyPI: it says where from
    assert completed.stdout == ""


class StrictClient:
    """A client that reads the server's stdout byte by byte as the protocol frames it, and fails on anything else
    (pygls' own reader skips stray lines; editors such as VS Code do not)."""

    HEADER = re.compile(rb"(Content-Length: \d+|Content-Type: [^\r\n]+)\r\n")

    def __init__(self, folder: Path, env: dict) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "graphlint", "server"], cwd=folder, env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.received: queue.Queue = queue.Queue()
        self.stderr = b""
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self._id = 0

    def send(self, method: str, params, request: bool = False) -> None:
        message = {"jsonrpc": "2.0", "method": method, "params": params}
        if request:
            self._id += 1
            message["id"] = self._id
        body = json.dumps(message).encode()
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        self.process.stdin.flush()

    def next_message(self, wanted) -> dict:
        deadline = time.monotonic() + PATIENCE
        while True:
            message = self.received.get(timeout=max(0.0, deadline - time.monotonic()))
            assert not isinstance(message, bytes), f"stdout carried something else than the protocol: {message!r}"
            if wanted(message):
                return message

    def _read(self) -> None:
        stream = self.process.stdout
        while True:
            length = None
            while (line := stream.readline()) != b"\r\n":
                if not line:
                    return
                if not self.HEADER.fullmatch(line):
                    self.received.put(line)
                    return
                if line.startswith(b"Content-Length"):
                    length = int(line.split(b":")[1])
            self.received.put(json.loads(stream.read(length)))

    def _drain_stderr(self) -> None:
        for line in self.process.stderr:
            self.stderr += line


@pytest.mark.server
@pytest.mark.cli
def test_what_libraries_print_in_the_server_process_never_reaches_the_protocol(tmp_path):
    # An installed library that prints at import, from Python and from its file descriptor: the warm parent
    # imports it after a child did, so that later children inherit it.
    site = tmp_path / "env" / "site-packages"
    write(site / "noisy", "__init__.py", 'import os\nprint("noise from print")\nos.write(1, b"noise from fd 1\\n")\n')
    folder = tmp_path / "project"
    model = project_with(folder, "import noisy  # noqa: F401\n" + attention(), WITHOUT_GL3)
    client = StrictClient(folder, {**os.environ, "PYTHONPATH": str(site), "PYTHONWARNINGS": "ignore"})
    try:
        client.send("initialize", {"processId": os.getpid(), "rootUri": folder.as_uri(), "capabilities": {}}, True)
        client.next_message(lambda m: m.get("id") == 1)
        client.send("initialized", {})
        client.send("textDocument/didOpen", {"textDocument": {"uri": model.as_uri(), "languageId": "python",
                                                             "version": 1, "text": model.read_text()}})

        def gl101(message) -> bool:
            return message.get("method") == "textDocument/publishDiagnostics" and \
                [d["code"] for d in message["params"]["diagnostics"]] == ["GL101"]

        client.next_message(gl101)  # the first child imported noisy, and so did the server process after it
        model.write_text(model.read_text() + "\n")
        client.send("textDocument/didSave", {"textDocument": {"uri": model.as_uri()}})
        client.next_message(gl101)
        client.send("shutdown", None, True)
        client.next_message(lambda m: m.get("id") == 2)
        client.send("exit", None)
        assert client.process.wait(PATIENCE) == 0
    finally:
        client.process.kill()
    assert client.received.empty()
    assert client.stderr.count(b"noise from print") >= 2 and client.stderr.count(b"noise from fd 1") >= 2


def test_columns_count_in_the_unit_the_client_chose(tmp_path):
    from graphlint.report.columns import SourceColumns

    path = str(write(tmp_path, "m.py", 'x = "😀ï"; y = 1\n'))
    column = 'x = "😀ï"; y = 1'.index("y") + 1  # graphlint's 1-based code-point column
    assert [SourceColumns(unit).convert(path, 1, column) for unit in ("utf-32", "utf-16", "utf-8")] == [
        column, column + 1, column + 3 + 1]  # the emoji is 2 UTF-16 units, 4 UTF-8 bytes; ï is 2 bytes


def test_a_failure_is_placed_where_its_message_says_else_on_the_targets_first_line(tmp_path):
    from graphlint.results import TargetError
    from graphlint.server.diagnostics import error_place

    model = str(write(tmp_path, "model.py", "def make():\n    raise ValueError\n"))
    raised = TargetError("model.py:make", "the factory raised ValueError (at model.py:2)", model, 2, "factory")
    assert error_place(raised, model) == (model, 2)
    crashed = TargetError("model.py:make", "its process exited with code 3 during the factory", stage="factory")
    assert error_place(crashed, model) == (model, 1)
    assert error_place(TargetError("pkg.models:make", "cannot import module 'pkg'"), None) is None


# -- GL101's quick fix: safe where nothing can observe the change, unsafe ones as --unsafe-fixes would write them

def _apply_text_edits(text: str, edits: list[types.TextEdit]) -> str:
    """Text edits applied as a client applies them (the file is ASCII: UTF-16 columns are characters)."""
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(position: types.Position) -> int:
        return starts[position.line] + position.character

    for edit in sorted(edits, key=lambda e: (e.range.start.line, e.range.start.character), reverse=True):
        text = text[:offset(edit.range.start)] + edit.new_text + text[offset(edit.range.end):]
    return text


async def _actions(client, path, diagnostic, wanted=lambda actions: bool(actions)):
    """The code actions on the diagnostic once they satisfy `wanted` (an unsafe fix is offered once proven)."""
    async def poll():
        while True:
            actions = await client.text_document_code_action_async(types.CodeActionParams(
                text_document=types.TextDocumentIdentifier(uri=path.as_uri()), range=diagnostic.range,
                context=types.CodeActionContext(diagnostics=[diagnostic])))
            if wanted(actions or []):
                return actions or []
            await asyncio.sleep(0.2)
    return await asyncio.wait_for(poll(), PATIENCE)


@pytest.mark.server
@pytest.mark.cli
@pytest.mark.asyncio
async def test_a_nanogpt_block_offers_the_gl101_quick_fix_and_the_client_applies_it(servers, tmp_path):
    model = project_with(tmp_path, test_fix_observable._source("nanoGPT"), WITHOUT_GL3)
    client = await servers(tmp_path)
    open_file(client, model)
    diagnostics = await diagnostics_until(client, model, has("GL101"))
    [diagnostic] = [d for d in diagnostics if d.code == "GL101"]
    [action] = [a for a in await _actions(client, model, diagnostic) if a.title.startswith("Fix GL101")]
    assert action.kind == types.CodeActionKind.QuickFix and action.is_preferred
    assert action.title.startswith("Fix GL101: hand-written attention → F.scaled_dot_product_attention(...); the "
                                   "fix no longer calls self.attn_dropout (a Dropout module), which has no hook")
    fixed = _apply_text_edits(model.read_text(encoding="utf-8"), action.edit.changes[model.as_uri()])
    assert "dropout_p=self.attn_dropout.p if self.training else 0.0" in fixed
    assert "F.softmax(" not in fixed
    fixed_path = tmp_path / "fixed" / "model.py"
    fixed_path.parent.mkdir()
    fixed_path.write_text(fixed, encoding="utf-8")
    # The edited file computes what the original did, in plain PyTorch.
    import torch

    before, _ = test_fix_observable._run(model, "server_original")
    after, _ = test_fix_observable._run(fixed_path, "server_fixed")
    assert torch.allclose(before, after, atol=1e-10)


TWO = test_fix_observable._source(
    "minGPT", "model.attn_drop.register_forward_hook(lambda m, i, o: RECORDED.append(o))"
).replace("def make():", "def _attention():") + test_fix_safety.PERCEIVER.replace("FILL", "-1e9").replace(
    "import torch\nfrom torch import nn\n", "").replace("class Attention(", "class Filled(").replace(
    "def make():", "def _filled():").replace("return Attention(), ", "return Filled(), ") + '''

class Both(nn.Module):
    def __init__(self):
        super().__init__()
        self.causal, _ = _attention()
        self.down = nn.Linear(32, 16)
        self.filled, _ = _filled()

    def forward(self, x, mask):
        return self.filled(self.down(self.causal(x)), mask)


def make():
    mask = torch.rand(2, 1, 8, 8) > 0.3
    mask[..., 0] = True
    return Both(), (torch.randn(2, 8, 32), mask)
'''


@pytest.mark.server
@pytest.mark.cli
@pytest.mark.asyncio
async def test_unsafe_fixes_are_offered_as_unsafe_fixes_would_write_them(servers, tmp_path):
    """A hooked dropout makes minGPT's fix unsafe: proven, it is offered, titled with the hook; the `-1e9` fill's
    fix computes something else on a fully masked row: never offered."""
    model = project_with(tmp_path, TWO, WITHOUT_GL3)
    client = await servers(tmp_path)
    open_file(client, model)
    diagnostics = await diagnostics_until(client, model, lambda d: [c.code for c in d].count("GL101") == 2)
    hooked, filled = sorted((d for d in diagnostics if d.code == "GL101"), key=lambda d: d.range.start.line)
    [action] = await _actions(client, model, hooked)
    assert action.kind == types.CodeActionKind.QuickFix and not action.is_preferred
    assert action.title == ("Fix GL101 (unsafe: the fix no longer calls self.attn_drop (a Dropout module): "
                            "causal.attn_drop has hooks registered (forward), which would stop firing): hand-written "
                            "attention → F.scaled_dot_product_attention(...)")
    # Both were proven together, before the first was offered: the second's proof found different outputs.
    assert await _actions(client, model, filled, wanted=lambda actions: True) == []
    # What the command line says of the same two fixes: both unsafe, the second never written.
    from conftest import findings_of, fix_plan, lint_file

    report = lint_file(model, device="cpu")
    assert [f.fix.applicability for f in findings_of(report, "GL101")] == ["unsafe", "unsafe"]
    plan = fix_plan(report, tmp_path, unsafe=True)
    assert [f.location.line for f in plan.applied] == [hooked.range.start.line + 1]
    assert [f.location.line for f in plan.broken] == [filled.range.start.line + 1]


# -- the editor never waits for the torch.compile analysis: a lint's other findings are published first, then the
# complete result for the same saved file; a newer save supersedes both, and only complete results are cached.

# GL3 selected whatever the default selection is.
WITH_GL3 = 'extend-select = ["GL3"]'
# GL101 (hand-written attention) and a GL301 graph break (print) in one forward.
BROKEN = attention(body="""att = F.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1))), dim=-1)
        y = att @ v
        print(y.mean())""")
# The same, with a break whose eager half sleeps (only under torch.compile): a compile stage of many seconds.
SLOW_BREAK = BROKEN.replace("        print(y.mean())", """        if torch.compiler.is_compiling():
            time.sleep(3)""").replace("import math\n", "import math\nimport time\n")


class Publishes(dict):
    """`client.diagnostics` that also keeps every publish, in order, as (uri, codes and lines)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, list[tuple[str, int]]]] = []

    def __setitem__(self, uri, diagnostics) -> None:
        self.log.append((uri, [(d.code, d.range.start.line + 1) for d in diagnostics]))
        super().__setitem__(uri, diagnostics)

    def of(self, path: Path) -> list[list[tuple[str, int]]]:
        return [shown for uri, shown in self.log if uri == path.as_uri()]


def recording(client) -> Publishes:
    client.diagnostics = Publishes()
    return client.diagnostics


def compile_rule_ids() -> set[str]:
    from graphlint.engine import load_rules
    from graphlint.pipeline import COMPILE_TAG

    return {rule.id for rule in load_rules() if COMPILE_TAG in rule.tags}


@pytest.mark.server
@pytest.mark.cli
@pytest.mark.compile
@pytest.mark.asyncio
async def test_the_fast_findings_are_published_first_then_the_graph_break_for_the_same_save(servers, tmp_path):
    model = project_with(tmp_path, BROKEN, extra=WITH_GL3)
    client = await servers(tmp_path)
    published = recording(client)
    open_file(client, model)
    await diagnostics_until(client, model, lambda d: "GL301" in codes(d))
    attention_line, break_line = line_of(model, "F.softmax"), line_of(model, "print(y.mean())")
    # One lint of one version of the file: the other rules' findings (GL103 for the print's sync), then the same
    # with the graph break.
    first, complete = published.of(model)
    assert ("GL101", attention_line) in first and not {code for code, _ in first} & compile_rule_ids()
    assert sorted(complete) == sorted([*first, ("GL301", break_line)])

    # The cache holds the complete result: the command line's session answers from it, graph break included.
    from graphlint.cache import default_folder
    from graphlint.project import Project
    from graphlint.session import Options, check

    project = Project.discover(tmp_path)
    events = []
    report = check(list(project.config.targets), project, project.config,
                   Options(cache=default_folder(project, None), progress=lambda t, event, **_: events.append(event)),
                   base=tmp_path)
    assert events == ["cached"]
    assert [(f.rule_id, f.location.line) for f in report.findings] == complete


@pytest.mark.server
@pytest.mark.cli
@pytest.mark.compile
@pytest.mark.asyncio
async def test_a_save_during_the_compile_stage_supersedes_it(servers, tmp_path):
    model = project_with(tmp_path, SLOW_BREAK, extra=WITH_GL3)
    client = await servers(tmp_path)
    published = recording(client)
    open_file(client, model)
    # The first stage is in: the child is in the torch.compile analysis, sleeping in the broken-off call.
    await diagnostics_until(client, model, lambda d: "GL101" in codes(d) and "GL301" not in codes(d))
    slow_line = line_of(model, "time.sleep(3)")
    if sys.platform.startswith("linux"):  # the analysis runs below the server's priority, as background work
        lowered = min(niceness(client._server.pid) + 10, 19)  # 19: the lowest priority there is
        assert lowered in [niceness(pid) for pid in children_of(client._server.pid)]
    save_file(client, model, "# saved again\n" * 5 + BROKEN)  # every line moves
    await diagnostics_until(client, model, lambda d: "GL301" in codes(d))
    await asyncio.sleep(0.5)  # a stale complete result would come now, if it were still coming
    shown = published.of(model)
    attention_line, break_line = line_of(model, "F.softmax"), line_of(model, "print(y.mean())")
    assert ("GL301", slow_line) not in [item for publish in shown for item in publish]
    assert [code for code, _ in shown[-1]].count("GL301") == 1 and ("GL301", break_line) in shown[-1]
    # The newer save's first stage was shown ahead of its second.
    assert [p for p in shown[1:] if ("GL101", attention_line) in p and "GL301" not in [c for c, _ in p]]


@pytest.mark.compile
def test_the_early_result_is_the_complete_one_without_the_compile_rules_and_changes_nothing(tmp_path):
    """In-process: what a child sends ahead, and that asking for it leaves the complete result as it was."""
    from graphlint.engine import load_rules
    from graphlint.locate.place import Locator
    from graphlint.pipeline import lint_target
    from graphlint.project import Project
    from graphlint.results import RuleInfo
    from graphlint.selection import select

    project_with(tmp_path, BROKEN, extra=WITH_GL3)
    project = Project.discover(tmp_path)
    chosen = {info.id for info in select(project.config, tuple(RuleInfo.of(rule) for rule in load_rules()))}
    rules = tuple(rule for rule in load_rules() if rule.id in chosen)  # the default set and GL3
    early = []
    complete = lint_target("model.py:make", tmp_path, Locator(project), rules, "auto", early=early.append)
    plain = lint_target("model.py:make", tmp_path, Locator(project), rules, "auto")
    assert complete == plain  # findings, notes, inputs, libraries: the command line's result is the same
    compile_rules = compile_rule_ids()
    assert "GL301" in [f.rule_id for f in complete.findings]
    [first] = early
    assert first.findings == [f for f in complete.findings if f.rule_id not in compile_rules]
    assert "GL101" in [f.rule_id for f in first.findings]
    assert not first.errors and first.device == complete.device


@pytest.mark.compile
def test_a_session_hands_on_the_early_result_only_when_asked_and_caches_only_the_complete_one(tmp_path):
    """In-process, the session's API as the server reads it: with `Options.partial`, the early result comes from
    `Runner.partials` while nothing is cached yet, then the complete one from `finished`, cached; without it (the
    command line), no early result at all."""
    from graphlint.project import Project
    from graphlint.session import Options, Session

    project_with(tmp_path, BROKEN, extra=WITH_GL3)
    project = Project.discover(tmp_path)
    seen = {}
    for partial in (True, False):
        session = Session(["model.py:make"], project, project.config,
                          Options(cache=tmp_path / f"cache-{partial}", partial=partial), tmp_path)
        session.lint(["model.py:make"])
        delivered = []
        try:
            while session.linting:
                for _, target, result in session.runner.finished():
                    delivered.append(("complete", [f.rule_id for f in result.findings],
                                      session._cached(target) is not None))
                for _, target, result in session.runner.partials():
                    delivered.append(("early", [f.rule_id for f in result.findings],
                                      session._cached(target) is not None))
        finally:
            session.runner.close()
        seen[partial] = delivered
    complete = ("complete", ["GL101", "GL103", "GL301"], True)
    assert seen[True] == [("early", ["GL101", "GL103"], False), complete]
    assert seen[False] == [complete]


@pytest.mark.compile
def test_the_early_result_says_what_the_complete_one_says_of_the_steps_it_measures(tmp_path):
    """GL203 reads a second training step at a longer sequence: the early result runs it before the torch.compile
    analysis, the complete one after it (as the command line does); on a model that counts its calls and has a
    BatchNorm, which the analysis's calls update, both say the same, and so does GL401 of the step's memory."""
    import test_gl203_longer_sequence
    from graphlint.engine import load_rules
    from graphlint.locate.place import Locator
    from graphlint.pipeline import COMPILE_TAG, lint_target
    from graphlint.project import Project

    project_with(tmp_path, test_gl203_longer_sequence.MODEL, extra=WITH_GL3)
    rules = tuple(rule for rule in load_rules() if rule.id in ("GL203", "GL401") or COMPILE_TAG in rule.tags)
    early = []
    complete = lint_target("model.py:make", tmp_path, Locator(Project.discover(tmp_path)), rules, "auto",
                           memory_budget=1024, early=early.append)
    [first] = early
    gl203 = [f for f in complete.findings if f.rule_id == "GL203"]
    assert len(gl203) == 3 and "at sequence 128 gradients do reach them" in gl203[0].message
    assert "GL401" in [f.rule_id for f in complete.findings]  # a 1 KiB budget: the step exceeds it
    assert first.findings == [f for f in complete.findings if f.rule_id in ("GL203", "GL401")]


def test_a_workspace_folder_with_targets_warms_the_parent_ahead_of_the_first_open_and_its_children_lint(tmp_path):
    from graphlint.config import Config
    from graphlint.project import Project
    from graphlint.server.linting import Linter
    from graphlint.server.workspace import Settings
    from graphlint.session import Options, check

    with_targets, without = tmp_path / "project", tmp_path / "scripts"
    write(with_targets, "pyproject.toml", PYPROJECT.format(extra=""))
    model = write(with_targets, "model.py", ATTENTION.format(body=UNFUSED, setup=""))
    write(without, "pyproject.toml", '[project]\nname = "scripts"\nversion = "0"\n')
    published = []
    linter = Linter(Settings(no_cache=True), published.append, lambda kind, message: published.append(message))

    linter._handle("folder", str(without))  # as the linting thread does with the folders of `initialize`
    assert linter.runner._warming is None  # most Python folders an editor opens have no targets: no torch
    linter._handle("folder", str(with_targets))
    assert linter.runner._warming is not None
    linter.runner._warming.join(PATIENCE)
    parent = linter.runner.parent
    assert parent is not None and parent._compile_warm  # GL301/GL302 run by default: dynamo is warm as well
    assert published == [] and linter.runner._scheduler is None  # nothing was linted before a file was opened
    report = check([f"{model}:make"], Project(root=with_targets, first_party_folders=[with_targets]), Config(),
                   Options(), parent=parent)
    assert "GL101" in [f.rule_id for f in report.findings]


def test_a_target_that_wants_a_child_stops_the_warm_up_ahead_after_the_step_under_way():
    from graphlint.run.parent import WarmParent

    parent = WarmParent()
    asked = []
    parent.warm_ahead(True, lambda: asked.append(1) or True)  # a target already waits
    assert asked == [1] and not parent._compile_warm
    parent.warm_ahead(True, lambda: len(asked.append(1) or asked) > 2)  # it starts waiting after the first step
    assert len(asked) == 3 and not parent._compile_warm
    parent.warm_ahead(True, lambda: False)
    assert parent._compile_warm

"""`graphlint server`: a Language Server on stdio, built on pygls.

When a Python file is opened or saved, the targets it belongs to are linted again (graphlint.server.linting,
in its own thread, with one warm parent for the server's life) and every file that has findings, or had them,
gets its diagnostics (graphlint.server.diagnostics). A finding with a fix offers it as a quick fix; hovering a
diagnostic shows its rule's documentation. Saving pyproject.toml reads the configuration again.

Only the protocol goes to stdout: the server keeps its own handle on it and points file descriptor 1 at
stderr, so a stray print (graphlint's, a library's, native code's) cannot break the protocol.
"""

from __future__ import annotations

import asyncio
import os
import sys

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

import graphlint
from graphlint.files import read_source
from graphlint.report.columns import SourceColumns
from graphlint.server.diagnostics import Shown, contains, overlaps, quick_fix, rule_hover, uri_of
from graphlint.server.linting import Linter, fix_key
from graphlint.server.workspace import Settings

__all__ = ["GraphlintServer", "Settings", "serve"]

_UNITS = {types.PositionEncodingKind.Utf16: "utf-16", types.PositionEncodingKind.Utf8: "utf-8",
          types.PositionEncodingKind.Utf32: "utf-32"}


class GraphlintServer(LanguageServer):
    """The language server; `shown` is what it last published, per file, for hovers and quick fixes."""

    def __init__(self, settings: Settings) -> None:
        super().__init__("graphlint", graphlint.__version__)
        self.linter = Linter(settings, self._from_linter(self._publish), self._from_linter(self._tell))
        self.shown: dict[str, list[Shown]] = {}
        self.shut_down = False
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def unit(self) -> str:
        return _UNITS.get(self.workspace.position_encoding, "utf-16")

    def _from_linter(self, handler):
        """`handler` run on the event loop's thread, which alone talks to the client."""
        def call(*args) -> None:
            if self._loop is None:
                return
            try:
                self._loop.call_soon_threadsafe(handler, *args)
            except RuntimeError:
                pass  # the loop has closed: the server is ending and the client gone
        return call

    def _publish(self, files: dict[str, list[Shown]]) -> None:
        for path, shown in files.items():
            if shown:
                self.shown[path] = shown
            else:
                self.shown.pop(path, None)
            self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(
                uri=uri_of(path), diagnostics=[s.diagnostic for s in shown]))

    def _tell(self, kind: types.MessageType, message: str) -> None:
        if kind == types.MessageType.Log:
            self.window_log_message(types.LogMessageParams(type=kind, message=message))
        else:
            self.window_show_message(types.ShowMessageParams(type=kind, message=message))


def create_server(settings: Settings) -> GraphlintServer:
    server = GraphlintServer(settings)

    @server.feature(types.INITIALIZE)
    def initialize(ls: GraphlintServer, params: types.InitializeParams) -> None:
        ls._loop = asyncio.get_running_loop()
        ls.linter.unit = ls.unit
        for folder in _workspace_folders(params):
            ls.linter.folder(folder)

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: GraphlintServer, params: types.DidOpenTextDocumentParams) -> None:
        path = _lintable(params.text_document.uri)
        if path is not None:
            ls.linter.opened(path)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE, types.SaveOptions(include_text=False))
    def did_save(ls: GraphlintServer, params: types.DidSaveTextDocumentParams) -> None:
        path = _lintable(params.text_document.uri)
        if path is not None:
            ls.linter.saved(path)

    @server.feature(types.TEXT_DOCUMENT_CODE_ACTION,
                    types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix]))
    def code_action(ls: GraphlintServer, params: types.CodeActionParams) -> list[types.CodeAction] | None:
        path = to_fs_path(params.text_document.uri)
        shown = [s for s in ls.shown.get(path, ()) if s.finding is not None and s.finding.fix is not None
                 and overlaps(s.diagnostic.range, params.range)]
        if not shown:
            return None
        document = ls.workspace.get_text_document(params.text_document.uri)
        if document.source != read_source(path):
            return None  # the buffer changed since the file was saved and linted: the edits would land elsewhere
        columns = SourceColumns(ls.unit)
        verdicts = ls.linter.unsafe_verdicts
        return [action for s in shown
                if (action := quick_fix(s, columns, verdicts.get(fix_key(s.finding)))) is not None] or None

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    def hover(ls: GraphlintServer, params: types.HoverParams) -> types.Hover | None:
        path = to_fs_path(params.text_document.uri)
        for shown in ls.shown.get(path, ()):
            if shown.rule is not None and contains(shown.diagnostic.range, params.position):
                return rule_hover(shown.rule, shown.diagnostic.range, _markdown_hovers(ls))
        return None

    @server.feature(types.SHUTDOWN)
    def shutdown(ls: GraphlintServer, params: None) -> None:
        ls.shut_down = True
        ls.linter.stop()

    @server.feature(types.EXIT)
    def exit_(ls: GraphlintServer, params: None) -> None:
        ls.linter.stop()

    return server


def _workspace_folders(params: types.InitializeParams) -> list[str]:
    """The folders the editor opened, as paths: its workspace folders, else the older root URI or root path."""
    uris = [folder.uri for folder in params.workspace_folders or ()] or ([params.root_uri] if params.root_uri else [])
    paths = [path for path in map(to_fs_path, uris) if path]
    return paths or ([params.root_path] if params.root_path else [])


def _lintable(uri: str) -> str | None:
    """The file's path when saving it may change diagnostics: Python files and pyproject.toml."""
    path = to_fs_path(uri)
    if path is None or not (path.endswith(".py") or os.path.basename(path) == "pyproject.toml"):
        return None
    return path


def _markdown_hovers(ls: GraphlintServer) -> bool:
    hover = ls.client_capabilities.text_document.hover if ls.client_capabilities.text_document else None
    formats = hover.content_format if hover is not None else None
    return not formats or types.MarkupKind.Markdown in formats


def serve(settings: Settings) -> int:
    """Serve on stdin and stdout until the client says exit (or goes away); the exit code the protocol asks
    for: 0 after a shutdown request, 1 otherwise."""
    protocol_in, protocol_out = _protocol_streams()
    server = create_server(settings)
    server.linter.start(close_in_children=(protocol_in.fileno(), protocol_out.fileno()))
    try:
        server.start_io(protocol_in, protocol_out)
    finally:
        server.linter.stop()
    return 0 if server.shut_down else 1


def _protocol_streams():
    """The protocol's own handles on stdin and stdout; then file descriptor 1 points at stderr and 0 at the
    null device, so that nothing else can write into the protocol or read from it."""
    sys.stdout.flush()
    protocol_out = os.fdopen(os.dup(1), "wb")
    protocol_in = os.fdopen(os.dup(0), "rb")
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return protocol_in, protocol_out

"""Property-based tests for the parts that take arbitrary input: source files, messages and paths, TOML."""

from __future__ import annotations

import itertools
import json
import tempfile
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import validate_sarif
from graphlint.capture.frames import Frame
from graphlint.config import Config, read_config
from graphlint.errors import UsageError
from graphlint.files import read_source, split_lines, writable
from graphlint.locate.sites import Site
from graphlint.locate.spans import SourceSpans
from graphlint.report.github import render_github
from graphlint.report.json import render_json
from graphlint.report.sarif import render_sarif
from graphlint.results import Finding, Location, Related, Report, Severity, TargetError, TargetResult

FOLDER = Path(tempfile.mkdtemp(prefix="graphlint-properties-"))
_names = itertools.count()
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text that stresses columns: tabs, CR and CRLF, non-ASCII, characters outside the BMP, comments and strings.
fragments = st.sampled_from(["x", " ", "\t", "@", "(", ")", "#", "'", '"', "é", "😀", "𝔘", "\r", "\n", "\r\n",
                             "q @ k", ".softmax(-1)", "torch.matmul(a, b)", "def f():", "    ", "x[0] = 1"])
texts = st.lists(fragments, max_size=60).map("".join)


def _python_sources():
    import hypothesmith

    return hypothesmith.from_grammar()


# Python's grammar takes seconds to build: built when the test first draws, not when each worker collects the file.
sources = st.one_of(st.deferred(_python_sources), texts)
positions = st.one_of(st.none(), st.integers(min_value=-3, max_value=300))


def a_file(content: bytes) -> Path:
    path = FOLDER / f"source_{next(_names)}.py"
    path.write_bytes(content)
    return path


@SETTINGS
@given(
    content=st.one_of(sources.map(lambda s: s.encode("utf-8", "surrogatepass")), st.binary(max_size=300)),
    line=st.integers(min_value=-3, max_value=80), col=positions, end_line=st.integers(min_value=-3, max_value=80),
    end_col=positions, style=st.sampled_from(["call", "method", "build", "def"]),
    op=st.sampled_from([None, "matmul", "softmax", "add_", "setitem", "data", "mul"]),
)
# libcst gives this file back without its blank line, so its positions are a line off
@example(content=b"importA\n\n #", line=2, col=None, end_line=0, end_col=None, style="call", op=None)
def test_spans_always_lie_inside_the_file(content, line, col, end_line, end_col, style, op):
    path = a_file(content)
    has_position = col is not None and end_col is not None
    frame = Frame(str(path), line, "f", col if has_position else None, end_line if has_position else None,
                  end_col if has_position else None)
    start_line, start_column, stop_line, stop_column = SourceSpans().span(Site(frame, style, op))
    lines = split_lines(read_source(str(path)) or "") or [""]
    assert 1 <= start_line <= stop_line <= len(lines)
    assert 1 <= start_column <= len(lines[start_line - 1]) + 1
    assert 1 <= stop_column <= len(lines[stop_line - 1]) + 1
    if start_line == stop_line:
        assert start_column <= stop_column
    # The same span as SARIF's UTF-16 columns is still a valid region.
    location = Location(str(path), start_line, start_column, stop_line, stop_column)
    report = Report(results=[TargetResult("t", findings=[Finding("GL101", "n", Severity.NOTE, "m", location)])],
                    project_root=str(FOLDER))
    region = json.loads(render_sarif(report))["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]
    assert region["startColumn"] >= 1 and region["endColumn"] >= 1


path_parts = st.lists(st.text(st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)),
                              min_size=1, max_size=12), min_size=1, max_size=3)
messages = st.text(st.characters(blacklist_categories=()), max_size=200)  # lone surrogates too


def report_with(message: str, parts: list[str], line: int, column: int, inside: bool, error: str) -> Report:
    root = FOLDER / "project"
    path = (root if inside else Path("/elsewhere")).joinpath(*parts)
    location = Location(str(path), line, column, line, column + 3)
    finding = Finding("GL201", "inplace-on-saved", Severity.ERROR, message, location,
                      related=(Related(location, message[::-1]),), targets=(message[:20],),
                      fingerprint="0123456789abcdef:1")
    return Report(results=[TargetResult("target", findings=[finding], errors=[TargetError("target", error)],
                                        notes=[message])], project_root=str(root))


@SETTINGS
@given(message=messages, parts=path_parts, line=st.integers(1, 10**6), column=st.integers(1, 10**4),
       inside=st.booleans(), error=messages)
@example(message="bad \udc80 bytes", parts=["a b", "é#?%"], line=1, column=1, inside=True, error="x\ud800")
def test_sarif_and_json_are_valid_for_any_message_and_path(message, parts, line, column, inside, error):
    report = report_with(message, parts, line, column, inside, error)
    log = json.loads(render_sarif(report).encode("utf-8"))
    validate_sarif(log)
    document = json.loads(render_json(report).encode("utf-8"))
    assert document["findings"][0]["location"]["line"] == line


def unescape(text: str) -> str:
    return text.replace("%0D", "\r").replace("%0A", "\n").replace("%3A", ":").replace("%2C", ",").replace("%25", "%")


@SETTINGS
@given(message=messages, parts=path_parts, line=st.integers(1, 10**6), column=st.integers(1, 10**4), error=messages)
@example(message="50% :, done\r\nnext\udc80", parts=["a,b: c"], line=3, column=5, error="e\n")
def test_github_annotations_are_one_line_each_and_escape_exactly(message, parts, line, column, error):
    report = report_with(message, parts, line, column, False, error)
    lines = render_github(report).split("\n")
    annotation = next(row for row in lines if row.startswith("::error file="))
    properties, _, text = annotation[len("::error "):].partition("::")
    assert "\r" not in annotation and unescape(text) == writable(message)
    fields = dict(field.split("=", 1) for field in properties.split(","))
    assert set(fields) == {"file", "line", "endLine", "col", "endColumn", "title"}
    assert unescape(fields["file"]) == str(Path("/elsewhere").joinpath(*parts))
    assert (int(fields["line"]), int(fields["col"])) == (line, column)


toml_scalars = st.one_of(st.text(max_size=20), st.integers(-10, 10**6), st.floats(allow_nan=False), st.booleans())
toml_values = st.recursive(toml_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(min_size=1, max_size=10), inner, max_size=4)), max_leaves=8)
keys = st.one_of(st.sampled_from(["targets", "device", "select", "extend-select", "ignore", "per-file-ignores",
                                  "severity", "fail-on", "timeout"]), st.text(min_size=1, max_size=12))


@SETTINGS
@given(table=st.dictionaries(keys, toml_values, max_size=5))
def test_any_tool_graphlint_table_gives_a_config_or_one_usage_error(table):
    path = FOLDER / f"pyproject_{next(_names)}.toml"
    path.write_text(tomli_w.dumps({"tool": {"graphlint": table}}), encoding="utf-8")
    try:
        assert isinstance(read_config(path), Config)
    except UsageError as error:
        assert str(path) in str(error) and "\n" not in str(error).strip()


@SETTINGS
@given(text=st.text(max_size=300))
def test_any_pyproject_text_gives_a_config_or_one_usage_error(text):
    path = FOLDER / f"pyproject_{next(_names)}.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        assert isinstance(read_config(path), Config)
    except UsageError as error:
        assert str(path) in str(error)


@pytest.mark.parametrize("document", ['tool = "a string"', "[tool]\ngraphlint = 3", "tool = [1, 2]"])
def test_a_tool_table_of_the_wrong_type_is_a_usage_error(document):
    path = FOLDER / f"pyproject_{next(_names)}.toml"
    path.write_text(document, encoding="utf-8")
    with pytest.raises(UsageError, match="must be a table"):
        read_config(path)

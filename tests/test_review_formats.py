"""Code-review formats: reviewdog's rdjson/rdjsonl (valid against reviewdog's own schema, UTF-8 byte columns,
proven fixes as suggestions that give exactly what --fix writes), GitHub annotations that say what GitHub's
limit hides, and the Markdown list of every finding."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import WITHOUT_COMPILE, line_of, lint_file, run_graphlint, write
from graphlint.rewrite.edits import apply_edits
from graphlint.report.github import render_github
from graphlint.report.markdown import render_markdown
from graphlint.report.rdjson import diagnostics, suggestions
from graphlint.report.sarif import build_log
from graphlint.results import Edit, Finding, Fix, Location, Report, Severity, TargetError, TargetResult

RDF_SCHEMAS = Path(__file__).resolve().parent / "data" / "reviewdog-rdf"
CI_VARIABLES = ("GITHUB_WORKSPACE", "CI_PROJECT_DIR", "GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_SHA",
                "CI_PROJECT_URL", "CI_COMMIT_SHA")
NO_CI = dict.fromkeys(CI_VARIABLES, "")  # the command's environment outside CI, wherever the tests run

LOGS = 12  # more findings of one level than GitHub shows as annotations

# Non-ASCII text before each flagged expression (the identifier) and after it (the comment); one line per
# finding. GL204 has a fix that the proof accepts, GL105's (bias=False changes the state dict) is never
# proven, GL203 has no fix.
TEMPLATE = '''
import torch
from torch import nn


class Net(nn.Module):
    """Modèle d'essai."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.conv = nn.Conv1d(3, 4, 1)
        self.norm = nn.BatchNorm1d(4)
        self.spare = nn.Linear(2, 2)  # « jamais utilisé »

    def forward(self, x):
        h = torch.sigmoid(self.proj(x))
        c = self.norm(self.conv(h.view(1, 3, 8)))
{logs}
        return {total} + c.sum()


def make():
    return Net(), (torch.randn(3, 8),)
'''


def model_source(logs: int, bias: bool = True) -> str:
    """TEMPLATE with `logs` GL204 findings, and with or without the GL105 one."""
    source = TEMPLATE.format(
        logs="\n".join(f"        ŷ{i} = torch.log(torch.softmax(h * {i + 1}, dim=-1))  # « log ∘ softmax » n°{i}"
                       for i in range(logs)),
        total=" + ".join(f"ŷ{i}.sum()" for i in range(logs)),
    )
    if not bias:  # a conv without bias before the norm: nothing for GL105 to say
        source = source.replace("nn.Conv1d(3, 4, 1)", "nn.Conv1d(3, 4, 1, bias=False)")
    return source


MODEL = model_source(LOGS)


def rdf_validator(name: str):
    """A validator for one of reviewdog's schemas, with every schema file of the folder resolvable by name."""
    import jsonschema
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT4

    schemas = {p.name: json.loads(p.read_text(encoding="utf-8")) for p in RDF_SCHEMAS.glob("*.json")}
    registry = Registry().with_resources(
        (file, Resource.from_contents(schema, default_specification=DRAFT4)) for file, schema in schemas.items())
    return jsonschema.Draft4Validator(schemas[name], registry=registry)


def assert_valid(validator, document) -> None:
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:10])


def apply_suggestion(text: str, suggestion: dict) -> str:
    """What GitHub or GitLab writes when a reviewer accepts a line-wise suggestion: lines start..end (each with
    its line break) become the suggestion's text and the last line's break; empty text deletes them."""
    lines = re.findall(r".*?(?:\r\n|\r|\n)|.+\Z", text)
    rng = suggestion["range"]
    assert set(rng["start"]) == {"line"} and set(rng["end"]) == {"line"}, "a suggestion covers whole lines"
    first, last = rng["start"]["line"], rng["end"]["line"]
    ending = re.search(r"(\r\n|\r|\n)?\Z", lines[last - 1]).group()
    new = [suggestion["text"] + ending] if suggestion["text"] else []
    return "".join(lines[: first - 1] + new + lines[last:])


def apply_all(text: str, diagnostics_: list[dict]) -> str:
    """Every suggestion accepted, bottom to top so that line numbers stay valid."""
    accepted = [s for d in diagnostics_ for s in d.get("suggestions", [])]
    for suggestion in sorted(accepted, key=lambda s: -s["range"]["start"]["line"]):
        text = apply_suggestion(text, suggestion)
    return text


def utf8_column(line: str, fragment: str) -> int:
    return len(line[: line.index(fragment)].encode("utf-8")) + 1


def _project(folder: Path, source: str = MODEL) -> Path:
    write(folder, "pyproject.toml", '[tool.graphlint]\ntargets = ["model.py:make"]\n')
    return write(folder, "model.py", source)


@pytest.mark.proof
@pytest.mark.cli
def test_rdjson_is_valid_counts_utf8_bytes_and_its_suggestions_give_what_fix_writes(tmp_path):
    model = _project(tmp_path / "checked", model_source(LOGS, bias=False))
    done = run_graphlint("check", *WITHOUT_COMPILE, "--format", "rdjson", "--report", "rdjsonl=out.rdjsonl",
                         cwd=model.parent, env=NO_CI)
    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    assert_valid(rdf_validator("DiagnosticResult.json"), result)
    lines = (model.parent / "out.rdjsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == result["diagnostics"]  # the same diagnostics, one a line
    single = rdf_validator("Diagnostic.json")
    for line in lines:
        assert_valid(single, json.loads(line))

    by_rule: dict[str, list[dict]] = {}
    for d in result["diagnostics"]:
        by_rule.setdefault(d["code"]["value"], []).append(d)
    assert sorted((rule, len(found)) for rule, found in by_rule.items()) == [("GL203", 1), ("GL204", LOGS)]
    source = model.read_text(encoding="utf-8").splitlines()
    for d in by_rule["GL204"]:
        assert d["severity"] == "WARNING" and d["location"]["path"] == "model.py"
        assert d["code"]["url"].endswith("#gl204-unstable-log-softmax")
        start, end = d["location"]["range"]["start"], d["location"]["range"]["end"]
        line = source[start["line"] - 1]
        assert start["column"] == utf8_column(line, "torch.log(")  # 2 bytes for ŷ: not the code point column
        assert end["column"] == utf8_column(line, "  # «")  # end exclusive
        assert d["related_locations"][0]["location"]["range"]["start"]["column"] == utf8_column(line, "torch.softmax(")
        assert len(d["suggestions"]) == 1
        assert d["suggestions"][0]["range"] == {"start": {"line": start["line"]}, "end": {"line": start["line"]}}
    assert by_rule["GL203"][0]["severity"] == "INFO" and "suggestions" not in by_rule["GL203"][0]

    fixed = tmp_path / "fixed"
    shutil.copytree(model.parent, fixed, ignore=shutil.ignore_patterns(".graphlint_cache", "out.*"))
    done = run_graphlint("check", *WITHOUT_COMPILE, "--fix", cwd=fixed, env=NO_CI)
    assert "fixed 12 findings" in done.stderr, done.stderr
    expected = (fixed / "model.py").read_text(encoding="utf-8")
    assert expected != model.read_text(encoding="utf-8")
    assert apply_all(model.read_text(encoding="utf-8"), result["diagnostics"]) == expected


@pytest.mark.proof
@pytest.mark.cli
def test_a_fix_declared_unsafe_is_suggested_only_with_unsafe_fixes(tmp_path):
    model = _project(tmp_path, model_source(1))
    done = run_graphlint("check", *WITHOUT_COMPILE, "--format", "rdjsonl", cwd=tmp_path, env=NO_CI)
    assert done.returncode == 1, done.stderr
    found = {d["code"]["value"]: d for d in map(json.loads, done.stdout.splitlines())}
    assert "suggestions" not in found["GL105"] and len(found["GL204"]["suggestions"]) == 1
    assert "GL105 fix not suggested: declared unsafe: " in done.stderr and "state dict" in done.stderr

    done = run_graphlint("check", *WITHOUT_COMPILE, "--format", "rdjsonl", "--unsafe-fixes", cwd=tmp_path, env=NO_CI)
    found = [json.loads(line) for line in done.stdout.splitlines()]
    assert [len(d.get("suggestions", [])) for d in found] == [1, 0, 1]  # GL105, GL203, GL204 in line order
    assert "GL105 fix suggested anyway (--unsafe-fixes)" in done.stderr
    text = model.read_text(encoding="utf-8")
    accepted = apply_all(text, found)
    assert accepted == text.replace("nn.Conv1d(3, 4, 1)", "nn.Conv1d(3, 4, 1, bias=False)").replace(
        "torch.log(torch.softmax(h * 1, dim=-1))", "nn.functional.log_softmax(h * 1, dim=-1)")  # the file imports nn


@pytest.mark.cli
def test_unsafe_fixes_without_a_format_that_suggests_is_a_usage_error(tmp_path):
    done = run_graphlint("check", "x.py:make", "--format", "sarif", "--unsafe-fixes", cwd=tmp_path, env=NO_CI)
    assert done.returncode == 2 and done.stderr.startswith("graphlint: error: --unsafe-fixes applies only with")
    done = run_graphlint("check", "x.py:make", "--report", "yaml=x.yml", cwd=tmp_path, env=NO_CI)
    assert done.returncode == 2 and "'yaml=x.yml' is not FORMAT=FILE" in done.stderr


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """One capture of MODEL, in a project one folder below a repository's checkout."""
    checkout = tmp_path_factory.mktemp("checkout")
    model = _project(checkout / "sub")
    return checkout, model, lint_file(model)


def test_github_annotations_past_ten_of_a_level_are_log_lines_and_a_last_notice_says_so(many):
    _, model, report = many
    out = render_github(report, NO_CI).splitlines()
    warnings = [line for line in out if line.startswith("::warning ")]
    assert len(warnings) == 10  # GitHub's limit per level and step
    logged = [line for line in out if re.match(r"\S+\.py:\d+:\d+: GL\d+ ", line)]
    assert len(logged) == LOGS + 1 - 10  # the other warnings, each a plain line of the log
    assert len(warnings) + len(logged) == sum(1 for f in report.findings if f.severity is Severity.WARNING)
    notices = [line for line in out if line.startswith("::notice ")]
    assert notices[-1] == out[-2]  # the last annotation, then the summary line
    assert "3 warnings are only in this step's log" in notices[-1]
    assert f"All {len(report.findings)} findings are listed in the job summary" in notices[-1]
    assert len(notices) <= 10


def test_github_annotations_within_the_limit_have_no_notice(many):
    _, _, report = many
    few = [f for f in report.findings if f.rule_id != "GL204"] + [f for f in report.findings if f.rule_id == "GL204"][:9]
    report.merged = few
    try:
        out = render_github(report, NO_CI)
    finally:
        report.merged = None
    assert out.count("::warning ") == 10 and "not shown as annotations" not in out


def test_paths_are_relative_to_the_checkout_when_the_project_is_below_it(many):
    checkout, model, report = many
    environ = {"GITHUB_WORKSPACE": str(checkout)}
    assert "::warning file=sub/model.py," in render_github(report, environ)
    assert {d["location"]["path"] for d in diagnostics(report, environ)} == {"sub/model.py"}
    assert {d["location"]["path"] for d in diagnostics(report, {})} == {"model.py"}
    monkey = pytest.MonkeyPatch()
    monkey.setenv("GITHUB_WORKSPACE", str(checkout))
    try:
        uris = {r.locations[0].physical_location.artifact_location.uri for r in build_log(report).runs[0].results}
    finally:
        monkey.undo()
    assert uris == {"sub/model.py"}
    assert "](https://github.com/o/r/blob/abc/sub/model.py#L" in render_markdown(
        report, {**environ, "GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "o/r", "GITHUB_SHA": "abc"})


def test_markdown_lists_every_finding_with_links_to_its_lines_and_rule(many):
    _, model, report = many
    environ = {"GITHUB_SERVER_URL": "https://github.example", "GITHUB_REPOSITORY": "org/repo", "GITHUB_SHA": "f00"}
    text = render_markdown(report, environ)
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| level")]
    assert len(rows) == len(report.findings) == LOGS + 2
    for finding, row in zip(report.findings, rows, strict=True):
        loc = finding.location
        link = f"https://github.example/org/repo/blob/f00/model.py#L{loc.line}"
        assert f"[`model.py:{loc.line}:{loc.column}`]({link})" in row
        assert f"[{finding.rule_id} {finding.rule_name}](" in row and f"#{finding.rule_id.lower()}-" in row
    norm = line_of(model, "c = self.norm(")
    assert "| warning |" in rows[0] and rows[0].endswith(f"[*]<br>related: [`model.py:{norm}:13`]"
                                                         f"(https://github.example/org/repo/blob/f00/model.py#L{norm}) "
                                                         "the batch norm that cancels it |")
    gitlab = render_markdown(report, {"CI_PROJECT_URL": "https://gitlab.example/g/p", "CI_COMMIT_SHA": "f00"})
    assert f"(https://gitlab.example/g/p/-/blob/f00/model.py#L{line_of(model, 'self.conv =')})" in gitlab
    assert "model.py#L" not in render_markdown(report, {})  # outside CI, no commit to link to


def _finding(path: str, line: int, end_line: int, edits: list[Edit]) -> Finding:
    return Finding("GL999", "test", Severity.WARNING, "m", Location(path, line, 1, end_line, 2),
                   fix=Fix("f", tuple(edits)))


@pytest.mark.parametrize("source, edits", [
    # One line rewritten, with CRLF line ends.
    ("a = 1\r\nb = x * 2\r\nc = 3\r\n", [((2, 5, 2, 10), "f(x)")]),
    # A statement deleted with its line break: the suggestion deletes the line.
    ("a = 1\nb = 2\nc = 3\n", [((2, 1, 3, 1), "")]),
    # Two lines joined: the deleted line break takes in the next line.
    ("a = (1,\n     2)\nc = 3\n", [((1, 8, 2, 6), "")]),
    # A line emptied: one empty line is not the same as no line, so the suggestion takes in a neighbour.
    ("a = 1\nb = 2\nc = 3\n", [((2, 1, 2, 6), "")]),
    # The last line, without a line break at the end of the file.
    ("a = 1\nb = 2", [((2, 5, 2, 6), "3")]),
    # Edits several lines apart in one fix: one suggestion spanning them.
    ("a = 1\nb = 2\nc = 3\nd = 4\n", [((1, 5, 1, 6), "10"), ((4, 5, 4, 6), "40")]),
], ids=["crlf", "delete-line", "join-lines", "empty-line", "last-line", "spread"])
def test_a_suggestion_applied_gives_the_fixed_text(tmp_path, source, edits):
    path = tmp_path / "m.py"
    path.write_bytes(source.encode())
    edits = [Edit(str(path), *span, text) for span, text in edits]
    finding = _finding(str(path), edits[0].line, edits[0].line, edits)
    first, last, text = suggestions([finding])[finding]
    suggestion = {"range": {"start": {"line": first}, "end": {"line": last}}, "text": text}
    assert apply_suggestion(source, suggestion) == apply_edits(source, edits)


def test_fixes_whose_lines_overlap_are_one_suggestion_on_the_first_finding(tmp_path):
    path = tmp_path / "m.py"
    source = "a = 1\nb = 2\nc = 3\n"
    path.write_text(source)
    first = _finding(str(path), 1, 2, [Edit(str(path), 2, 5, 2, 6, "20")])
    second = _finding(str(path), 2, 3, [Edit(str(path), 3, 5, 3, 6, "30")])
    found = suggestions([first, second])
    assert list(found) == [first] and found[first] == (1, 3, "a = 1\nb = 20\nc = 30")


def test_suppressed_findings_are_left_out_of_rdjson_even_when_shown(many):
    _, _, report = many
    hidden = report.findings[0]
    shown = dataclasses.replace(report, merged=[dataclasses.replace(hidden, suppressed=True), *report.findings[1:]],
                                show_suppressed=True)
    assert len(shown.findings) == len(report.findings)
    codes = [d["code"]["value"] for d in diagnostics(shown, NO_CI)]
    assert len(codes) == len(report.findings) - 1 and codes == [f.rule_id for f in report.findings[1:]]
    assert "(suppressed)" in render_markdown(shown, NO_CI)  # the list for people says so instead


def test_markdown_names_the_targets_that_could_not_be_linted_and_escapes_table_cells():
    finding = Finding("GL101", "unfused-attention", Severity.WARNING, "a | b <br> `x | y`",
                      Location("/p/m.py", 3, 1, 3, 4))
    report = Report(results=[TargetResult("m.py:make", findings=[finding]),
                             TargetResult("bad.py:make", errors=[TargetError("bad.py:make", "file bad.py does not exist")])],
                    project_root="/p")
    text = render_markdown(report, NO_CI)
    [row] = [line for line in text.splitlines() if line.startswith("| warning")]
    assert row.endswith("| a \\| b &lt;br&gt; `x \\| y` |")
    assert "### Targets that could not be linted\n\n- `bad.py:make`: file bad.py does not exist" in text


def test_past_ten_notices_the_last_notice_is_still_one_of_the_ten_shown():
    notes = [Finding("GL203", "unused-parameter", Severity.NOTE, f"unused {i}", Location("/p/m.py", i, 1, i, 2))
             for i in range(1, 13)]
    out = render_github(Report(results=[TargetResult("m.py:make", findings=notes)], project_root="/p"), NO_CI)
    notices = [line for line in out.splitlines() if line.startswith("::notice ")]
    assert len(notices) == 10 and "3 notices are only in this step's log" in notices[-1]
    assert "title=graphlint%3A 3 not shown as annotations::" in notices[-1]


def test_a_checkout_named_through_a_symbolic_link_still_gives_paths_from_the_repository_root(many, tmp_path):
    checkout, _, report = many
    link = tmp_path / "workspace"
    link.symlink_to(checkout, target_is_directory=True)
    environ = {"GITHUB_WORKSPACE": str(link)}
    assert "::warning file=sub/model.py," in render_github(report, environ)
    assert {d["location"]["path"] for d in diagnostics(report, environ)} == {"sub/model.py"}
    monkey = pytest.MonkeyPatch()
    monkey.setenv("GITHUB_WORKSPACE", str(link))
    try:
        uris = {r.locations[0].physical_location.artifact_location.uri for r in build_log(report).runs[0].results}
    finally:
        monkey.undo()
    assert uris == {"sub/model.py"}

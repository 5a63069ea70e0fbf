"""`--format junit`: JUnit XML, which CI systems show as test results (GitLab's `artifacts: reports: junit:`,
Jenkins' junit step, test-report actions on GitHub).

One test case per target; each finding at or above `fail-on` is a `<failure>` of every target that ran its
code, naming the rule; findings below it are listed in the case's `<system-out>`; a target that could not
be linted has an `<error>`. A target with none of these passes.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree

from graphlint.files import path_in_project, writable
from graphlint.results import Finding, Report

# Characters XML 1.0 cannot hold even escaped (a model's exception message may contain them).
_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def render_junit(report: Report) -> str:
    failing = {id(f) for f in report.failing}
    suites = ElementTree.Element("testsuites", name="graphlint")
    suite = ElementTree.SubElement(suites, "testsuite", name="graphlint")
    failures = errors = 0
    for result in report.results:
        case = ElementTree.SubElement(suite, "testcase", classname="graphlint", name=result.target)
        mine = [f for f in report.findings if result.target in f.targets and not f.suppressed]
        for finding in (f for f in mine if id(f) in failing):
            failure = ElementTree.SubElement(case, "failure", type=finding.rule_id,
                                             message=f"{finding.rule_id} {finding.rule_name}: {finding.message}")
            failure.text = _line(finding, report.project_root)
            failures += 1
        for error in result.errors:
            ElementTree.SubElement(case, "error", type="graphlint", message=error.message).text = error.message
            errors += 1
        below = [_line(f, report.project_root) for f in mine if id(f) not in failing]
        if below or result.notes:
            out = ElementTree.SubElement(case, "system-out")
            out.text = "\n".join(below + [f"note: {note}" for note in result.notes]) + "\n"
    for element in (suites, suite):
        element.set("tests", str(len(report.results)))
        element.set("failures", str(failures))
        element.set("errors", str(errors))
    suite.set("skipped", "0")
    ElementTree.indent(suites)
    body = _XML_INVALID.sub("?", ElementTree.tostring(suites, encoding="unicode"))
    return writable('<?xml version="1.0" encoding="UTF-8"?>\n' + body + "\n")


def _line(finding: Finding, root: str) -> str:
    loc = finding.location
    return f"{path_in_project(loc.path, root)}:{loc.line}:{loc.column}: {finding.rule_id} {finding.message}"

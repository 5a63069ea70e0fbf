"""Reporters: functions of a Report that return text in one output format."""

from __future__ import annotations

from graphlint.report.github import render_github
from graphlint.report.gitlab import render_gitlab
from graphlint.report.json import render_json
from graphlint.report.junit import render_junit
from graphlint.report.markdown import render_markdown
from graphlint.report.rdjson import render_rdjson, render_rdjsonl
from graphlint.report.sarif import render_sarif
from graphlint.report.text import render_text

FORMATS = {"text": render_text, "json": render_json, "sarif": render_sarif, "github": render_github,
           "gitlab": render_gitlab, "junit": render_junit, "rdjson": render_rdjson, "rdjsonl": render_rdjsonl,
           "markdown": render_markdown}
SUGGESTING = ("rdjson", "rdjsonl")  # formats that carry fixes as suggestions: the command proves them first

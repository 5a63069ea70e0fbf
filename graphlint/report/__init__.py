"""Reporters: functions of a Report that return text in one output format."""

from __future__ import annotations

from graphlint.report.sarif import render_sarif
from graphlint.report.text import render_text

FORMATS = {"text": render_text, "sarif": render_sarif}

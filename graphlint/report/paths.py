"""Which folder the paths of code-review formats are relative to.

GitHub (annotations, code scanning, pull request comments) and GitLab name files from the repository root.
In CI that root is the checkout, `$GITHUB_WORKSPACE` or `$CI_PROJECT_DIR`, which may lie above the project
root (a `pyproject.toml` in a subfolder) and above the working directory the job ran graphlint in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

CHECKOUT_VARIABLES = ("GITHUB_WORKSPACE", "CI_PROJECT_DIR")  # where GitHub Actions and GitLab CI check out


def source_root(project_root: str, environ: Mapping[str, str]) -> str:
    """The CI's checkout when the project is inside it, else the project root."""
    project = os.path.abspath(project_root)
    for name in CHECKOUT_VARIABLES:
        checkout = environ.get(name)
        if checkout and is_inside(project, os.path.abspath(checkout)):
            return os.path.abspath(checkout)
    return project


def relative_to(path: str, root: str) -> str:
    """`path` relative to `root` with forward slashes when it is inside it; absolute (forward slashes) otherwise."""
    absolute = os.path.abspath(path)
    if is_inside(absolute, os.path.abspath(root)):
        return Path(os.path.relpath(absolute, root)).as_posix()
    return Path(absolute).as_posix()


def is_inside(path: str, folder: str) -> bool:
    """Whether the absolute `path` is `folder` or below it."""
    try:
        return os.path.commonpath([path, folder]) == folder
    except ValueError:  # another drive on Windows
        return False

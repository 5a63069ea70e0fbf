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
    """The CI's checkout when the project is inside it, spelled as `project_root` spells its folders (the
    checkout's variable may name it through a symbolic link); else `project_root` as it is."""
    for name in CHECKOUT_VARIABLES:
        checkout = environ.get(name)
        if not checkout:
            continue
        real_project, real_checkout = os.path.realpath(project_root), os.path.realpath(checkout)
        if is_inside(real_project, real_checkout):
            depth = len(Path(os.path.relpath(real_project, real_checkout)).parts) if real_project != real_checkout else 0
            root = Path(os.path.abspath(project_root))
            return str(root.parents[depth - 1]) if depth else str(root)
    return project_root


def relative_to(path: str, root: str) -> str:
    """`path` relative to `root` with forward slashes when it is inside it (as spelled, else once symbolic
    links are resolved); absolute, with forward slashes, otherwise."""
    for inner, outer in ((os.path.abspath(path), os.path.abspath(root)), (os.path.realpath(path), os.path.realpath(root))):
        if is_inside(inner, outer):
            return Path(os.path.relpath(inner, outer)).as_posix()
    return Path(os.path.abspath(path)).as_posix()


def is_inside(path: str, folder: str) -> bool:
    """Whether the absolute `path` is `folder` or below it."""
    try:
        return os.path.commonpath([path, folder]) == folder
    except ValueError:  # another drive on Windows
        return False

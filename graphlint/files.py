"""Which source files are whose: torch's, the standard library's and graphlint's are never shown to users."""

from __future__ import annotations

import functools
import importlib.util
import io
import os
import re
import sysconfig
import tokenize
from pathlib import Path


def _package_dir(name: str) -> str:
    """A package's folder, found without importing it (so that graphlint can start without torch)."""
    spec = importlib.util.find_spec(name)
    locations = list(spec.submodule_search_locations or []) if spec else []
    return os.path.abspath(locations[0]) + os.sep if locations else os.sep + "\0"


_TORCH_DIR = _package_dir("torch")
_GRAPHLINT_DIR = _package_dir("graphlint")
_STDLIB_DIRS = tuple({os.path.abspath(sysconfig.get_paths()[key]) + os.sep for key in ("stdlib", "platstdlib")})
_INSTALLED_MARKERS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


def is_hidden_file(filename: str) -> bool:
    """Frames from these files are never shown to the user: torch itself, graphlint, the standard library."""
    if filename.startswith("<"):
        return True  # <frozen importlib._bootstrap>, <string>
    if filename.startswith((_TORCH_DIR, _GRAPHLINT_DIR)):
        return True
    if filename.startswith(_STDLIB_DIRS):
        # site-packages sits inside the standard library folder when no virtual environment is used.
        return not is_installed_file(filename)
    return False


def is_graphlint_file(filename: str) -> bool:
    """graphlint's own code: the package and its rules (a separate folder in a development install)."""
    return filename.startswith((_GRAPHLINT_DIR, _rules_dir()))


def is_torch_or_standard_library_file(filename: str) -> bool:
    """Code that runs on behalf of whoever called it: torch, the standard library, and `<frozen ...>` modules."""
    return filename.startswith(("<", _TORCH_DIR)) or (filename.startswith(_STDLIB_DIRS) and not is_installed_file(filename))


@functools.lru_cache(maxsize=1)
def _rules_dir() -> str:
    return _package_dir("graphlint.rules")


def is_installed_file(filename: str) -> bool:
    """Code installed by pip (a library), wherever the environment lives, even inside the project folder."""
    return any(marker in filename for marker in _INSTALLED_MARKERS)


def display_path(path: str) -> str:
    """A path relative to the working directory when it is below it, with forward slashes."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return path
    if relative.startswith(".."):
        return path
    return relative.replace(os.sep, "/")


def path_in_project(path: str, root: str) -> str:
    """`path` relative to the project root with forward slashes when it is inside it; absolute otherwise."""
    try:
        return Path(path).relative_to(root).as_posix()
    except ValueError:
        return Path(path).as_posix()


def library_name(path: str) -> str:
    """`transformers` for .../site-packages/transformers/models/gpt2/modeling_gpt2.py; the file name otherwise."""
    for marker in _INSTALLED_MARKERS:
        _, found, rest = path.partition(marker)
        if found:
            return rest.split(os.sep, 1)[0].removesuffix(".py")
    return os.path.basename(path)


_NEWLINE = re.compile(r"\r\n|\r|\n")


def split_lines(text: str) -> list[str]:
    """Lines as Python numbers them (only CR, LF and CRLF end a line, unlike str.splitlines); a final line
    break ends the last line rather than starting an empty one."""
    lines = _NEWLINE.split(text)
    if len(lines) > 1 and lines[-1] == "":
        lines.pop()
    return lines


def read_source(path: str) -> str | None:
    """A Python file's text, decoded as Python decodes it (PEP 263 coding cookie, else UTF-8); None if unreadable."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError):
        return data.decode("utf-8", "replace")


def writable(text: str) -> str:
    """Text that can be written as UTF-8: lone surrogates (from undecodable file names or bytes in an
    exception's message) become "?" instead of failing the write."""
    return text.encode("utf-8", "replace").decode("utf-8")

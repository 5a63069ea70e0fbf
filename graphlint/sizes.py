"""Byte counts (and seconds) as people write them (`24GiB`, `80GB`, `512MiB`, `1.5 TiB`, a plain number of bytes) and as
graphlint prints them. Imports nothing heavy: the configuration reads budgets with it."""

from __future__ import annotations

import re

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int) -> int | None:
    """The number of bytes `text` names, or None when it is not a size (`24GiB` and `24G` are 24 × 2**30,
    `24GB` is 24 × 10**9)."""
    if isinstance(text, bool):
        return None
    if isinstance(text, int):
        return text if text > 0 else None
    match = _SIZE.match(str(text))
    if match is None or match.group(2).lower() not in _UNITS:
        return None
    value = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    return value if value > 0 else None


def format_bytes(count: int | float) -> str:
    """`1.50 GiB`, `12.0 MiB`, `512 B`: three significant figures in binary units."""
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(size)} B"
            return f"{size:.3g} {unit}"
        size /= 1024
    return f"{size:.3g} TiB"


def human_bytes(count: int) -> str:
    """`1.5 KiB`, `512 B`: one decimal in binary units (the graph report's sizes)."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


def format_seconds(seconds: float) -> str:
    """`1.25 s`, `3.1 ms`, `820 µs`: two significant figures under a second."""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{_two_figures(seconds * 1e3)} ms"
    return f"{_two_figures(seconds * 1e6)} µs"


def _two_figures(value: float) -> str:
    return f"{float(f'{value:.2g}'):g}"  # 368 → "370", never "3.7e+02"

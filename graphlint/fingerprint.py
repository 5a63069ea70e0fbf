"""Identities of findings that survive edits elsewhere in a file.

- `github_line_hashes`: GitHub code scanning's `primaryLocationLineHash`, computed exactly as the upload action
  computes it: a rolling hash (base 37, 64-bit wraparound) over the next 100 characters from the start of
  each line, skipping spaces and tabs, with CR and CRLF read as LF, written `hex:occurrence`. A wrong value
  makes the upload warn and can duplicate alerts, so it is tested against GitHub's published vectors.
- `finding_key` (numbered by `number_duplicates`): graphlint's own key (rule, file, the flagged line's text without indentation,
  and which of identical such keys it is), used for `partialFingerprints["graphlint/v1"]` and baselines.
  Moving code up or down keeps it; editing the flagged line changes it.
"""

from __future__ import annotations

import hashlib

_BLOCK = 100
_MASK = (1 << 64) - 1
_BASE = 37
_FIRST_MOD = pow(_BASE, _BLOCK, 1 << 64)  # the weight of the character that leaves the window
_END_OF_FILE = 65535
_SPACE, _TAB, _LF, _CR = 32, 9, 10, 13


def github_line_hashes(text: str) -> list[str]:
    """`primaryLocationLineHash` for every line of `text`, line 1 first."""
    hasher = _RollingLineHasher()
    for code in _utf16_units(text):
        hasher.feed(code)
    hasher.feed(_END_OF_FILE)
    return hasher.finish()


class _RollingLineHasher:
    """Feeds characters through a 100-wide window; a line's hash is the window's hash once the window has
    moved 100 (kept) characters past the line's first character."""

    def __init__(self) -> None:
        self.window = [0] * _BLOCK
        self.line_at = [-1] * _BLOCK  # the line that starts at each window slot, or -1
        self.value = 0
        self.index = 0
        self.line = 0
        self.line_start = True
        self.previous_cr = False
        self.hashes: dict[int, str] = {}
        self.counts: dict[str, int] = {}

    def feed(self, code: int) -> None:
        if code in (_SPACE, _TAB) or (self.previous_cr and code == _LF):
            self.previous_cr = False
            return
        self.previous_cr = code == _CR
        if code == _CR:
            code = _LF
        if self.line_at[self.index] != -1:
            self._emit()
        if self.line_start:
            self.line_start = False
            self.line += 1
            self.line_at[self.index] = self.line
        if code == _LF:
            self.line_start = True
        self._roll(code)

    def finish(self) -> list[str]:
        for _ in range(_BLOCK):  # pad with zeros so the last lines get a full window
            if self.line_at[self.index] != -1:
                self._emit()
            self._roll(0)
        return [self.hashes[number] for number in sorted(self.hashes)]

    def _emit(self) -> None:
        value = format(self.value, "x")
        self.counts[value] = self.counts.get(value, 0) + 1
        self.hashes[self.line_at[self.index]] = f"{value}:{self.counts[value]}"
        self.line_at[self.index] = -1

    def _roll(self, code: int) -> None:
        leaving = self.window[self.index]
        self.window[self.index] = code
        self.value = (_BASE * self.value + code - _FIRST_MOD * leaving) & _MASK
        self.index = (self.index + 1) % _BLOCK


def _utf16_units(text: str):
    """The string as JavaScript's charCodeAt sees it: UTF-16 code units."""
    data = text.encode("utf-16-le", "surrogatepass")
    for index in range(0, len(data), 2):
        yield data[index] | (data[index + 1] << 8)


def finding_key(rule_id: str, relative_path: str, line_text: str) -> str:
    """A short digest of what identifies a finding apart from its line number."""
    digest = hashlib.sha256(f"{rule_id}\0{relative_path}\0{line_text.strip()}".encode()).hexdigest()
    return digest[:16]


def number_duplicates(keys: list[str]) -> list[str]:
    """`key:1`, `key:2`, ... so that identical keys in one file stay distinct, in the order given."""
    seen: dict[str, int] = {}
    numbered = []
    for key in keys:
        seen[key] = seen.get(key, 0) + 1
        numbered.append(f"{key}:{seen[key]}")
    return numbered

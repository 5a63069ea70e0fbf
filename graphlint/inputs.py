"""Input specs: a model's inputs described by dtype and shape, the way summary tools take an input size.

    float32[2,3,32,32]          a float tensor of that shape, standard normal values
    float32[2,8]:0..1           uniform values in [0, 1)
    int64[2,16]:0..1000         integers from 0 up to 1000, 1000 excluded (token ids below a vocabulary size)
    int64[2,16]                 integers 0 or 1 (the range 0..2): valid ids for any embedding, index or class count
    bool[2,16]                  random True/False (masks)
    attention_mask=bool[2,16]   a keyword input of the forward; the others are positional, in order

Parsing needs no torch; `InputSpec.build` makes the tensor on the current default device (the capture's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from graphlint.errors import UsageError

DTYPES = {
    "float32": "float32", "float": "float32", "float64": "float64", "double": "float64",
    "float16": "float16", "half": "float16", "bfloat16": "bfloat16",
    "int64": "int64", "long": "int64", "int32": "int32", "int": "int32", "int16": "int16", "int8": "int8",
    "uint8": "uint8", "bool": "bool",
}
KNOWN = "float32, float64, float16, bfloat16, int64, int32, int16, int8, uint8, bool"
_INT_BOUNDS = {"int64": (-2**63, 2**63 - 1), "int32": (-2**31, 2**31 - 1), "int16": (-2**15, 2**15 - 1),
               "int8": (-128, 127), "uint8": (0, 255)}
DEFAULT_INT_RANGE = (0, 2)  # ids 0 and 1 exist in every embedding and index a dimension of any size above 1
GRAMMAR = "DTYPE[D0,D1,...] with an optional :LOW..HIGH range, like float32[2,3,32,32] or int64[2,16]:0..1000"

_SPEC = re.compile(r"^(?:(?P<name>[A-Za-z_]\w*)=)?(?P<dtype>\w+)\[(?P<shape>[^\]]*)\](?::(?P<range>.*))?$")
_NUMBER = r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_RANGE = re.compile(rf"^(?P<low>{_NUMBER})\.\.(?P<high>{_NUMBER})$")


@dataclass(frozen=True)
class InputSpec:
    """One input of the forward: a tensor of `dtype` and `shape`, values drawn from [low, high)."""

    dtype: str  # canonical name, a key of torch's dtypes
    shape: tuple[int, ...]
    low: float | None = None  # None: the dtype's default (standard normal, 0..2, True/False)
    high: float | None = None
    keyword: str | None = None  # the forward's keyword argument, None for positional

    @property
    def text(self) -> str:
        """The canonical spelling, which `parse_input` reads back to this spec."""
        text = f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"
        if self.low is not None:
            text += f":{_number(self.low)}..{_number(self.high)}"
        return f"{self.keyword}={text}" if self.keyword else text

    def build(self):
        """The tensor, on torch's current default device (meta while graphlint captures on meta)."""
        import torch

        dtype = getattr(torch, self.dtype)
        if self.dtype == "bool":
            return torch.randint(0, 2, self.shape).bool()
        if dtype.is_floating_point:
            if self.low is None:
                return torch.randn(self.shape, dtype=dtype)
            return torch.empty(self.shape, dtype=dtype).uniform_(self.low, self.high)
        low, high = (self.low, self.high) if self.low is not None else DEFAULT_INT_RANGE
        return torch.randint(int(low), int(high), self.shape, dtype=dtype)


def parse_input(text: str) -> InputSpec:
    """Read one spec; a malformed one is a `UsageError` that says what to write."""
    written = text.strip().replace(" ", "")
    match = _SPEC.match(written)
    if match is None:
        raise UsageError(f"input spec {text!r} is not {GRAMMAR}")
    dtype = DTYPES.get(match["dtype"])
    if dtype is None:
        raise UsageError(f"input spec {text!r}: unknown dtype {match['dtype']!r}; the dtypes are {KNOWN}")
    sizes = [part for part in match["shape"].split(",")] if match["shape"] else []
    if sizes and sizes[-1] == "":
        sizes.pop()  # a trailing comma, as in a one-element Python tuple
    if not all(size.isdigit() for size in sizes):
        raise UsageError(f"input spec {text!r}: the shape must be sizes separated by commas, like [2,16]")
    low = high = None
    if match["range"] is not None:
        bounds = _RANGE.match(match["range"])
        if bounds is None:
            raise UsageError(f"input spec {text!r}: the range must be LOW..HIGH (HIGH excluded), like :0..1000")
        low, high = float(bounds["low"]), float(bounds["high"])
        if dtype == "bool":
            raise UsageError(f"input spec {text!r}: bool inputs take no range; write bool[...]")
        if dtype.startswith(("int", "uint")) and not (low.is_integer() and high.is_integer()):
            raise UsageError(f"input spec {text!r}: an integer range needs whole numbers, like :0..1000")
        if high <= low:
            raise UsageError(f"input spec {text!r}: the range {match['range']} is empty; HIGH must be above LOW")
        if dtype in _INT_BOUNDS and not (_INT_BOUNDS[dtype][0] <= low and high - 1 <= _INT_BOUNDS[dtype][1]):
            least, most = _INT_BOUNDS[dtype]
            raise UsageError(f"input spec {text!r}: {dtype} holds {least}..{most + 1} (HIGH excluded); "
                             "choose a range inside it or a wider dtype")
    return InputSpec(dtype, tuple(int(size) for size in sizes), low, high, match["name"])


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)

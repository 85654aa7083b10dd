"""Arithmetic as the GPU does it, where Python's differs: IEEE results where Python's ``math``
raises (``log(0.0)`` is -inf, ``exp(1000.0)`` is inf, ``sqrt(-1.0)`` is nan) and where its ``/``
does (``1.0 / 0.0`` is inf, ``0.0 / 0.0`` nan), and integer casts that wrap to the type's width
(``int16(33000)`` is -32536) where numba's host-side ones raise."""
from __future__ import annotations

import math
import types

import numpy as np

# math's functions that raise on some argument, and the numpy function giving the IEEE answer there
_IEEE = {"sqrt": np.sqrt, "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": np.log, "log2": np.log2,
         "log10": np.log10, "log1p": np.log1p, "pow": np.power, "acos": np.arccos, "asin": np.arcsin,
         "acosh": np.arccosh, "atanh": np.arctanh, "cosh": np.cosh, "sinh": np.sinh, "sin": np.sin,
         "cos": np.cos, "tan": np.tan, "fmod": np.fmod, "ldexp": np.ldexp}


def _ieee(name, fallback):
    python = getattr(math, name)

    def gpu(*args):
        try:
            return python(*args)
        except (ValueError, OverflowError, ZeroDivisionError):
            if name == "log" and len(args) == 2:   # log(x, base)
                return gpu(args[0]) / gpu(args[1])
            with np.errstate(all="ignore"):
                return float(fallback(*(np.float64(a) if not isinstance(a, int) else a for a in args)))
    gpu.__name__ = name
    return gpu


MATH = types.ModuleType("math", "math as a GPU computes it: IEEE results (inf, nan) where Python's raises")
MATH.__dict__.update({name: value for name, value in vars(math).items() if not name.startswith("__")})
MATH.__dict__.update({name: _ieee(name, f) for name, f in _IEEE.items() if hasattr(math, name)})


def divide(a, b):
    """``a / b`` as a GPU divides: by zero, inf or nan (IEEE), where Python raises ZeroDivisionError."""
    try:
        if b != 0:
            return a / b
    except (TypeError, ValueError):   # b is not a number (an array): Python's division says what it is
        return a / b
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.divide(a, b)
    return float(q) if type(a) in (int, float, bool) and type(b) in (int, float, bool) else q


def gpu_version(value):
    """What a kernel's global ``value`` computes on a GPU: ``math`` and its functions with IEEE
    results, an integer type whose casts wrap; None when the value is the same on the host."""
    if value is math:
        return MATH
    if isinstance(value, types.BuiltinFunctionType) and getattr(value, "__self__", None) is math:
        return getattr(MATH, value.__name__, None)
    if type(value).__name__ == "Integer" and type(value).__module__.startswith("numba.core.types"):
        return WrappingInt(np.dtype(str(value)))
    if isinstance(value, type) and value in _NUMPY_INTS:
        return WrappingInt(np.dtype(value))
    return None


_NUMPY_INTS = {np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64}


class WrappingInt:
    """An integer type called as a cast in a kernel (``int16(x)``): two's complement, as the GPU truncates."""

    def __init__(self, dtype):
        self.dtype = dtype            # np.dtype(this) is the type: it still names a shared array's dtype
        self._bits = 8 * dtype.itemsize
        self._signed = dtype.kind == "i"

    def __call__(self, x=0):
        if isinstance(x, (float, np.floating)):
            x = int(x) if math.isfinite(x) else 0   # a float is truncated toward zero first
        v = int(x) & ((1 << self._bits) - 1)
        if self._signed and v >= 1 << (self._bits - 1):
            v -= 1 << self._bits
        return self.dtype.type(v)

    def __repr__(self):
        return f"<{self.dtype} as a kernel casts to it>"

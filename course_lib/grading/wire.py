"""Plain data across the sandbox wall: what may cross, and how it is framed.

Standard library and numpy only: the sandbox worker imports this file
without ``course_lib`` (it is copied in beside the worker).  Nothing is
pickled.  A value is a JSON tree whose leaves are None, bool, int, float,
str, or tagged objects (a ``fractions.Fraction`` as its two ints, a numpy
string as a str, slices whose bounds are ints or numpy ints); arrays travel as raw bytes with a dtype from
``DTYPES`` and a shape, and the receiver checks that the byte count is
exactly what the dtype and shape say.  Every decoder raises ``WireError``
on anything else, so what the sandbox sends is data or it is refused.
"""
from __future__ import annotations

import fractions
import json
import struct

import numpy as np

MAX_MESSAGE = 256 * 2**20   # bytes in one message (header and arrays together)
# The JSON header is parsed whole, at tens of bytes of Python objects per value ("{}," is 3 bytes
# and a dict): its size and its number of values bound what a message costs the grader's memory.
MAX_HEADER = 8 * 2**20      # bytes of the JSON header
MAX_VALUES = 10**6          # values in it ({, [ and , counted: at most this many containers and items)
MAX_DEPTH = 20              # nesting of tuples, lists and dicts
SCALAR_TYPES = (type(None), bool, int, float, str)
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128",
          "bfloat16", "float8_e4m3fn", "float8_e5m2")


class WireError(ValueError):
    """A message or value that is not plain data of the allowed kinds."""


def _dtype(name):
    if not isinstance(name, str) or name not in DTYPES:
        raise WireError(f"dtype {name!r} is not one of {', '.join(DTYPES)}")
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def encode(value, buffers, remote=None, depth=0):
    """The JSON tree of ``value``; array bytes are appended to ``buffers``.

    ``remote(obj)`` gives a handle id for an object that is not plain data
    (the grader's instruments); without it such objects are refused.
    """
    if depth > MAX_DEPTH:
        raise WireError("nested too deeply")
    kind = type(value)
    if kind in SCALAR_TYPES:
        return {"t": "int", "v": str(value)} if kind is int else value
    if kind is np.str_:
        return str(value)
    if kind is fractions.Fraction:
        return {"t": "fraction", "v": [str(value.numerator), str(value.denominator)]}
    if kind is tuple or kind is list:
        return {"t": kind.__name__, "v": [encode(x, buffers, remote, depth + 1) for x in value]}
    if kind is dict:
        if not all(type(k) in (str, int) for k in value):
            raise WireError("dict keys must be str or int")
        return {"t": "dict", "v": [[encode(k, buffers, remote, depth + 1), encode(x, buffers, remote, depth + 1)]
                                   for k, x in value.items()]}
    if kind is slice:
        return {"t": "slice", "v": [encode(x, buffers, remote, depth + 1) for x in (value.start, value.stop, value.step)]}
    if kind is np.ndarray or isinstance(value, np.generic) and kind.__module__ in ("numpy", "ml_dtypes"):
        array = np.asarray(value)
        if array.dtype.name not in DTYPES:
            raise WireError(f"an array of dtype {array.dtype} (allowed: numbers and bools)")
        if array.nbytes + sum(len(b) for b in buffers) > MAX_MESSAGE:
            raise WireError(f"more than {MAX_MESSAGE // 2**20} MiB of arrays")
        buffers.append(np.ascontiguousarray(array).tobytes())
        tag = "array" if kind is np.ndarray else "scalar"
        return {"t": tag, "dtype": array.dtype.name, "shape": list(array.shape), "buf": len(buffers) - 1,
                "writeable": bool(array.flags.writeable) if kind is np.ndarray else True}
    if isinstance(value, np.dtype) and value.name in DTYPES:
        return {"t": "dtype", "v": value.name}
    if isinstance(value, type) and issubclass(value, np.generic) and np.dtype(value).name in DTYPES:
        return {"t": "type", "v": np.dtype(value).name}
    if kind is type and value in (int, float, bool, complex):
        return {"t": "pytype", "v": value.__name__}
    if remote is not None:
        handle = remote(value)
        if handle is not None:
            return {"t": "remote", "v": handle}
    raise WireError(f"a {kind.__module__}.{kind.__qualname__}, which is not plain data "
                    "(numbers, strings, numpy arrays, tuples / lists / dicts of them)")


def _int(v):
    if type(v) is not str or len(v) > 4000:
        raise WireError("bad int")
    try:
        return int(v)
    except ValueError:
        raise WireError("bad int") from None


def decode(tree, buffers, remote=None, depth=0):
    """The value of a JSON tree from ``encode``; refuses anything else."""
    if depth > MAX_DEPTH:
        raise WireError("nested too deeply")
    if tree is None or type(tree) in (bool, float, str):
        return tree
    if type(tree) is int:
        return tree
    if type(tree) is not dict or not isinstance(tree.get("t"), str):
        raise WireError(f"not a value: {type(tree).__name__}")
    tag, v = tree["t"], tree.get("v")
    if tag == "int":
        return _int(v)
    if tag == "fraction":
        if type(v) is not list or len(v) != 2:
            raise WireError("bad fraction")
        numerator, denominator = _int(v[0]), _int(v[1])
        if denominator <= 0:
            raise WireError("bad fraction")
        return fractions.Fraction(numerator, denominator)
    if tag in ("tuple", "list"):
        if type(v) is not list:
            raise WireError("bad sequence")
        items = [decode(x, buffers, remote, depth + 1) for x in v]
        return tuple(items) if tag == "tuple" else items
    if tag == "dict":
        if type(v) is not list or not all(type(p) is list and len(p) == 2 for p in v):
            raise WireError("bad dict")
        out = {}
        for k, x in v:
            key = decode(k, buffers, remote, depth + 1)
            if type(key) not in (str, int):
                raise WireError("dict keys must be str or int")
            out[key] = decode(x, buffers, remote, depth + 1)
        return out
    if tag == "slice":
        if type(v) is not list or len(v) != 3:
            raise WireError("bad slice")
        parts = [decode(x, buffers, remote, depth + 1) for x in v]
        parts = [int(p) if isinstance(p, np.integer) else p for p in parts]   # np.arange's, np.array_split's
        if not all(p is None or type(p) is int for p in parts):
            raise WireError("slice bounds must be ints or None")
        return slice(*parts)
    if tag in ("array", "scalar"):
        dtype = _dtype(tree.get("dtype"))
        shape, index = tree.get("shape"), tree.get("buf")
        if (type(shape) is not list or not all(type(n) is int and 0 <= n for n in shape) or len(shape) > 32
                or type(index) is not int or not 0 <= index < len(buffers)):
            raise WireError("bad array header")
        size = 1
        for n in shape:
            size *= n
        data = buffers[index]
        if size * dtype.itemsize != len(data):
            raise WireError(f"array bytes ({len(data)}) do not match dtype {dtype.name} and shape {tuple(shape)}")
        array = np.frombuffer(data, dtype=dtype).reshape(shape).copy()
        if tag == "scalar":
            if shape:
                raise WireError("a scalar has no shape")
            return array[()]
        array.setflags(write=tree.get("writeable") is not False)
        return array
    if tag == "dtype":
        return _dtype(v)
    if tag == "type":
        return _dtype(v).type
    if tag == "pytype" and v in ("int", "float", "bool", "complex"):
        return {"int": int, "float": float, "bool": bool, "complex": complex}[v]
    if tag == "remote" and remote is not None and type(v) is int:
        return remote(v)
    raise WireError(f"not a value: tag {tag!r}")


# -- framing: 8-byte length, JSON header, then the array bytes -----------------------

def pack(header: dict, buffers=()) -> bytes:
    header = dict(header, sizes=[len(b) for b in buffers])
    text = json.dumps(header, allow_nan=True).encode("utf-8")
    body = struct.pack("!Q", len(text)) + text + b"".join(buffers)
    if len(body) > MAX_MESSAGE:
        raise WireError(f"message of {len(body)} bytes is over the limit of {MAX_MESSAGE}")
    return body


def header_of(text: bytes):
    """The JSON header of a message, parsed only if it is small enough to parse; WireError if not."""
    if len(text) > MAX_HEADER:
        raise WireError(f"a reply's header of {len(text) / 2**20:.0f} MiB, over the {MAX_HEADER // 2**20} MiB "
                        "a reply may have")
    values = text.count(b",") + text.count(b"[") + text.count(b"{")
    if values > MAX_VALUES:
        raise WireError(f"a reply's header of about {values} values, over the {MAX_VALUES} values a reply may have "
                        "(send numbers in bulk as a numpy array)")
    try:
        return json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise WireError(f"bad message header: {exc}") from None


def _read_exactly(stream, n):
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            raise EOFError("the other side closed the channel")
        data += chunk
    return data


def unpack(stream):
    """(header, buffers) of the next message on a binary stream; WireError if malformed."""
    (length,) = struct.unpack("!Q", _read_exactly(stream, 8))
    if length > MAX_HEADER:
        raise WireError("message header over the limit")
    header = header_of(_read_exactly(stream, length))
    sizes = header.get("sizes") if type(header) is dict else None
    if type(sizes) is not list or not all(type(n) is int and n >= 0 for n in sizes) or sum(sizes) + length > MAX_MESSAGE:
        raise WireError("bad message sizes")
    return header, [_read_exactly(stream, n) for n in sizes]

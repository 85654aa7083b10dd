"""What may cross the sandbox wall: plain data round-trips exactly, anything else is refused."""
from __future__ import annotations

import io

import ml_dtypes
import numpy as np
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from course_lib.grading import names, wire


def roundtrip(value):
    buffers = []
    tree = wire.encode(value, buffers)
    header, data = wire.unpack(io.BytesIO(wire.pack({"value": tree}, buffers)))
    return wire.decode(header["value"], data)


@pytest.mark.parametrize("value", [
    None, True, 3, 2**80, -1.5, float("inf"), "text", (1, [2.0, "x"]), {"a": 1, 2: (None,)},
    np.float32(1.25), np.int8(-3), np.bool_(True), np.float32, np.dtype("float16"), ml_dtypes.bfloat16,
    __import__("fractions").Fraction(-3, 7),
])
def test_plain_values_cross_with_their_exact_type(value):
    back = roundtrip(value)
    assert type(back) is type(value) and (back == value or back is value)


@pytest.mark.parametrize("dtype", ["bool", "int32", "uint64", "float16", "float64", "complex64", ml_dtypes.bfloat16])
def test_arrays_keep_dtype_shape_values_and_the_read_only_flag(dtype):
    a = (np.arange(24) % 5).astype(dtype).reshape(2, 3, 4)
    a.setflags(write=False)
    back = roundtrip(a)
    assert type(back) is np.ndarray and back.dtype == a.dtype and back.shape == a.shape
    assert back.tobytes() == a.tobytes() and not back.flags.writeable


@pytest.mark.parametrize("value, message", [
    (np.array([object()]), "dtype object"),
    (np.eye(2).view(np.matrix), "numpy.matrix"),
    (np.ma.masked_array([1.0]), "MaskedArray"),
    (type("F", (float,), {})(1.0), "not plain data"),
    (lambda x: x, "not plain data"),
    ({(1, 2): 3}, "dict keys"),
])
def test_anything_else_is_refused(value, message):
    with pytest.raises(wire.WireError) as err:
        wire.encode(value, [])
    assert message in str(err.value)


@pytest.mark.parametrize("tree, buffers", [
    ({"t": "array", "dtype": "float64", "shape": [3], "buf": 0}, [b"\x00" * 8]),       # bytes do not match
    ({"t": "array", "dtype": "object", "shape": [1], "buf": 0}, [b"\x00" * 8]),        # dtype not allowed
    ({"t": "array", "dtype": "float64", "shape": [-1], "buf": 0}, [b""]),              # bad shape
    ({"t": "array", "dtype": "float64", "shape": [1], "buf": 5}, [b"\x00" * 8]),       # no such buffer
    ({"t": "pickle", "v": "gASV"}, []),
    ({"t": "remote", "v": 0}, []),                                                      # no instruments here
    ({"t": "int", "v": "9" * 5000}, []),
    ([1, 2], []),
])
def test_a_forged_value_is_refused_not_trusted(tree, buffers):
    with pytest.raises(wire.WireError):
        wire.decode(tree, buffers)


def test_the_sandbox_runs_setup_or_plain_imports_then_constants():
    plain = new_notebook(cells=[
        new_code_cell("import math\nimport numpy as np\nfrom course_lib import checks\nimport course_lib.models.iomodel\n"
                      "rng = np.random.default_rng(1)\nEMPTY, FULL = 0, 2\nN = 4\nN = len('abcd')\nTILE = 2 * FULL",
                      id="a"),
        new_code_cell("x = 1", id="b", metadata={"tags": ["answer"], "course": {"exercise": "1.1"}}),
        new_code_cell("checks.check_value('1.1', x, 1)\nSEEN = 3", id="c",
                      metadata={"tags": ["check"], "course": {"exercise": "1.1", "points": 1}})])
    constants = "EMPTY, FULL = 0, 2\nTILE = 2 * FULL"   # no generator, no N bound to a call, nothing of a check
    assert names.sandbox_setup(plain) == ["import math\nimport numpy as np", constants]
    tagged = new_notebook(cells=[new_code_cell("import numpy as np", id="s", metadata={"tags": ["setup"]})] + plain.cells)
    assert names.sandbox_setup(tagged) == ["import numpy as np", constants]


def _cells(*sources):
    tags = {"check": ["check"], "answer": ["answer"]}
    cells = []
    for i, source in enumerate(sources):
        kind, _, code = source.partition(":") if source.split(":")[0] in tags else ("", "", source)
        cells.append(new_code_cell(code, id=f"c{i}", metadata={"tags": tags.get(kind, []),
                                                               "course": {"exercise": "1.1", "points": 1}}))
    return new_notebook(cells=cells)


def test_the_grader_skips_only_course_cells_no_check_depends_on():
    nb = _cells(
        "import numpy as np\nrng = np.random.default_rng(0)\ncases = []\ndef helper(x):\n    return x",  # c0
        "demo = np.random.default_rng(1).standard_normal(3)\nprint(helper(demo))",                   # c1: a demo
        "noise = rng.standard_normal(3)",                  # c2: draws from the checks' generator
        "cases.append(1)",                                 # c3: changes what a check reads
        "limit = 2",                                       # c4: binds what a check reads
        "unused = [x for x in range(3)]\n(y := unused)",   # c5: nothing reads it
        "answer:def f(x):\n    return x",
        "check:assert f(rng.standard_normal(1)).shape == (1,) and cases and limit")
    assert names.needed_cells(nb) == {"c0", "c2", "c3", "c4", "c7"}


def test_a_check_asks_only_for_answer_names_it_reads():
    nb = _cells("import numpy as np\nfrom course_lib import checks\ncases = [1, 2]",
                "answer:def squares(xs):\n    return xs",
                "check:expected = [float(c) for c in range(len(cases))]\n"
                "try:\n    got = squares(cases)\nexcept TypeError:\n    got = min(cases)\n"
                "checks.check_value('x', int(got[0]), n_bytes, rtol=__tolerance__)\n"
                "def inner(v):\n    return isinstance(v, dict) and limit")
    check = nb.cells[-1].source
    assert names.asked_names(check, names.course_names(nb)) == {"squares", "n_bytes", "limit"}


def test_a_checks_own_parameters_are_never_asked_for():
    # a class's methods and a function nested in a function take parameters (self, row, a, causal) that an
    # answer may also bind at its top level: fetching them would hand the check the answer's value (or fail)
    nb = _cells("import numpy as np",
                "answer:a = {'x': 1}\ndef score(n):\n    return n",
                "check:class Core:\n    def load(self, row, start):\n        return row[start] + lanes\n"
                "    def mac(self, acc, a, b):\n        return acc + a * b\n"
                "def counted(config):\n    def counting(q, k, v, causal):\n        return helper(q, causal)\n"
                "    def helper(x, flag):\n        return x\n    return counting\n"
                "score(Core().mac(0, 1, 2))")
    assert names.asked_names(nb.cells[-1].source, names.course_names(nb)) == {"score", "lanes"}


def test_numpy_strings_cross_as_str_and_slice_bounds_as_ints():
    assert type(roundtrip(np.str_("compute-bound"))) is str and roundtrip(np.str_("x")) == "x"
    back = roundtrip(slice(np.int64(2), np.intp(8), np.int32(2)))
    assert back == slice(2, 8, 2) and all(type(p) is int for p in (back.start, back.stop, back.step))

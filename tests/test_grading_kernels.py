"""Set 09 in the grader: a learner's CUDA kernel is defined from its cell's text, held to the
kernel language, and checked by cudacheck in a sandbox that never runs the answer's other code.

The solution's kernels pass; each planted mistake below fails with cudacheck's or the
language rule's words, costs only its own exercise, and no kernel reaches past what it was given.
"""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

from course_lib import checks, cudacheck
from course_lib.grading import kernels, pipeline, sandbox
from course_lib.grading.submission import Course

import notebook_factory as nf
from conftest import REPO

SOLUTION = REPO / "solutions" / "09_numba_cuda.ipynb"


def _answers():
    nb = nf.read(SOLUTION)
    return {name: nf.cells(nb, "answer", name)[0].source for name in nf.exercise_names(nb)}


def _edit(source, old, new):
    assert old in source, f"the edit must change the solution: {old!r}"
    return source.replace(old, new)


DEEP = "DEEP = " + " + ".join(["1"] * 2500) + "\n"


def _planted():
    """{submission: ({exercise: answer source}, {exercise: (status, words in the reason)})}."""
    a = _answers()
    return {
        "mistakes": ({
            "9.1": _edit(a["9.1"], "if r < x.shape[0] and c < x.shape[1]:", "if r < x.shape[0]:"),
            "9.2": _edit(a["9.2"], "    cuda.syncthreads()\n",
                         "    cuda.syncthreads()\n    rows = [r for r in range(n_c)]\n"),
            "9.3": _edit(a["9.3"], "        cuda.syncthreads()                 # everyone has read it", "        # "),
            "9.4": _edit(a["9.4"], "i = cuda.grid(1)", "i = cuda.grid(1)\n    kind = S.__class__"),
            "9.5": _edit(a["9.5"], "            m_new = m\n", "            while True:\n                pass\n"
                                                              "            m_new = m\n"),
            # a constant too deep for a recursive reader: this exercise fails, the others are graded
            "9.6": _edit(_edit(a["9.6"], "BR6, BC6, D6 = 8, 4, 8\n", DEEP + "BR6, BC6, D6 = 8, 4, 8\n"),
                         "c0 = tc * BC6\n", "c0 = tc * BC6 + 0 * DEEP\n"),
        }, {"9.1": ("fail", "out_of_bounds"), "9.2": ("fail", "a list comprehension is not part"),
            "9.3": ("fail", "race"), "9.4": ("fail", "`.__class__`"), "9.5": ("timeout", "cudacheck on flash_tiles"),
            "9.6": ("fail", "nested more than"), "9.7": ("pass", "")}),
        "attacks": ({
            # a numpy function in the kernel's place: cudacheck takes kernels only
            "9.1": "def scale_2d(x, out):\n    out[...] = 2 * x + np.arange(x.shape[1])\n",
            # the tile's constants left in another cell: the grader keeps only this cell's
            "9.2": _edit(a["9.2"], "BC, DMAX = 16, 8\n", ""),
            # the course's helper replaced: course names are never the answer's to define
            "9.3": _edit(_edit(a["9.3"], "T = 4\n", "T = 4\ncuda_check = lambda *args: None\n"
                                                      "require_gradable = lambda kernel: None\n"),
                         "        cuda.syncthreads()                 # everyone has read it", "        # "),
            # memory the sandbox does not have
            "9.4": _edit(a["9.4"], "o = cuda.local.array(DV_MAX, float32)", "o = cuda.local.array(1 << 40, float32)"),
            # an import inside the kernel, to reach the course
            "9.5": _edit(a["9.5"], "            m_new = m\n", "            import course_lib\n            m_new = m\n"),
            # the colleague's kernel, unfixed: a barrier not every thread reaches
            "9.7": _edit(a["9.7"], "    acc = float32(0.0)\n    for t in",
                         "    if row >= M or col >= N:\n        return\n    acc = float32(0.0)\n    for t in"),
        }, {"9.1": ("error", "must be a @cuda.jit function"), "9.2": ("fail", "`DMAX` is not defined for the kernel"),
            "9.3": ("fail", "race"), "9.4": ("error", "MemoryError"), "9.5": ("fail", "an import is not part"),
            "9.6": ("pass", ""), "9.7": ("fail", "barrier")}),
    }


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kernels")
    planted, paths = _planted(), {}
    for name, (answers, _) in planted.items():
        nb = nf.read(SOLUTION)
        for exercise, source in answers.items():
            nf.cells(nb, "answer", exercise)[0].source = source
        paths[name] = nf.write(nb, folder / f"{name}.ipynb")
    results = pipeline.grade_all(paths.values(), Course(REPO), pipeline.Options(timeout=20), jobs=2)
    return {name: {r.exercise: r for r in result.rows} for name, result in zip(paths, results)}, planted


@pytest.mark.needs_sandbox
@pytest.mark.parametrize("submission", ["mistakes", "attacks"])
def test_each_planted_kernel_fails_with_its_reason_alone(graded, submission):
    rows, planted = graded
    for exercise, (status, words) in planted[submission][1].items():
        row = rows[submission][exercise]
        assert row.status == status and words in row.reason, (exercise, row)


# -- the kernel language --------------------------------------------------------------------

def test_every_kernel_of_the_solution_is_in_the_kernel_language():
    kernel_answers = {name: source for name, source in _answers().items() if "@cuda.jit" in source}
    assert len(kernel_answers) >= 7  # 9.8's answer is plain numbers, a prediction
    for name, source in kernel_answers.items():
        found = kernels.extract(source)
        assert found.names and not any(found.problems.values()), (name, found.problems)


OUTSIDE = {  # a line of a kernel body -> words of the problem it must be reported with
    "y = [v for v in range(3)]": "a list comprehension",
    "y = x.__class__": "`.__class__`",
    "y = x.base": "`.base`",
    "f = open('a')": "`open` is not defined",
    "y = getattr(x, 'shape')": "`getattr` is not defined",
    "y = cuda.to_device(x)": "`cuda.to_device` is not something",
    "y = np.lib": "`np.lib` is not something",
    "c = cuda": "`cuda` is used only as `cuda.something`",
    "math = 2": "`math` is a module",
    "x[0:2] = 1": "a slice",
    "y = __builtins__": "double underscore",
    "import os": "an import",
    "for i in x: pass": "`for i in range(...)`",
    "raise ValueError": "raises nothing but NotImplementedError",
    "y = f'{x}'": "an f-string",
    "y = (lambda: 0)()": "a lambda",
    "y = {1: 2}": "a dict",
    "y = UNKNOWN + 1": "`UNKNOWN` is not defined",
}


@pytest.mark.parametrize("line", OUTSIDE)
def test_what_is_outside_the_kernel_language_is_named_by_line(line):
    cell = f"N = 4\n\n@cuda.jit\ndef k(x, out):\n    i = cuda.grid(1)\n    {line}\n    out[i] = x[i] * N\n"
    problems = kernels.extract(cell).problems["k"]
    assert problems and all(p.startswith("k, line ") for p in problems)
    assert any(OUTSIDE[line] in p and "line 6" in p for p in problems), problems


def test_every_part_of_cuda_cudacheck_models_is_kernel_language():
    from course_lib import cudacheck
    cell = ("@cuda.jit\ndef k(x, out):\n    i = cuda.grid(1)\n    v = cuda.shfl_down_sync(0xFFFFFFFF, x[i], 1)\n"
            "    cuda.syncwarp()\n    out[i] = v + cuda.activemask() + cuda.ballot_sync(0xFFFFFFFF, v > 0)\n")
    assert kernels.extract(cell).problems["k"] == []
    assert set(cudacheck.MODELLED) <= kernels.MODULES["cuda"]
    problems = kernels.extract("@cuda.jit\ndef k(x):\n    cuda.nanosleep(1)\n").problems["k"]
    assert "`cuda.nanosleep` is not something" in problems[0] and "syncwarp, activemask" in problems[0]


def test_a_kernel_named_like_the_graders_own_names_is_refused():
    problems = kernels.extract("@cuda.jit\ndef __builtins__(x):\n    x[0] = 1\n").problems["__builtins__"]
    assert problems and "double underscore" in problems[0]


def test_only_kernels_and_constants_are_kept_with_their_lines():
    cell = "import os\nN = 4\nos.system('x')\n\n@cuda.jit\ndef k(x):\n    x[0] = N\nprint('done')\n"
    found = kernels.extract(cell)
    assert found.names == ["k"] and found.source.splitlines() == ["", "N = 4", "", "", "@cuda.jit",
                                                                  "def k(x):", "    x[0] = N", ""]


SMUGGLER = ("B = np.__builtins__\n"
            "cc = B['__import__']('sys').modules['cudacheck']\n"
            "real = cc.check\n"
            "def fake(kernel, grid, block, x, out):\n"
            "    out[...] = 2 * x\n"
            "    return real(kernel, grid, block, x, out)\n"
            "cc.check = fake\n")
SMUGGLING = f"PWN = 1; np.__builtins__['exec']({SMUGGLER!r})\n\n@cuda.jit\ndef twice(x, out):\n    pass\n"


def test_a_statement_beside_a_constant_on_its_line_is_not_kept():
    found = kernels.extract(SMUGGLING)
    assert found.names == ["twice"] and found.problems == {"twice": []} and not found.error
    assert found.source.splitlines() == ["PWN = 1", "", "@cuda.jit", "def twice(x, out):", "    pass"]
    mixed = kernels.extract("import os; A = 1; os.system('x'); B = (A,\n  2); print(B)\n")
    assert mixed.source.splitlines() == ["A = 1; B = (A,", "  2)"]


@pytest.mark.needs_sandbox
def test_code_smuggled_beside_a_constant_never_runs():
    """Before, the whole line ran there and replaced cudacheck.check with one that wrote the answer."""
    found = kernels.extract(SMUGGLING)
    x, out = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    with sandbox.Session(sandbox.Limits(), kernels=True) as session:
        session.define(found.source, found.names, timeout=60)
        report = kernels.report_back(session.check_kernel("twice", 1, 4, [x, out], timeout=60), "twice", [x, out])
    assert report.ok and out.tolist() == [0.0] * 4   # the empty kernel wrote nothing


def test_a_constant_too_deep_to_read_is_refused_by_name():
    found = kernels.extract(DEEP + "@cuda.jit\ndef k(x):\n    x[0] = DEEP\n")
    assert "DEEP =" not in found.source and len(found.problems["k"]) == 1
    assert "`DEEP` is no kernel constant (nested more than" in found.problems["k"][0]


def _notebook_kernel(tmp_path, cell):
    """A kernel as a learner's notebook defines it: compiled from a file, as ipykernel does."""
    path = tmp_path / f"cell_{len(list(tmp_path.iterdir()))}.py"   # each run of a cell has its own file
    path.write_text(cell)
    namespace = {"cuda": cudacheck.STANDIN, "float32": np.float32}
    exec(compile(cell, str(path), "exec"), namespace)
    return namespace["k"]


def test_the_notebook_refuses_what_the_grader_would_in_its_words(tmp_path, capsys):
    good = _notebook_kernel(tmp_path, "@cuda.jit\ndef k(x):\n    x[cuda.grid(1)] = 1.0\n")
    kernels.require_gradable(good)
    bad = _notebook_kernel(tmp_path, "@cuda.jit\ndef k(x):\n    x[cuda.grid(1)] = len([1])\n")
    with pytest.raises(checks.CheckFailed, match="a list is not part"):
        kernels.require_gradable(bad)
    assert "FAIL k: the grader could not run this kernel" in capsys.readouterr().out


# -- the kernel sandbox -----------------------------------------------------------------------

@pytest.mark.needs_sandbox
def test_the_kernel_sandbox_checks_kernels_and_runs_nothing_else():
    with sandbox.Session(sandbox.Limits(), kernels=True) as session:
        with pytest.raises(sandbox.AnswerRaised, match="takes define and check"):
            session.exec(["x = 1"], timeout=60)
        with pytest.raises(sandbox.AnswerRaised, match="__import__"):  # even unchecked source has no imports
            session.define("import os\n", [], timeout=60)
        session.define(textwrap.dedent("""\
            @cuda.jit
            def reverse(a, out):
                t = cuda.threadIdx.x
                tile = cuda.shared.array(8, float32)
                tile[t] = a[t]
                cuda.syncthreads()
                out[t] = tile[7 - t]

            @cuda.jit
            def racy(a, out):
                t = cuda.threadIdx.x
                tile = cuda.shared.array(8, float32)
                tile[t] = a[t]
                out[t] = tile[7 - t]
            """), ["reverse", "racy"], timeout=60)
        a = np.arange(8, dtype=np.float32)
        reports, outs = {}, {}
        for name in ("reverse", "racy"):
            outs[name] = np.zeros(8, np.float32)
            reply = session.check_kernel(name, 1, 8, [a, outs[name]], timeout=60)
            reports[name] = kernels.report_back(reply, name, [a, outs[name]])
    assert reports["reverse"].ok and outs["reverse"].tolist() == list(range(7, -1, -1))  # written back
    assert reports["racy"].kinds == {"race"} and "line 14 of racy" in str(reports["racy"])


def test_a_forged_report_is_refused():
    args = [np.zeros(2, np.float32)]
    good = {"report": {"findings": [], "intervals": 1, "traffic": {}, "griddim": [1], "blockdim": [2],
                       "prefetch_intervals": 0},
            "written": [[0, np.ones(2, np.float32)]]}
    assert kernels.report_back(good, "k", args).ok and args[0].tolist() == [1.0, 1.0]
    for bad in ({**good, "written": [[0, np.ones(3, np.float32)]]},        # another shape
                {**good, "written": [[1, np.ones(2, np.float32)]]},        # an argument that is not there
                {**good, "report": {**good["report"], "findings": [{"kind": "fine", "message": ""}]}},
                {**good, "report": {**good["report"], "intervals": "1"}},
                {**good, "report": {**good["report"], "prefetch_intervals": None}}):
        with pytest.raises(ValueError):
            kernels.report_back(bad, "k", [np.zeros(2, np.float32)])

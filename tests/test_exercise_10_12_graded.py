"""Wrong answers to sets 10-12 that once scored in the real grader (answers in the sandbox, checks
in the grader, inputs salted) score nothing there now, and the rest of the notebook still does.

tests/test_exercise_1N_checks.py run each answer and its check in one process; these run the
grader itself, where an answer's arithmetic, its kernel and its return value cross the sandbox's
wall: a check's np.errstate must hold for the answer's division there too, and cudacheck's count
of prefetched tiles must come back from the kernel sandbox.
"""
from __future__ import annotations

import nbformat
import pytest
from test_exercise_10_checks import NAIVE_10_4

from course_lib.grading import pipeline
from course_lib.grading.submission import Course

from conftest import REPO

pytestmark = pytest.mark.needs_sandbox

SALT = 4242   # any salt: the test files sweep several; this one crosses the sandbox

NAIVE_KERNEL = "TILE = 8\n\n\n@cuda.jit\ndef matmul_prefetch_fixed(A, B, C):\n" + NAIVE_10_4   # 10.4's answer, no prefetch

# {set: {exercise: (old, new) in the solution's answer cell}}: each must score nothing
WRONG = {
    "10_gpu_performance": {"10.4": None},   # the whole answer becomes NAIVE_KERNEL
    "11_low_precision": {
        "11.8": ('    if np.any(np.abs(k).max(axis=(2, 3)) >= 464.0 * k_descale):\n        return "fp16", math.inf\n', ""),
        "11.5": ("p8 = p.astype(E4M3).astype(np.float32)", "p8 = p")},
    "12_backward": {
        "12.1": ("np.where(seen, np.sum(dout * o_acc, axis=-1) / safe, 0.0)",
                 "np.nan_to_num(np.sum(dout * o_acc, axis=-1) / l)"),
        "12.5": ("    return dQ, dK.reshape(", "    return ()\n    return dQ, dK.reshape("),
        "12.7": ("for br in sizes for bc in sizes", "for br in (8,) + sizes for bc in sizes")},
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_answers_score_nothing_in_the_grader_and_the_rest_full_marks(name, tmp_path):
    nb = nbformat.read(REPO / "solutions" / f"{name}.ipynb", as_version=4)
    for cell in nb.cells:
        exercise = cell.metadata.get("course", {}).get("exercise")
        if "answer" in cell.metadata.get("tags", []) and exercise in WRONG[name]:
            edit = WRONG[name][exercise]
            if edit is None:
                cell.source = NAIVE_KERNEL
            else:
                assert edit[0] in cell.source, (exercise, edit[0])
                cell.source = cell.source.replace(*edit)
    path = tmp_path / f"{name}.ipynb"
    nbformat.write(nb, path)
    result = pipeline.grade(path, Course(REPO), pipeline.Options(timeout=300, fresh_inputs=SALT))
    status = {row.exercise: (row.status, row.points, row.max_points, row.reason) for row in result.rows}
    for exercise, (state, points, most, reason) in status.items():
        if exercise in WRONG[name]:
            assert points == 0 and state != "pass", (exercise, state, reason)
        else:
            assert points == most, (exercise, state, reason)

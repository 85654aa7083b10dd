"""The predict-then-measure, find-the-bug and design exercises of sets 01-07 fail on plausible
wrong answers (and pass the solutions).

As in test_exercise_08_checks: each case takes the solution notebook, swaps one answer for a
mistake a learner would make (an edit of the solution's own source), and runs the set's setup,
the cells the exercise builds on, the answer and its check cell in one namespace: the check must
raise CheckFailed and print FAIL.
"""
import functools

import pytest

import notebook_factory as nf

from course_lib import checks

SETS = {"1": "01_naive_attention", "2": "02_roofline", "3": "03_tiling_and_sram", "4": "04_online_softmax",
        "5": "05_flash_forward", "6": "06_masks", "7": "07_tails_varlen_bad_input"}
SETUP = {"6": "s06-02"}  # the set's course cell with the imports; "setup" elsewhere
BEFORE = {"3.7": ["ex3-1-answer", "ex3-2-answer", "ex3-4-answer"],  # the design uses the learner's own counts
          "5.7": ["ex5-6-answer"]}

L4_TILE = "l4_tile = min(fitting, key=lambda t: (fa2_hbm_bytes(8192, 8192, 128, 2, t[0]), tile_shared_bytes(*t, 128, 2)))"
SHARE = "predicted_share = 4 * 2048**2 / (4 * 2048 * 64 + 4 * 2048**2)"
FRACTION = "predicted_work_fraction = tiles_per_side * (tiles_per_side + 1) / 2 / tiles_per_side**2"
CAP_THEN_MASK = ("    if softcap > 0:\n        s = softcap * np.tanh(s / softcap)  # the fix: cap first, then mask "
                 "(tanh(-inf) is -1: a hidden key came back)\n    s = np.where(visible, s, -np.inf)")

WRONG = {
    "1.7": [("predicted_peak_bytes = 3 *", "predicted_peak_bytes = 1 *"),      # S alone
            ("score_sized_arrays = 3", "score_sized_arrays = 1")],
    "1.8": [("scale = 1 / math.sqrt(q.shape[-1])", "scale = 1 / math.sqrt(v.shape[-1])"),  # the bug itself
            ("+ (nk - nq)\n", "\n")],                                           # fixed, and broke the mask
    "2.7": [(SHARE, "predicted_share = 0.5"),
            (SHARE, "predicted_share = 2 * 2048**2 / (4 * 2048 * 64 + 2 * 2048**2)"),  # S and P written, never read
            ("seqlen_for_half = 64", "seqlen_for_half = 128")],
    "2.8": [("pairs = sum(min(seqlen_k, max(0, i + offset + 1)) for i in range(seqlen_q))",
             "pairs = seqlen_q * seqlen_k // 2"),                               # the bug itself
            ("max(0, i + offset + 1)", "max(0, i + 1)")],                       # top-left: wrong when Nq != Nk
    "3.7": [(L4_TILE, "l4_tile = (64, 64)"),                                     # fits, twice the traffic
            (L4_TILE, "l4_tile = (256, 64)"),                                    # does not fit
            ("l4_shared_bytes = tile_shared_bytes(*l4_tile, 128, 2)",
             "l4_shared_bytes = tile_shared_bytes(*l4_tile, 128, 2, kv_stages=2)"),
            ("fa2_hbm_bytes(8192, 8192, 128, 2, l4_tile[0])", "fa2_hbm_bytes(8192, 8192, 128, 2, l4_tile[1])")],
    "3.8": [("if j0 <= i1 - 1 + offset]", "if j0 <= i0 + offset]"),              # the bug itself
            ("if j0 <= i1 - 1 + offset]", "if j0 <= i1 + offset]")],             # reads one tile too many
    "3.9": [("predicted_sram_bytes = shared + registers", "predicted_sram_bytes = shared"),  # the tiles alone
            ("+ 64 * 64 * 2     # m, l", "     # m, l"),                        # forgot P's float16 copy
            ("register_share = registers / predicted_sram_bytes", "register_share = 0.5")],
    "4.7": [("float16_exp_limit = math.log(65504)", "float16_exp_limit = math.log(3.4028235e38)"),
            ("bfloat16_exp_limit = math.log(3.39e38)", "bfloat16_exp_limit = math.log(65504)")],
    "4.8": [("O = alpha[:, None] * O + p @ v[j:j + Bc]", "O = O + p @ v[j:j + Bc]"),  # the bug itself
            ("l = alpha * l + p.sum(axis=-1)", "l = l + p.sum(axis=-1)")],
    "5.7": [("predicted_ratio = fa2_hbm_bytes(1, 1, 1024, 1024, 128, 128, 32, 8) / naive_bytes", "predicted_ratio = 0.5"),
            ("4 * 1024 * 1024) * 8", "2 * 1024 * 1024) * 8"),                  # P forgotten in naive's count
            ("br, 8) < naive_bytes)", "br, 8) > naive_bytes)")],
    "5.8": [("for i in range(0, Nq, Br):", "for i in range(0, Nq - Br + 1, Br):"),  # the bug itself
            ("for i in range(0, Nq, Br):", "for i in range(0, Nq - Br, Br):")],
    "6.7": [(FRACTION, "predicted_work_fraction = 0.5"),                        # "causal is half"
            ("partial_tiles = tiles_per_side ", "partial_tiles = 0 ")],
    "6.8": [(CAP_THEN_MASK, "    s = np.where(visible, s, -np.inf)\n    if softcap > 0:\n"
                            "        s = softcap * np.tanh(s / softcap)"),     # the bug itself
            ("    s = np.where(visible, s, -np.inf)\n", "")],
    "7.7": [("offset = nk - nq  #", "offset = (cu_k[-1] - cu_k[0]) - (cu_q[-1] - cu_q[0])  #"),  # the bug itself
            ("offset = nk - nq  #", "offset = 0  #")],                           # top-left in every sequence
    "7.8": [("packed_peak_bytes = 3 * 2 * 700**2 * 4", "packed_peak_bytes = 3 * 2 * (700**2 + 30**2 + 200**2 + 5**2 + 400**2) * 4"),
            ("padded_over_packed_peak = 3 * 5 * 2 * 700**2 * 4 / packed_peak_bytes",
             "padded_over_packed_peak = 5 * 700**2 / (700**2 + 30**2 + 200**2 + 5**2 + 400**2)")],
}
CASES = [(exercise, edit) for exercise, edits in WRONG.items() for edit in edits]


@functools.lru_cache(maxsize=None)
def solution(key):
    return nf.SolutionCells.read(nf.REPO / "solutions" / f"{SETS[key]}.ipynb")


def run(exercise, edit=None):
    key = exercise.split(".")[0]
    cells = solution(key)
    cells.run({}, exercise, edit, before=[SETUP.get(key, "setup"), *BEFORE.get(exercise, [])])


@pytest.mark.parametrize("exercise", sorted(WRONG))
def test_the_solution_passes_its_check(exercise):
    run(exercise)


@pytest.mark.parametrize("exercise,edit", CASES, ids=[f"{e}-{i}" for e, edits in WRONG.items() for i in range(len(edits))])
def test_a_plausible_wrong_answer_fails_its_check(exercise, edit, capsys):
    with pytest.raises(checks.CheckFailed):
        run(exercise, edit)
    assert "FAIL" in capsys.readouterr().out

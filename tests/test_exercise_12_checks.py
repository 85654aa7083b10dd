"""Exercise set 12's checks fail on plausible wrong answers (and pass the solutions).

Each case takes the solution notebook, swaps one answer for a mistake a learner
would make, and runs the setup, the answer and its check cell in one namespace:
the check must raise CheckFailed.  The mistakes are edits of the solution's own
source, so each differs from a right answer in exactly the way named.  Every case
runs on the published inputs and on every salt the tests sweep (exercise_salts.SALTS)."""
import pytest

from course_lib import checks

from exercise_checks import ExerciseSet
from exercise_salts import SALTS, run_salted, salted_check_tests

# the cells an exercise builds on: the given buggy functions, and 12.7 on 12.4's answer
BEFORE = {"12.5": ["s12-17"], "12.6": ["s12-17", "s12-21"], "12.7": ["s12-13"]}
EXERCISES = ExerciseSet("12_backward", setup=["setup-answers", "s12-02"], before=BEFORE, fresh=True)
# 12.1's wrong D divides 0 by 0 on an empty row, under the check's errstate (the grader hands it to the sandbox)
ERRORS = {"12.1": (FloatingPointError,)}
# 12.7's design pasted: the published inputs' answer, returned whatever the check draws
PASTE_12_7 = ("    sizes = (16, 32, 64, 128)\n",
              "    return " + repr({"tile": (16, 32), "sram": 65664, "traffic": 588252672}) + "\n")

WRONG = {
    "12.1": [("np.sum(dout * o_acc, axis=-1) / safe", "np.sum(dout * o_acc, axis=-1)"),            # O~ taken for O
             ("np.sum(dout * o_acc, axis=-1) / safe", "np.sum(dout * o_acc, axis=-1) / l"),        # 0/0 on empty rows
             ("np.sum(dout * o_acc, axis=-1) / safe", "np.sum(dout, axis=-1) * np.sum(o_acc, axis=-1) / safe"),
             ("np.where(seen, np.sum(dout * o_acc, axis=-1) / safe, 0.0)",
              "np.nan_to_num(np.sum(dout * o_acc, axis=-1) / l)")],                                 # 0/0, then patched
    "12.2": [("p * (dp - D + dlse[:, None])", "p * (dp - D) + dlse[:, None]"),                    # d lse / dS = 1
             ("p * (dp - D + dlse[:, None])", "p * (dp - D - dlse[:, None])"),
             ("D = np.sum(p * dp, axis=-1, keepdims=True)", "D = np.sum(dp, axis=-1, keepdims=True)")],
    "12.3": [("- lse[r0:r1, None])", ")"),                                                          # P not normalised
             ("dVj += Pij.T @ dout[r0:r1]", "dVj = Pij.T @ dout[r0:r1]"),                           # last tile only
             ("for r0 in range(0, len(q), Br):", "for r0 in range(0, len(q), 2 * Br):"),            # tiles skipped
             ("Kj = k[j0:j1]", "Kj = k[0:len(k)][j0:j1]")],                                          # reads all of K
    "12.4": [("Tc = math.ceil(N / Bc)", "Tc = N // Bc"),                                           # tails dropped
             ("dq = row * d + Tc * 2 * row * d + 2 * row * d", "dq = Tc * row * d"),              # dQ read-modify-write forgotten
             ("inner = Tc * (2 * row * d + 2 * row)", "inner = Tc * 2 * row * d"),                 # lse, D per pair forgotten
             ("return 7 * square + 4 * N * d * 8", "return 2 * square + 4 * N * d * 8")],          # only P counted
    "12.5": [("dK.reshape(Hk, group, *dK.shape[1:]).sum(axis=1)", "dK[::group]"),                 # the colleague's bug
             ("dK.reshape(Hk, group, *dK.shape[1:]).sum(axis=1)",
              "dK.reshape(group, Hk, *dK.shape[1:]).sum(axis=0)"),                                 # heads grouped the wrong way
             ("dV.reshape(Hk, group, *dV.shape[1:]).sum(axis=1)", "dV.reshape(Hk, group, *dV.shape[1:]).mean(axis=1)"),
             ("    return dQ, dK.reshape(", "    return ()\n    return dQ, dK.reshape("),               # nothing to compare
             ("    return dQ, dK.reshape(", "    return (dQ,)\n    return dQ, dK.reshape(")],          # dq alone
    "12.6": [("s = np.where(j <= i + Nk - Nq, s, -np.inf)", "s = np.where(j <= i, s, -np.inf)"),  # top-left alignment
             ("shift = np.where(np.isneginf(lse), 0.0, lse)", "shift = lse"),                      # NaN on rows that see nothing
             ("if causal:                                                 # the mask",
              "if False:                                                 # the mask"),             # the colleague's bug
             ("    return scale * dS @ k, scale * dS.T @ q, dV", "    return ()"),                     # nothing to compare
             ("    return scale * dS @ k, scale * dS.T @ q, dV", "    return (scale * dS @ k,)")],     # dq alone
    "12.7": [("return 4 * (4 * Bc * d + 2 * Br * d + 2 * Br + 2 * Br * Bc)",
              "return 4 * (2 * Bc * d + 2 * Br * d + 2 * Br + 2 * Br * Bc)"),  # dK, dV accumulators forgotten
             ("return 4 * (4 * Bc * d + 2 * Br * d + 2 * Br + 2 * Br * Bc)",
              "return 4 * (4 * Bc * d + 2 * Br * d + 2 * Br + Br * Bc)"),                           # one Br x Bc tile
             ("key=lambda t: (fa2_backward_bytes(N, d, *t), backward_sram_bytes(*t, d))",
              "key=lambda t: backward_sram_bytes(*t, d)"),                                          # smallest, not cheapest
             ("for br in sizes for bc in sizes", "for br in (8,) + sizes for bc in sizes")],       # B_r = 8: no SRAM for it
}
test_the_solution_passes_on_every_salt, test_a_plausible_wrong_answer_fails_on_every_salt = \
    salted_check_tests(EXERCISES, WRONG, errors=ERRORS)


@pytest.mark.parametrize("salt", [salt for salt in SALTS if salt is not None])
def test_the_published_design_pasted_fails_every_salted_grading(salt, capsys):
    """12.7's answer pasted from the published inputs' draw: those inputs pass it, no salt does."""
    run_salted(EXERCISES, "12.7", None, PASTE_12_7, capsys)
    with pytest.raises(checks.CheckFailed):
        run_salted(EXERCISES, "12.7", salt, PASTE_12_7, capsys)

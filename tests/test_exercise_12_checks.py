"""Exercise set 12's checks fail on plausible wrong answers (and pass the solutions).

Each case takes the solution notebook, swaps one answer for a mistake a learner
would make, and runs the setup, the answer and its check cell in one namespace:
the check must raise CheckFailed.  The mistakes are edits of the solution's own
source, so each differs from a right answer in exactly the way named."""
from exercise_checks import ExerciseSet, check_tests

# the cells an exercise builds on: the given buggy functions, and 12.7 on 12.4's answer
BEFORE = {"12.5": ["s12-17"], "12.6": ["s12-17", "s12-21"], "12.7": ["s12-13"]}
EXERCISES = ExerciseSet("12_backward", setup=["setup-answers", "s12-02"], before=BEFORE, fresh=True)
ERRORS = {"12.1": (FloatingPointError,)}   # 12.1's wrong D divides 0 by 0 on an empty row, under errstate

WRONG = {
    "12.1": [("np.sum(dout * o_acc, axis=-1) / safe", "np.sum(dout * o_acc, axis=-1)"),            # O~ taken for O
             ("np.sum(dout * o_acc, axis=-1) / safe", "np.sum(dout * o_acc, axis=-1) / l"),        # 0/0 on empty rows
             ("np.sum(dout * o_acc, axis=-1) / safe", "np.sum(dout, axis=-1) * np.sum(o_acc, axis=-1) / safe")],
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
             ("dV.reshape(Hk, group, *dV.shape[1:]).sum(axis=1)", "dV.reshape(Hk, group, *dV.shape[1:]).mean(axis=1)")],
    "12.6": [("s = np.where(j <= i + Nk - Nq, s, -np.inf)", "s = np.where(j <= i, s, -np.inf)"),  # top-left alignment
             ("shift = np.where(np.isneginf(lse), 0.0, lse)", "shift = lse"),                      # NaN on rows that see nothing
             ("if causal:                                                 # the mask",
              "if False:                                                 # the mask")],            # the colleague's bug
    "12.7": [("return 4 * (4 * Bc * d + 2 * Br * d + 2 * Br + 2 * Br * Bc)",
              "return 4 * (2 * Bc * d + 2 * Br * d + 2 * Br + 2 * Br * Bc)"),  # dK, dV accumulators forgotten
             ("return 4 * (4 * Bc * d + 2 * Br * d + 2 * Br + 2 * Br * Bc)",
              "return 4 * (4 * Bc * d + 2 * Br * d + 2 * Br + Br * Bc)"),                           # one Br x Bc tile
             ("key=lambda t: (fa2_backward_bytes(4096, 64, *t), backward_sram_bytes(*t, 64))",
              "key=lambda t: backward_sram_bytes(*t, 64)")],                                          # smallest, not cheapest
}
test_the_solution_passes_its_check, test_a_plausible_wrong_answer_fails_its_check = \
    check_tests(EXERCISES, WRONG, errors=ERRORS)

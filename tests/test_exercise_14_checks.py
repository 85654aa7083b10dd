"""Exercise set 14's checks fail on plausible wrong answers (and pass the solutions).

Each case takes the solution notebook, swaps one answer for a mistake a learner
would make, and runs the setup, the answer and its check cell in one namespace:
the check must raise CheckFailed.  The mistakes are edits of the solution's own
source, so each differs from a right answer in exactly the way named."""
from exercise_checks import ExerciseSet, check_tests

EXERCISES = ExerciseSet("14_parallel", setup=["setup-answers", "course-setup"], fresh=True,
                        before={"14.5": ["ex14-5-given"], "14.6": ["ex14-6-given"], "14.7": ["14.3", "14.4"]})


WRONG = {
    "14.1": [("top = np.max(lses, axis=0)  ", "top = np.zeros(lses.shape[1])  "),           # no max shift: overflow at 1e3
             ("weights = mass / np.where(total > 0, total, 1.0)", "weights = mass"),         # weights not normalised
             ("lse = np.where(total > 0, shift + np.log(np.where(total > 0, total, 1.0)), -np.inf)",
              "lse = np.max(lses, axis=0)")],                                                  # lse of the largest rank only
    "14.2": [("return (q_start - k_start) // stride", "return int((q_start - k_start) / stride)"),  # truncates toward 0
             ("return (q_start - k_start) // stride", "return q_start - k_start"),                  # stride forgotten
             ("return (q_start - k_start) // stride", "return 0")],                                 # the rank's position ignored
    "14.3": [("batch * heads_k * (seqlen // world_size) * 2", "batch * heads * (seqlen // world_size) * 2"),  # GQA ignored
             ("* 2 * head_dim * itemsize", "* head_dim * itemsize"),                                # K only, V forgotten
             ("(seqlen // world_size)", "(world_size - 1) * (seqlen // world_size)"),              # the whole ring, not a step
             ("(seqlen // world_size)", "seqlen")],                                                  # the whole sequence
    "14.4": [("return held * (world_size - 1) // world_size", "return held"),                       # counts what it keeps
             ("(heads + 2 * heads_k + heads)", "(heads + 2 * heads_k)"),                             # out never goes back
             ("(heads + 2 * heads_k + heads)", "(4 * heads)")],                                      # GQA ignored
    "14.5": [("k_start + np.arange(m)[None, :] <= q_start + np.arange(n)[:, None]",
              "np.arange(m)[None, :] <= np.arange(n)[:, None]"),                                     # the colleague's bug
             ("k_start + np.arange(m)[None, :] <= q_start + np.arange(n)[:, None]",
              "np.arange(m)[None, :] <= np.arange(n)[:, None] + (q_start - k_start) // max(1, m)"),  # block-index offset
             ("k_start + np.arange(m)[None, :] <= q_start + np.arange(n)[:, None]",
              "k_start + np.arange(m)[None, :] < q_start + np.arange(n)[:, None]")],                 # misses the diagonal
    "14.6": [("top = np.maximum(lse1, lse2)", "top = np.zeros_like(lse1)"),                          # the colleague's bug
             ("shift = np.where(np.isneginf(top), 0.0, top)", "shift = top"),                        # NaN on an unseen row
             ("(a1 / safe)[:, None] * out1 + (a2 / safe)[:, None] * out2", "0.5 * (out1 + out2)")],  # plain mean
    "14.7": [("best = (u, r, \"zigzag\", seconds)", "best = (u, r, \"contiguous\", seconds)"),        # idle ranks
             ("if world_size % u or heads % u or heads_k % u:", "if world_size % u or heads % u:"),  # K/V heads split
             ("if best is None or seconds < best[3]:", "if best is None:"),                          # pure ring always
             ("seconds = (4 * (u - 1) + (r - 1)) * alpha + sent / beta",
              "seconds = sent / beta")],                                                             # latency forgotten
}
test_the_solution_passes_its_check, test_a_plausible_wrong_answer_fails_its_check = check_tests(EXERCISES, WRONG)

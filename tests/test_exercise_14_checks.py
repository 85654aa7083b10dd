"""Exercise set 14's checks fail on plausible wrong answers (and pass the solutions).

Each case takes the solution notebook, swaps one answer for a mistake a learner
would make, and runs the setup, the answer and its check cell in one namespace:
the check must raise CheckFailed, on the published inputs and on every salt the
tests sweep (exercise_salts.SALTS).  The mistakes are edits of the solution's own
source, so each differs from a right answer in exactly the way named."""
from exercise_checks import ExerciseSet
from exercise_salts import run_salted, salted_check_tests

EXERCISES = ExerciseSet("14_parallel", setup=["setup-answers", "course-setup"], fresh=True,
                        before={"14.5": ["ex14-5-given"], "14.6": ["ex14-6-given"], "14.7": ["14.4"]})


WRONG = {
    "14.1": [("top = np.max(lses, axis=0)  ", "top = np.zeros(lses.shape[1])  "),           # no max shift: overflow at 1e3
             ("shift = np.where(np.isneginf(top), 0.0, top)", "shift = top"),                # NaN on a row no rank saw
             ("weights = mass / np.where(total > 0, total, 1.0)", "weights = mass"),         # weights not normalised
             ("lse = np.where(total > 0, shift + np.log(np.where(total > 0, total, 1.0)), -np.inf)",
              "lse = np.max(lses, axis=0)")],                                                  # lse of the largest rank only
    "14.2": [("d = (q_start - k_start) // stride", "d = int((q_start - k_start) / stride)"),     # truncates toward 0
             ("d = (q_start - k_start) // stride", "d = q_start - k_start"),                      # stride forgotten
             ("np.clip(np.arange(n) + d + 1, 0, m)", "np.clip(np.arange(n) + d, 0, m)"),          # misses the diagonal
             ("np.clip(np.arange(n) + d + 1, 0, m)", "np.maximum(np.arange(n) + d + 1, 0)"),      # more keys than the piece
             ("np.clip(np.arange(n) + d + 1, 0, m)", "np.minimum(np.arange(n) + d + 1, m)"),      # negative counts
             ("return int(np.clip(np.arange(n) + d + 1, 0, m).sum())",
              "return np.clip(np.arange(n) + d + 1, 0, m)")],                                      # per query, not the total
    "14.3": [("return (world_size - 1) * shard * itemsize + world_size * shard * 4",
              "return (world_size - 1) * shard * (itemsize + 4)"),                                 # the gradients' last hop
             ("world_size * shard * 4", "world_size * shard * itemsize"),                        # dK, dV in the input dtype
             ("return (world_size - 1) * shard * itemsize + world_size * shard * 4",
              "return (world_size - 1) * shard * itemsize"),                                       # the forward's bytes only
             ("shard = batch * heads_k *", "shard = batch * heads *")],                            # GQA ignored
    "14.4": [("kv_heads_per_rank = max(heads_k // world_size, 1)", "kv_heads_per_rank = heads_k / world_size"),  # K/V split
             ("kv_heads_per_rank = max(heads_k // world_size, 1)", "kv_heads_per_rank = heads // world_size"),   # GQA ignored
             ("(2 * heads // world_size + 2 * kv_heads_per_rank)", "(heads // world_size + 2 * kv_heads_per_rank)"),  # no out
             ("return (world_size - 1) * per_rank", "return world_size * per_rank")],              # counts what it keeps
    "14.5": [("k_start + np.arange(m)[None, :] <= q_start + np.arange(n)[:, None]",
              "np.arange(m)[None, :] <= np.arange(n)[:, None]"),                                     # the colleague's bug
             ("k_start + np.arange(m)[None, :] <= q_start + np.arange(n)[:, None]",
              "np.arange(m)[None, :] <= np.arange(n)[:, None] + (q_start - k_start) // max(1, m)"),  # block-index offset
             ("k_start + np.arange(m)[None, :] <= q_start + np.arange(n)[:, None]",
              "k_start + np.arange(m)[None, :] < q_start + np.arange(n)[:, None]")],                 # misses the diagonal
    "14.6": [("a1, a2 = np.exp2(lse1 - shift), np.exp2(lse2 - shift)", "a1, a2 = np.exp(lse1 - shift), np.exp(lse2 - shift)"),
             ("shift + np.log2(np.where(total > 0, total, 1.0))", "shift + np.log(np.where(total > 0, total, 1.0))"),
             ("top = np.maximum(lse1, lse2)", "top = np.zeros_like(lse1)"),                          # no max shift
             ("shift = np.where(np.isneginf(top), 0.0, top)", "shift = top"),                        # NaN on an unseen row
             ("(a1 / safe)[:, None] * out1 + (a2 / safe)[:, None] * out2", "0.5 * (out1 + out2)")],  # plain mean
    "14.7": [("best = (u, r, \"zigzag\", seconds)", "best = (u, r, \"contiguous\", seconds)"),        # idle ranks
             ("if world_size % u or heads % u or heads_k % u:", "if world_size % u or heads % u:"),  # K/V heads split
             ("if best is None or seconds < best[3]:", "if best is None:"),                          # pure ring always
             ("seconds = (4 * (u - 1) + (r - 1)) * alpha + sent / beta",
              "seconds = sent / beta"),                                                              # latency forgotten
             ("ring_shard = 2 * (heads_k // u)", "ring_shard = 2 * (heads // u)"),                    # the ring's GQA ignored
             ("(4 * (u - 1) + (r - 1)) * alpha", "(u - 1 + r - 1) * alpha")],                        # one all-to-all, not four
}
ERRORS = {"14.2": (TypeError,), "14.4": (TypeError,)}
test_the_solution_passes_on_every_salt, test_a_plausible_wrong_answer_fails_on_every_salt = \
    salted_check_tests(EXERCISES, WRONG, errors=ERRORS)


def test_14_7_draws_its_cases_from_a_space_no_pasted_table_covers(capsys):
    # 77 drawn cases once fitted in a table of answers; now each grading draws machines and models anew
    record = ("    best = None\n",
              "    globals().setdefault(\"ASKED\", []).append((heads, heads_k, world_size, seqlen, head_dim, itemsize,"
              " alpha, beta))\n    best = None\n")
    drawn = set()
    for salt in range(1, 31):
        namespace = run_salted(EXERCISES, "14.7", salt, record, capsys)
        drawn.update(namespace["ASKED"][5:])          # the five fixed cases come first
    assert len(drawn) == 3 * 30

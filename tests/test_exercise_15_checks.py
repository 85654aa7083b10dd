"""Exercise set 15's checks fail on plausible wrong answers (and pass the solutions).

Each case takes the solution notebook, swaps one answer for a mistake a learner
would make, and runs the setup, the answer and its check cell in one namespace:
the check must raise CheckFailed, on the published inputs and on every salt the
tests sweep (exercise_salts.SALTS).  The mistakes are edits of the solution's own
source, so each differs from a right answer in exactly the way named."""
from course_lib import checks

from exercise_checks import ExerciseSet
from exercise_salts import run_salted, salted_check_tests

BUGGY = "s15-16"  # 15.5's given cell: the colleague's schedule and the overwrite finder
EXERCISES = ExerciseSet("15_edge", setup=["setup-answers", "s15-02"], before={"15.5": [BUGGY]})


WRONG = {
    "15.1": [("amax = np.abs(x).max(axis=1)",
              "amax = np.abs(x).max() + 0 * np.abs(x).max(axis=1)"),  # the lecture's per-tensor scale
             ("q8.astype(np.int32) @ k8.astype(np.int32).T", "q8.astype(np.int16) @ k8.astype(np.int16).T"),  # int16 overflows
             ("q8.astype(np.int32) @ k8.astype(np.int32).T",
              "(q8.astype(np.float32) @ k8.astype(np.float32).T).astype(np.int32)"),  # float32 rounds past 2^24
             ("np.rint(x / scale[:, None])", "np.trunc(x / scale[:, None])"),                 # truncates instead of rounding
             ("scale = np.where(amax > 0, amax / 127, 1.0)", "scale = amax / 127 + 1e-300")],  # a zero row's scale not 1
    "15.2": [("(1 << step >> 1)) >> step", "0) >> step"),                                    # the lecture's truncation
             ("n = (neg >> FRAC) + (index >> lut_bits)", "n = neg >> FRAC"),                  # the carry into n forgotten
             ("index &= (1 << lut_bits) - 1", "index = np.minimum(index, (1 << lut_bits) - 1)")],  # clamped, not carried
    "15.3": [("return qkvo + 4 * s_bytes + nq * nk", "return qkvo + 2 * s_bytes + nq * nk"),  # S counted once each way
             ("return qkvo + 4 * s_bytes + nq * nk", "return qkvo + 4 * s_bytes"),            # the mask itself forgotten
             ("sees_up_to = last_row + offset", "sees_up_to = last_row"),                     # top-left alignment
             ("kv += 2 * (min(c0 + bc, nk) - c0) * d * 4", "kv += 2 * bc * d * 4")],          # tails read whole
    "15.4": [("chunks = math.ceil(d / lanes)", "chunks = d // lanes"),                         # the tail chunk dropped
             ("int(math.log2(lanes)) + 1", "1 + 1"),                                           # the reduction as one instruction
             ("return score_instructions(br, bc, d, 1) / score_instructions(br, bc, d, lanes)",
              "return float(lanes)")],                                                         # "L lanes: L times"
    "15.5": [("comp_end[j - buffers] if j >= buffers else 0.0   # the tile",
              "comp_end[j - buffers - 1] if j > buffers else 0.0   # the tile"),               # the colleague's bug itself
             ("comp_end[j - buffers] if j >= buffers else 0.0   # the tile",
              "comp_end[j - 1] if j >= 1 else 0.0   # the tile"),  # always waits: one buffer's schedule
             ("comp_start[j] = max(load_end[j], unit_free[u])", "comp_start[j] = load_end[j]"),  # compute overlaps itself
             ("u = j % units ", "u = 0         "),                                         # the second unit never used
             ("    return 1 + next(b for b, total in enumerate(totals) if total <= 1.03 * min(totals))",
              "    return 2"),                                                                      # double buffering always
             ("    return 1 + next(b for b, total in enumerate(totals) if total <= 1.03 * min(totals))",
              "    return 1 + int(np.argmin(totals))"),                                            # the fastest, not the fewest
             ("    return 1 + next(b for b, total in enumerate(totals) if total <= 1.03 * min(totals))",
              "    return max_buffers"),                                                          # as many as allowed
             ("    return 1 + next(b for b, total in enumerate(totals) if total <= 1.03 * min(totals))",
              "    return 2 * units")],                                                           # double buffering per unit
    "15.6": [("kv = 2 * buffers * bc * d ", "kv = 2 * bc * d "),                               # buffers forgotten
             ("return kv + cores * per_core", "return cores * (kv + per_core)"),                # private, not shared
             ("max(br * bc * (4 + 1), br * d)", "br * bc * (4 + 1) + br * d"),                  # the epilogue beside S and P
             ("for c in range(1, cores_in_cluster + 1)", "for c in range(1, cores_in_cluster)")],  # the last core never counted
    "15.7": [("shared = (br * d + 2 * buffers * bc * d) * 2",
              "shared = (br * d + 2 * bc * d) * 2"),                                               # buffers not in the footprint
             ("return shared + state + max(br * bc * (4 + 2), br * d * 2)", "return shared"),      # a GPU's view: shared only
             ("load, comp = 2 * transfer(bc * d * 2)", "load, comp = transfer(2 * bc * d * 2)"),  # K and V as one transfer
             ("body = tiles * (load + comp) if buffers == 1 else",
              "body = tiles * max(load, comp) if buffers == 1 else"),                             # one buffer overlaps
             ("key=lambda o: (npu_time(npu, *o), npu_footprint(o[0], o[1], npu[\"head_dim\"], o[2]))",
              "key=lambda o: npu_footprint(o[0], o[1], npu[\"head_dim\"], o[2])"),                  # the smallest tile: "it fits"
             ("for b in (1, 2, 3)\n", "for b in (1,)\n")],                                          # no double buffering
}
test_the_solution_passes_on_every_salt, test_a_plausible_wrong_answer_fails_on_every_salt = \
    salted_check_tests(EXERCISES, WRONG)


def test_the_colleagues_schedule_overwrites_a_buffer_only_when_compute_bound(capsys):
    namespace = EXERCISES.namespace()
    exec(EXERCISES.cells.by_id[BUGGY], namespace)
    out = capsys.readouterr().out
    assert "DMA-bound, 2 buffers: total 26.0 (closed form 26.0), overwritten: []" in out
    assert "overwritten: [2, 3, 4, 5, 6, 7]" in out


def test_15_1_says_by_how_much_an_integer_score_is_off(capsys):
    # "got 5.96021e+07, expected 5.96021e+07" hid an error of 3: the check names the score and the difference
    edit = ("return s32, sq, sk", "return s32 + (np.arange(s32.size).reshape(s32.shape) == 0).astype(np.int32) * 3, sq, sk")
    try:
        run_salted(EXERCISES, "15.1", None, edit, capsys)
    except checks.CheckFailed:
        pass
    out = capsys.readouterr().out
    assert "the first, (0, 0)" in out and "(off by 3)" in out, out

"""The predict-then-measure, find-the-bug and design exercises of sets 01-07 fail on plausible
wrong answers (and pass the solutions).

As in test_exercise_08_checks: each case takes the solution notebook, swaps one answer for a
mistake a learner would make (an edit of the solution's own source), and runs the set's setup,
the cells the exercise builds on, the answer and its check cell in one namespace: the check must
raise CheckFailed and print FAIL.
"""
import pytest

from course_lib import checks

from exercise_checks import ExerciseSet, ExerciseSets, check_tests

SETS = {"1": "01_naive_attention", "2": "02_roofline", "3": "03_tiling_and_sram", "4": "04_online_softmax",
        "5": "05_flash_forward", "6": "06_masks", "7": "07_tails_varlen_bad_input"}
SETUP = {"6": "s06-02"}  # the set's course cell with the imports; "setup" elsewhere
BEFORE = {"3.7": ["ex3-1-answer", "ex3-2-answer", "ex3-4-answer"],  # the design uses the learner's own counts
          "1.4": ["ex1-1-answer", "ex1-2-answer", "ex1-3-answer"],  # gqa_attention builds on naive_attention
          "5.2": ["ex5-1-answer"], "5.4": ["ex5-3-answer"],        # 5.2 calls 5.1's query_tile, 5.4 5.3's fa1_step
          "5.7": ["ex5-6-answer"], "4.6": ["ex4-5-answer"],
          "2.6": ["ex2-5-answer"]}  # smallest_block_q calls 2.5's flash_intensity  # 4.6 merges with 4.5's merge_lse

L4_TILE = "l4_tile = min(fitting, key=lambda t: (fa2_hbm_bytes(8192, 8192, 128, 2, t[0]), tile_shared_bytes(*t, 128, 2)))"
SHARE = "predicted_share = 4 * 2048**2 / (4 * 2048 * 64 + 4 * 2048**2)"
FRACTION = "predicted_work_fraction = tiles_per_side * (tiles_per_side + 1) / 2 / tiles_per_side**2"
CAP_SECOND = "    if softcap > 0:\n        s = softcap * np.tanh(s / softcap)\n    s = np.where(visible, s, -np.inf)\n    m ="

WRONG = {
    "1.4": [("k = np.repeat(k, group, axis=1)  # (B, H, Nk, D): K/V head h // group for query head h\n"
             "    v = np.repeat(v, group, axis=1)",
             "k = np.tile(k, (1, group, 1, 1))  # interleaved: query head h reads K/V head h % Hk\n"
             "    v = np.tile(v, (1, group, 1, 1))")],
    "1.7": [("return 3 * B * H * Nq * Nk * 4", "return 1 * B * H * Nq * Nk * 4"),      # S alone
            ("return 3 * B * H * Nq * Nk * 4", "return 3 * 1 * 4 * 1024 * 1024 * 4"),  # the statement's shape, not the check's
            ("return 3 * B * H * Nq * Nk * 4", "return 3 * B * H * Nq * Nk * 8"),      # float64 bytes
            ("score_sized_arrays = 3", "score_sized_arrays = 1")],
    "1.8": [("scale = 1 / math.sqrt(q.shape[-1])", "scale = 1 / math.sqrt(v.shape[-1])"),  # the bug itself
            ("+ (nk - nq)\n", "\n")],                                           # fixed, and broke the mask
    "2.6": [("flash_intensity(seqlen, head_dim, itemsize, block_q) >= ridge",
             "flash_intensity(seqlen, head_dim, itemsize, block_q) > ridge")],  # "reaches" read as "exceeds"
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
    "4.3": [("O = alpha[:, None] * O + p @ v[j:j + Bc]", "O = O + p @ v[j:j + Bc]"),  # O held against an old max
            ("out = O / np.where(seen, l, 1.0)[:, None]", "out = O"),                     # never divided by l
            ("shift = np.where(np.isneginf(m_new), 0.0, m_new)", "shift = m_new")],       # NaN from -inf - -inf
    "4.4": [("a1, a2 = np.exp2(m1 - shift), np.exp2(m2 - shift)",
             "a1, a2 = np.exp(m1 - shift), np.exp(m2 - shift)"),                          # the base-e merge
            ("shift = np.where(np.isneginf(m), 0.0, m)", "shift = m"),                    # two empty sides: NaN
            ("return m, a1 * l1 + a2 * l2,", "return m, l1 + l2,")],                      # sums against different maxima
    "4.7": [("float16_exp_limit = math.log(65504)", "float16_exp_limit = math.log(3.4028235e38)"),
            ("bfloat16_exp_limit = math.log(3.39e38)", "bfloat16_exp_limit = math.log(65504)")],
    "4.8": [("m_new = np.maximum(m, np.max(s[:, j:j + Bc], axis=-1))",
             "m_new = np.max(s[:, j:j + Bc], axis=-1)"),                              # the bug itself
            ("O = alpha[:, None] * O + p @ v[j:j + Bc]", "O = O + p @ v[j:j + Bc]"),  # fixed, and lost O's rescale
            ("shift = np.where(np.isneginf(m_new), 0.0, m_new)", "shift = m_new")],  # no guard: a row that sees nothing is NaN
    "5.1": [("Oi = np.exp(lse_i - lse_new)[:, None] * Oi + ", "Oi = Oi + "),         # the old keys keep their weight
            ("lse_new = np.logaddexp(lse_i, lse_tile)", "lse_new = np.maximum(lse_i, lse_tile)"),  # a max is not a sum
            ("lse_tile, O_tile = m[:, 0] + np.log(l[:, 0]), P @ v[j0:j1] / l",
             "lse_tile, O_tile = m[:, 0] + np.log(l[:, 0]), P @ v[j0:j1]"),            # the tile's output not normalised
            ("lse_new = np.logaddexp(lse_i, lse_tile)",
             "lse_new = np.log(np.exp(lse_i) + np.exp(lse_tile))"),                   # overflows at scores of 800
            ("for j0 in range(0, Nk, Bc):\n        j1 = min(j0 + Bc, Nk)",
             "for j0 in range(0, Nk, max(1, Nk)):\n        j1 = Nk")],                    # all the keys as one tile
    "5.2": [("k[b, h // group], v[b, h // group]", "k[b, h % k.shape[1]], v[b, h % k.shape[1]]")],  # heads interleaved
    "5.3": [("old_weight = 1.5 * math.exp(2 - 3) / new_l", "old_weight = math.exp(2 - 3)"),  # FA2's alpha: forgot l
            ("old_weight = 1.5 * math.exp(2 - 3) / new_l", "old_weight = 1.5 * math.exp(2 - 3)"),  # not divided again
            ("new_l = 1.5 * math.exp(2 - 3) + 2 * math.exp(3 - 3)", "new_l = 1.5 + 2"),   # sums with different maxima
            ("Oi_new = ((a * li)[:, None] * Oi + b[:, None] * (Pij @ Vj)) / li_new[:, None]",
             "Oi_new = (a[:, None] * Oi + b[:, None] * (Pij @ Vj)) / li_new[:, None]")],   # old O not un-divided
    "5.4": [("li = np.ones(rows.stop - rows.start)", "li = np.zeros(rows.stop - rows.start)"),  # the old keys dropped
            ("O[b, h, rows], lse[b, h, rows] = Oi, mi + np.log(li)", "O[b, h, rows], lse[b, h, rows] = Oi, mi")],  # lse is not m
    "5.7": [("predicted_ratio = fa2_hbm_bytes(1, 1, 1024, 1024, 128, 128, 32, 8) / naive_bytes", "predicted_ratio = 0.5"),
            ("4 * 1024 * 1024) * 8", "2 * 1024 * 1024) * 8"),                  # P forgotten in naive's count
            ("br, 8) < naive_bytes)", "br, 8) > naive_bytes)")],
    "5.8": [("for i in range(0, Nq, Br):", "for i in range(0, Nq - Br + 1, Br):"),  # the bug itself
            ("for i in range(0, Nq, Br):", "for i in range(0, Nq - Br, Br):")],
    "6.3": [("visible &= j >= centre - left", "visible &= j > centre - left"),    # left keys before, not left - 1
            ("centre = np.arange(Nq)[:, None] + (Nk - Nq)", "centre = np.arange(Nq)[:, None]")],  # top-left window
    "6.6": [("    S = np.where(visible, S, -np.inf)\n", ""),                           # the mask forgotten
            ("    if softcap > 0:\n        S = softcap * np.tanh(S / softcap)\n    if slopes is not None:\n"
             "        distance = np.abs(np.arange(Nq)[:, None] + (Nk - Nq) - np.arange(Nk)[None, :])\n"
             "        S = S - np.asarray(slopes)[:, None, None] * distance\n",
             "    if slopes is not None:\n"
             "        distance = np.abs(np.arange(Nq)[:, None] + (Nk - Nq) - np.arange(Nk)[None, :])\n"
             "        S = S - np.asarray(slopes)[:, None, None] * distance\n"
             "    if softcap > 0:\n        S = softcap * np.tanh(S / softcap)\n"),  # ALiBi before the cap
            ("    if softcap > 0:\n        S = softcap * np.tanh(S / softcap)\n", ""),  # the cap forgotten
            ("m = S.max(axis=-1, keepdims=True, initial=-np.inf)\n    P = np.exp(S - np.where(np.isneginf(m), 0, m))",
             "m = S.max(axis=-1, keepdims=True, initial=-np.inf)\n    P = np.exp(S - m)")],  # NaN where a row sees nothing
    "6.7": [(FRACTION, "predicted_work_fraction = 0.5"),                        # "causal is half"
            ("partial_tiles = tiles_per_side ", "partial_tiles = 0 ")],
    "6.8": [("s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])  # the fix",
             "s = q @ np.swapaxes(k, -1, -2)  # the fix"),                  # the bug itself: the raw score capped...
            ("    s = np.where(visible, s, -np.inf)\n    m =", "    m ="),  # ...or the mask forgotten
            (CAP_SECOND, "    s = np.where(visible, s, -np.inf)\n    if softcap > 0:\n"
                         "        s = softcap * np.tanh(s / softcap)\n    m =")],  # masked, then capped: hidden keys come back
    "7.7": [("offset = nk - nq  #", "offset = (cu_k[-1] - cu_k[0]) - (cu_q[-1] - cu_q[0])  #"),  # the bug itself
            ("offset = nk - nq  #", "offset = 0  #")],                           # top-left in every sequence
    "7.8": [("return 3 * H * max(lengths)**2 * 4", "return 3 * H * sum(n**2 for n in lengths) * 4"),  # the sum of N^2
            ("return 3 * H * max(lengths)**2 * 4", "return 3 * 2 * 700**2 * 4"),  # the statement's batch, not the check's
            ("return padded_peak / packed_peak_bytes(lengths, H)",
             "return len(lengths) * max(lengths)**2 / sum(n**2 for n in lengths)"),  # packed as the sum of N^2
            ("return padded_peak / packed_peak_bytes(lengths, H)", "return 5.0")],  # the statement's five sequences
}
# each case runs its set's setup again: a case leaves nothing behind for the next
EXERCISES = ExerciseSets({key: ExerciseSet(name, setup=[SETUP.get(key, "setup")], before=BEFORE, fresh=True)
                          for key, name in SETS.items()})
test_the_solution_passes_its_check, test_a_plausible_wrong_answer_fails_its_check = check_tests(EXERCISES, WRONG)


@pytest.mark.parametrize("edit, first_visit", [(WRONG["5.4"][0], False), (WRONG["5.4"][1], True)])
def test_a_wrong_fa1_is_told_which_of_lse_and_o_is_off_and_when(edit, first_visit, capsys):
    with pytest.raises(checks.CheckFailed):
        EXERCISES.run("5.4", edit)
    out = capsys.readouterr().out
    assert "lse (your state's l and m together) is off" in out
    assert ("it is already off: look at the first visit" in out) == first_visit
    assert ("it goes wrong from the second visit on" in out) == (not first_visit)


def test_a_wrong_tile_class_is_named_not_coded(capsys):
    with pytest.raises(checks.CheckFailed):
        EXERCISES.run("6.4", ('return "full"', 'return "partial"'))
    assert "you said 'partial', the mask makes it 'full'" in capsys.readouterr().out


def test_split_kv_reads_outside_the_chunks_are_named(capsys):
    with pytest.raises(checks.CheckFailed):
        EXERCISES.run("4.6", ("for keys in np.array_split(np.arange(k.shape[1]), n_splits):",
                              "for keys in np.array_split(np.arange(k.shape[1]), n_splits + 1):"))
    assert "K read in key ranges [j0, j1) that are no chunk of np.array_split" in capsys.readouterr().out

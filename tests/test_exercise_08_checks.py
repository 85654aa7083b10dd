"""Exercise set 08's checks fail on plausible wrong answers (and pass the solutions).

Each case takes the solution notebook, swaps one answer for a mistake a learner
would make, and runs the setup, the answer and its check cell in one namespace:
the check must raise CheckFailed.  The mistakes are edits of the solution's own
source, so each differs from a right answer in exactly the way named."""
from exercise_checks import ExerciseSet, check_tests

BUGGY = "s08-19"  # 8.5's given cell: the colleague's kernel and run_plan
# the setup runs once: its compiled rules are compiled once for every case
EXERCISES = ExerciseSet("08_numba_cpu", setup=["setup-answers", "s08-02"], before={"8.5": [BUGGY]})

WRONG = {
    "8.1": [("total += last_row // Bc + 1", "total += r0 // Br + 1"),            # Tr (Tr + 1) / 2: square tiles only
            ("return all_tiles / causal_tiles(N, Br, Bc)", "return 2.0"),        # "causal is half"
            # right on the six printed cases only:
            ("total += last_row // Bc + 1", "total += (last_row // Bc + 1) if N in (4096, 1000, 37, 1, 130, 300) else 0")],
    "8.2": [("return -np.inf                      # masked", "pass                      # masked"),  # forgot the mask
            ("return s - slope * abs(centre - j)", "return s + slope * abs(centre - j)"),
            ("s = cap * math.tanh(s / cap)", "s = math.tanh(s / cap)")],
    "8.3": [("l = alpha * l + p", "l = l + p"),                                  # no rescale of the sum
            ("return o / l, m + math.log(l)", "return o / l, m + math.log(l) if l > 0 else -np.inf"),  # NaN says "saw nothing"
            ("o[e] = alpha * o[e] + p * v[j, e]", "o[e] = o[e] + p * v[j, e]")],     # no rescale of the output
    "8.4": [("return np.where(z % 2 == 0, z // 2, n_tiles - 1 - z // 2)", "return z"),
            ("return np.where(z % 2 == 0, z // 2, n_tiles - 1 - z // 2)", "return z[::-1]")],
    "8.5": [("item // Tr % H, item % Tr   # the fix", "item % H, item % Tr   # the fix"),  # the colleague's bug itself
            ("item // Tr % H, item % Tr   # the fix", "item // Tr % H, item // H % Tr   # the fix"),  # h and t from two orders
            ("l[r] = alpha * l[r] + row_sum", "l[r] = l[r] + row_sum")],          # fixed, and broke the rescale
    "8.6": [("if kind == 1 and (", "if ("),                                      # re-derives the mask itself
            ("if kind == 1 and (", "if kind == -1 and ("),                       # never masks
            ("c0, kind = tile_cols[x] * Bc, tile_kinds[x]",
             "c0, kind = (x - row_start[t]) * Bc, tile_kinds[x]"),               # the list's position taken for the column
            ("for x in range(row_start[t], row_start[t + 1]):",
             "for x in range(row_start[t], row_start[t + 1] - 1):")],            # the last tile dropped
    "8.7": [("return shared + state + max(inner, epilogue)", "return shared"),           # a GPU's view: only "shared" counts
            ("2 * 2 * bc * d", "2 * bc * d"),                                             # double buffering forgotten
            ("key=lambda t: (npu_traffic(t[0]), npu_footprint(*t))", "key=lambda t: npu_footprint(*t)"),  # smallest, not cheapest
            ("return shared + state + max(inner, epilogue)",
             "return shared + state + inner + epilogue"),                                    # the epilogue counted alongside
            (" + 4 * n   # Q;", "   # Q;"),                                                  # lse forgotten in the traffic
            ("npu_dram_bytes = npu_traffic(npu_tile[0])", "npu_dram_bytes = npu_traffic(npu_tile[1])")],  # Bc taken for Br
}
test_the_solution_passes_its_check, test_a_plausible_wrong_answer_fails_its_check = check_tests(EXERCISES, WRONG)

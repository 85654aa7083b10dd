"""Exercise set 10's checks fail on plausible wrong answers (and pass the solutions).

Each case takes the solution notebook, swaps one answer for a mistake a learner
would make, and runs the setup, the answer and its check cell in one namespace:
the check must raise CheckFailed.  Where the mistake is a race, an access out of
bounds or a barrier, the FAIL line must be cudacheck's: the prefetching kernel
must not pass, or fail only on its numbers, by luck."""
from exercise_checks import ExerciseSet, check_tests

CUDACHECK = "cudacheck found"   # what cuda_check prints when cudacheck flags a kernel
# the cells an exercise builds on: 10.1 measures the course's tile kernel; 10.7 uses 10.1's and 10.2's answers
BEFORE = {"10.1": ["s10-05"], "10.7": ["s10-06", "s10-11"]}
# the setup runs once (numba is already imported here; cudacheck runs either kind of kernel)
EXERCISES = ExerciseSet("10_gpu_performance", setup=["setup-answers", "s10-03"], before=BEFORE)


# (exercise, (old, new), True when cudacheck must be the one to fail it)
WRONG = {
    "10.1": [(("return threads * (D * (rm + rn) + Bc * (rm + re))", "return threads * D * (rm + rn)"), False),  # S = QK^T only
             (("rm, rn, re = Br // ty, Bc // tx, -(-Dv // tx)", "rm, rn, re = Br // ty, Bc // tx, Dv // tx"),
              False),                                                                 # R_E rounded down
             (("return threads * (D * (rm + rn) + Bc * (rm + re))", "return D * (rm + rn) + Bc * (rm + re)"),
              False),                                                                 # one thread's, not the block's
             (("/ (Br * Bc * (D + Dv))", "/ (Br * Bc * D)"), False),                 # FMAs of one matmul
             (("return shared_reads(Br, Bc, threads, tx, D, Dv) / (Br * Bc * (D + Dv))",
               "return 1 / (Br // (threads // tx)) + 1 / (Bc // tx)"), False)],      # the lecture's 1/RM + 1/RN
    "10.2": [(("max(Bc * dp, Br * bp)", "Bc * dp + Br * bp"), False),                 # P given its own region
             (("dp, bp, ep = D + pad, Bc + pad,", "dp, bp, ep = D + pad, Bc,"), False),  # P's rows unpadded
             (("tx * -(-Dv // tx)\n", "Dv\n"), False),                                # V rows Dv wide
             ((" + Bc * ep + Br * tx", " + Bc * ep"), False)],                        # the row-max exchange left out
    "10.3": [(('per_warp = -(-regs * 32 // sm["reg_unit"]) * sm["reg_unit"]', "per_warp = regs * 32"), False),  # no rounding
             (('(shared + sm["reserved_per_block"])', "shared"), False),              # the runtime's reserve left out
             (("return limits[limiter] * warps, limiter", "return limits[limiter], limiter"), False),  # blocks, not warps
             (('    limits = {"warps": sm["max_threads"] // 32 // warps,\n'
               '              "registers": sm["regs_per_sm"] // (per_warp * warps),',
               '    limits = {"registers": sm["regs_per_sm"] // (per_warp * warps),\n'
               '              "warps": sm["max_threads"] // 32 // warps,'),
              False),                                                                 # ties broken the other way
             (('    if regs > sm["max_regs_per_thread"]:\n        limits["registers"] = 0\n',
               ""), False)],                                                          # 300 registers allowed
    "10.4": [(("        cuda.syncthreads()                       # everyone has read tile t before it is overwritten\n", ""),
              True),                                                                  # the colleague's race
             (("if k + ty < K and col < N else", "if k + ty < K else"), True),        # the colleague's column tail
             (("        cuda.syncthreads()                       # tile t complete\n", ""), True),   # the first barrier gone
             (("        As[ty, tx] = a_next\n        Bs[ty, tx] = b_next\n",
               "        As[ty, tx] = a_next\n        Bs[ty, tx] = b_next\n        cuda.syncthreads()\n"), False)],  # 3 a tile
    "10.5": [(("d, re, per_load = record[\"D\"], -(-record[\"head_dim_v\"] // t[\"tx\"]), 1",
               "d, re, per_load = record[\"D\"], -(-record[\"head_dim_v\"] // t[\"tx\"]), 4"), False),  # scalar as vec
             (("            per_load = 4\n", "            per_load = 1\n"), False),      # 16-byte loads as scalar
             (("peak_tflops * min(1.0, fmas / (fma_per_load * loads))", "peak_tflops * fmas / (fma_per_load * loads)"),
              False),                                                                 # above the FMA peak
             (("fmas / (fma_per_load * loads)", "fmas / (4 * loads)"), False),        # the H200's 4 hard-coded
             (("fmas, loads = 1, 1", "fmas, loads = 4, 1"), False)],                  # row at the FMA peak
    "10.6": [(("        last = min(N, i0 + Br) - 1", "        last = i0 + Br - 1"), False),   # the short last tile ignored
             (("    total = 0\n    for i0", "    T = -(-N // Br)\n    return T * (T + 1) // 2\n    total = 0\n    for i0"),
              False),                                                                 # as if Br == Bc
             (("    return (-(-N // Br)) * (-(-N // Bc)) / causal_tiles(N, Br, Bc)", "    return 2.0"), False),  # always 2x
             (("        total += last // Bc + 1", "        total += last // Bc"), False)],  # the diagonal tile left out
    "10.7": [(("                    if live_floats(Br, Bc, threads, tx) > budget:\n                        continue\n", ""),
              False),                                                                 # the budget ignored
             (("return rm * rn + rm * re + rm + rn + re + 2 * rm", "return rm * rn + rm + rn + re + 2 * rm"),
              False),                                                                 # O's accumulators forgotten
             (("    cost, Br, Bc, threads, tx = best\n",
               "    cost, Br, Bc, threads, tx = best\n    Br, Bc, threads, tx = 64, 32, 128, 8\n"
               "    cost = loads_per_fma(Br, Bc, threads, tx, D, Dv)\n"), False),    # the lecture's tiling, always
             (("if best is None or cost < best[0]:", "if best is None or cost > best[0]:"), False)],  # the most loads
}
test_the_solution_passes_its_check, test_a_plausible_wrong_answer_fails_its_check = \
    check_tests(EXERCISES, WRONG, flagged_prints=CUDACHECK)

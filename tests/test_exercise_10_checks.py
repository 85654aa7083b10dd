"""Exercise set 10's checks fail on plausible wrong answers (and pass the solutions).

Each case takes the solution notebook, swaps one answer for a mistake a learner
would make, and runs the setup, the answer and its check cell in one namespace:
the check must raise CheckFailed.  Where the mistake is a race, an access out of
bounds or a barrier, the FAIL line must be cudacheck's: the prefetching kernel
must not pass, or fail only on its numbers, by luck.  Every case runs on the
published inputs and on every salt the tests sweep (exercise_salts.SALTS)."""
import pytest

from course_lib import checks

from exercise_checks import ExerciseSet
from exercise_salts import run_salted, salted_check_tests

CUDACHECK = "cudacheck found"   # what cuda_check prints when cudacheck flags a kernel
# the cells an exercise builds on: 10.1 measures the course's tile kernel; 10.7 uses 10.1's and 10.2's answers
BEFORE = {"10.1": ["s10-05"], "10.7": ["s10-06", "s10-11"]}
# the setup runs once (numba is already imported here; cudacheck runs either kind of kernel)
EXERCISES = ExerciseSet("10_gpu_performance", setup=["setup-answers", "s10-03"], before=BEFORE)

# 10.4's kernel body, and two that do not prefetch: one barrier a tile (double-buffered, each tile
# loaded after the FMAs of the one before), and chapter 09's naive kernel with no shared memory
_SOURCE = EXERCISES.cells.by_id["s10-18"]
KERNEL_10_4 = _SOURCE[_SOURCE.index("    ### BEGIN SOLUTION\n"):_SOURCE.index("    ### END SOLUTION")]
NO_PREFETCH_10_4 = """    As = cuda.shared.array((2, TILE, TILE), float32)
    Bs = cuda.shared.array((2, TILE, TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row, col = cuda.blockIdx.y * TILE + ty, cuda.blockIdx.x * TILE + tx
    M, K, N = A.shape[0], A.shape[1], B.shape[1]
    acc = float32(0.0)
    for t in range((K + TILE - 1) // TILE):
        cur, k = t % 2, t * TILE
        As[cur, ty, tx] = A[row, k + tx] if row < M and k + tx < K else float32(0.0)
        Bs[cur, ty, tx] = B[k + ty, col] if k + ty < K and col < N else float32(0.0)
        cuda.syncthreads()
        for kk in range(TILE):
            acc += As[cur, ty, kk] * Bs[cur, kk, tx]
    if row < M and col < N:
        C[row, col] = acc
"""
NAIVE_10_4 = """    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row, col = cuda.blockIdx.y * TILE + ty, cuda.blockIdx.x * TILE + tx
    if row < A.shape[0] and col < B.shape[1]:
        acc = float32(0.0)
        for kk in range(A.shape[1]):
            acc += A[row, kk] * B[kk, col]
        C[row, col] = acc
"""
STORES_10_4 = ("        As[1 - cur, ty, tx] = a_next             # the buffer tile t - 1 used, read before this trip's barrier\n"
               "        Bs[1 - cur, ty, tx] = b_next\n")


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
               ""), False),                                                           # 300 registers allowed
             (('    if shared > sm["smem_per_block"]:\n        limits["shared"] = 0\n',
               '    if shared > sm["smem_per_block"]:\n        return 0, "shared"\n'), False)],  # both broken: shared
    "10.4": [((STORES_10_4, "        As[cur, ty, tx] = a_next\n        Bs[cur, ty, tx] = b_next\n"), True),  # the race
             (("if k + ty < K and col < N else", "if k + ty < K else"), True),        # the colleague's column tail
             (("        cuda.syncthreads()                       # tile t complete; everyone is done reading tile t - 1\n",
               ""), True),                                                            # no barrier at all
             ((STORES_10_4, "        cuda.syncthreads()\n" + STORES_10_4), False),   # the report's advice: 2 a tile
             ((STORES_10_4, "        cuda.syncthreads()\n        As[cur, ty, tx] = a_next\n        Bs[cur, ty, tx] = b_next\n"),
              False),                                                                 # the advice on one buffer
             ((KERNEL_10_4, "    ### BEGIN SOLUTION\n" + NO_PREFETCH_10_4), False),  # one barrier a tile, no prefetch
             ((KERNEL_10_4, "    ### BEGIN SOLUTION\n" + NAIVE_10_4), False)],      # no tiles at all
    "10.5": [(("d, re, per_load = record[\"D\"], -(-record[\"head_dim_v\"] // t[\"tx\"]), 1",
               "d, re, per_load = record[\"D\"], -(-record[\"head_dim_v\"] // t[\"tx\"]), 4"), False),  # scalar as vec
             (("            per_load = 4\n", "            per_load = 1\n"), False),      # 16-byte loads as scalar
             (("peak_tflops * min(1.0, fmas / (fma_per_load * loads))", "peak_tflops * fmas / (fma_per_load * loads)"),
              False),                                                                 # above the FMA peak
             (("fmas / (fma_per_load * loads)", "fmas / (4 * loads)"), False),        # the H200's 4 hard-coded
             (("fmas, loads = 1, 1", "fmas, loads = 4, 1"), False),                  # row at the FMA peak
             (("d = -(-record[\"D\"] // 4) * 4", "d = record[\"D\"]"), False),       # D not rounded up to 4
             (("fmas = rm * rn * d + rm * re * t[\"Bc\"]", "fmas = rm * rn * record[\"D\"] + rm * re * t[\"Bc\"]"),
              False)],                                                                # FMAs of the unpadded D
    "10.6": [(("        last = min(Nq, i0 + Br) - 1 + Nk - Nq", "        last = i0 + Br - 1 + Nk - Nq"), False),  # short tile
             (("    total = 0\n    for i0", "    T = -(-Nq // Br)\n    return T * (T + 1) // 2\n    total = 0\n    for i0"),
              False),                                                                 # as if Br == Bc and Nq == Nk
             (("    return (-(-Nq // Br)) * (-(-Nk // Bc)) / causal_tiles(Nq, Nk, Br, Bc)", "    return 2.0"), False),
             (("            total += last // Bc + 1", "            total += last // Bc"), False),  # the diagonal tile
             (("min(Nq, i0 + Br) - 1 + Nk - Nq", "min(Nq, i0 + Br) - 1"), False),     # top-left alignment
             (("        if last >= 0:                           # else no row of the tile sees a key\n"
               "            total += last // Bc + 1",
               "        total += max(last, 0) // Bc + 1"), False)],                   # a tile for rows that see nothing
    "10.7": [(("                    if live_floats(Br, Bc, threads, tx) > budget:\n                        continue\n", ""),
              False),                                                                 # the budget ignored
             (("return rm * rn + rm * re + rm + rn + re + 2 * rm", "return rm * rn + rm + rn + re + 2 * rm"),
              False),                                                                 # O's accumulators forgotten
             (("    cost, Br, Bc, threads, tx = best\n",
               "    cost, Br, Bc, threads, tx = best\n    Br, Bc, threads, tx = 64, 32, 128, 8\n"
               "    cost = loads_per_fma(Br, Bc, threads, tx, D, Dv)\n"), False),    # the lecture's tiling, always
             (("if best is None or cost < best[0]:", "if best is None or cost > best[0]:"), False),  # the most loads
             (("                    if tiled_shared_bytes(Br, Bc, threads, tx, 1, D, Dv) > max_shared:\n"
               "                        continue\n", ""), False)],                     # shared memory ignored
}
test_the_solution_passes_on_every_salt, test_a_plausible_wrong_answer_fails_on_every_salt = \
    salted_check_tests(EXERCISES, {exercise: [edit for edit, _ in edits] for exercise, edits in WRONG.items()})
FLAGGED = [(exercise, edit) for exercise, edits in WRONG.items() for edit, flagged in edits if flagged]


@pytest.mark.parametrize("exercise,edit", FLAGGED, ids=[f"{e}-{i}" for i, (e, _) in enumerate(FLAGGED)])
def test_a_race_or_an_access_out_of_bounds_is_failed_by_cudacheck(exercise, edit, capsys):
    with pytest.raises(checks.CheckFailed):
        run_salted(EXERCISES, exercise, None, edit, capsys)
    assert CUDACHECK in capsys.readouterr().out

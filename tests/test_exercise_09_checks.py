"""Exercise set 09's checks fail on plausible wrong answers (and pass the solutions).

Each case takes the solution notebook, swaps one answer for a mistake a learner
would make, and runs the setup, the answer and its check cell in one namespace:
the check must raise CheckFailed.  Where the mistake is a race, a barrier that
not every thread reaches or an access out of bounds, the FAIL line must be
cudacheck's: a kernel must not pass, or fail only on its numbers, by luck."""
from exercise_checks import ExerciseSet, check_tests

CUDACHECK = "cudacheck found"   # what cuda_check prints when cudacheck flags a kernel
BEFORE = {"9.8": ["s09-28"]}  # the two kernels of chapter 09 that 9.8's check measures
# the setup runs once (numba is already imported here; cudacheck runs either kind of kernel)
EXERCISES = ExerciseSet("09_numba_cuda", setup=["setup-answers", "s09-03"], before=BEFORE)


# (exercise, (old, new), True when cudacheck must be the one to fail it)
WRONG = {
    "9.1": [(("c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x\n"
              "    r = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y",
              "r = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x\n"
              "    c = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y"),
             False),                                                                  # x taken as the row axis
            (("if r < x.shape[0] and c < x.shape[1]:", "if r < x.shape[0]:"), True),  # one tail guarded
            (("out[r, c] = 2 * x[r, c] + c", "out[r, c] = 2 * x[r, c] + r"), False)],
    "9.2": [(("    cuda.syncthreads()\n", "\n"), True),                                 # no barrier after the load
            (("for x in range(t, n_c * D, cuda.blockDim.x):", "for x in range(t, BC * D, cuda.blockDim.x):"),
             True),                                                                   # no tail: reads past Nk
            (("KjT[x % D, x // D] = k[c0 + x // D, x % D]", "KjT[x % DMAX, x // DMAX] = k[c0 + x // DMAX, x % DMAX]"),
             True),                                                                  # the padded width as the stride
            (("KjT[x % D, x // D] =", "KjT[x // D, x % D] ="), True),               # stored as read: not transposed
            (("for x in range(t, n_c * D, cuda.blockDim.x):\n        KjT[x % D, x // D] = k[c0 + x // D, x % D]",
              "for x in range(t, n_c * D, cuda.blockDim.x):\n        KjT[x % D, x // D] = k[c0 + x // D, x % D]\n"
              "    for x in range(t, n_c * D, cuda.blockDim.x):\n        KjT[x % D, x // D] = k[c0 + x // D, x % D]"),
             False)],                                                                 # every element read twice
    "9.3": [(("        cuda.syncthreads()                 # everyone has read it before the next load\n", ""),
             True),                                                                   # the second barrier missing
            (("        cuda.syncthreads()                 # the tile is complete before anyone reads it\n", ""),
             True),                                                                   # the first one missing
            (("        cuda.syncthreads()                 # the tile is complete before anyone reads it\n",
              "        cuda.syncthreads()\n        cuda.syncthreads()\n"), False)],     # one barrier too many
    "9.4": [(("            if s == -math.inf:\n"
              "                continue                           # a hidden key changes nothing (and -inf - -inf is NaN)\n",
              ""),
             False),                                                                  # no guard: NaN on hidden keys
            (("new = hi + math.log(math.exp(lse_i - hi) + math.exp(s - hi))", "new = math.log(math.exp(lse_i) + math.exp(s))"),
             False),                                                                  # e^100 overflows float32
            (("o[e] = keep * o[e] + add * V[j, e]", "o[e] = o[e] + add * V[j, e]"), False),  # the old average not reweighted
            (("keep, add = math.exp(lse_i - new), math.exp(s - new)", "keep, add = float32(1.0), math.exp(s - new)"),
             False)],                                                                 # the old average kept whole
    "9.5": [(("            l *= alpha\n", ""), False),                                 # l not rescaled
            (("for c in range(n_c):\n                p = math.exp", "for c in range(BK):\n                p = math.exp"),
             False),                                                                   # past the tail: stale scores
            (("p = math.exp(s_i[c] - m_new)", "p = math.exp(s_i[c] - m)"), False)],   # the old max
    "9.6": [(("        if kind == EMPTY:                  # the whole block skips it, nothing loaded\n"
              "            continue\n", ""), False),                                   # never skips: reads everything
            (("masked = kind == PARTIAL and j > i + offset", "masked = False"), False),      # never masks
            (("masked = kind == PARTIAL and j > i + offset",
              "masked = kind == PARTIAL and j > i"), False),                                 # top-left, not bottom-right
            (("masked = kind == PARTIAL and j > i + offset", "masked = kind != FULL and j >= i + offset"), False)],  # off by one
    "9.7": [(("    acc = float32(0.0)\n    for t in",
              "    if row >= M or col >= N:\n        return\n    acc = float32(0.0)\n    for t in"),
             True),                                                                   # the colleague's early return
            (("As[ty, tx] = A[row, k + tx] if row < M and k + tx < K else float32(0.0)",
              "if row < M and k + tx < K:\n            As[ty, tx] = A[row, k + tx]"), False),  # no zeros past the edge
            (("    if row < M and col < N:                    # guard the store, not the barriers\n        C[row, col] = acc",
              "    C[row, col] = acc"), True)],                                       # the store unguarded
    "9.8": [(("return Nq * Nk * D                       # each of", "return 16 * math.ceil(Nq / 16) * Nk * D  # each of"),
             False),                                                                  # counts the threads past row Nq
            (("return math.ceil(Nq / 16) * Nk * D", "return Nq * Nk * D // 16"), False),  # Br times fewer, the tail forgotten
            (("return math.ceil(Nq / 16) * Nk * D", "return Nk * D"), False),           # K read once in all
            (("return math.ceil(Nq / 16) * Nk * D", "return 3 * 24 * 8"), False),       # the statement's launch, not the check's
            (("return Nq * Nk * D                       # q[h", "return Nq * D  # q[h"), False)],  # q read once per row
}
test_the_solution_passes_its_check, test_a_plausible_wrong_answer_fails_its_check = \
    check_tests(EXERCISES, WRONG, flagged_prints=CUDACHECK)

"""Exercise set 11's checks fail on plausible wrong answers (and pass the solutions).

Each case takes the solution notebook, swaps one answer for a mistake a learner
would make (an edit of the solution's own source), and runs the setup, the
cells the exercise builds on, the answer and its check in one namespace: the
check must raise CheckFailed, on the published inputs and on every salt the tests sweep
(exercise_salts.SALTS)."""
from exercise_checks import ExerciseSet
from exercise_salts import salted_check_tests

BEFORE = {"11.6": ["s11-22"], "11.8": ["s11-04", "s11-18", "s11-29"]}  # the course cells and earlier answers used
EXERCISES = ExerciseSet("11_low_precision", setup=["setup-answers", "s11-02"], before=BEFORE, fresh=True)
CAST = ("x = np.asarray(x, dtype=np.float64)\n",
        "x = np.asarray(x, dtype=np.float64)\n    return x.astype({4: E4M3, 3: ml_dtypes.float8_e5m2, 8: ml_dtypes.bfloat16}"
        ".get(bits, np.float16)).astype(np.float64)\n")          # ml_dtypes' cast for the format it looks like


WRONG = {
    "11.1": [("amax = per_head.reshape(B, heads_k, Hx // heads_k).max(axis=2)", "amax = per_head[:, :heads_k]"),
             ("amax = per_head.reshape(B, heads_k, Hx // heads_k).max(axis=2)",
              "amax = per_head.reshape(B, Hx // heads_k, heads_k).max(axis=1)"),       # groups taken as h % heads_k
             ("per_head = np.abs(x).max(axis=(2, 3))", "per_head = x.max(axis=(2, 3))"),  # no abs
             ("amax / 448.0", "amax / 240.0"),                                          # e4m3fnuz's max
             ("np.where(amax > 0, amax / 448.0, 1.0)", "(amax / 448.0)")],              # a zero descale
    "11.2": [("np.round(np.ldexp(x, -quantum))", "np.floor(np.ldexp(x, -quantum) + 0.5)"),  # ties away from zero
             ("np.maximum(exponent - bits, min_exponent)", "exponent - bits"),           # no subnormals
             ('np.nan if overflow == "nan" else np.copysign(np.inf, x)', "np.copysign(max_value, x)"),  # saturates
             ("exponent - bits,", "exponent - bits + 1,"),                               # one bit short
             CAST],                              # one bit short
    "11.3": [("kv = np.arange(H) // (H // k8.shape[1])", "kv = np.arange(H) % k8.shape[1]"),
             ("d = (q_descale * k_descale)[:, kv] * softmax_scale", "d = q_descale[:, kv] * softmax_scale"),
             ("d = (q_descale * k_descale)[:, kv] * softmax_scale", "d = (q_descale * k_descale)[:, kv]")],
    "11.4": [("return 2.0 ** (1 - bits) * math.sqrt(mean_inverse_square / 12)",
              "return 2.0 ** (1 - bits) * math.sqrt(mean_inverse_square / 12) * math.sqrt(n_keys / 256)"),  # grows
             ("return 2.0 ** (1 - bits) * math.sqrt(mean_inverse_square / 12)",
              "return 2.0 ** (1 - bits) * math.sqrt(mean_inverse_square / 12) / math.sqrt(n_keys / 256)"),  # averages out
             ("return 2.0 ** (1 - bits) * math.sqrt(mean_inverse_square / 12)", "return 2.0 ** (-bits)"),  # half a spacing
             ("return 2.0 ** (1 - bits) * math.sqrt(mean_inverse_square / 12)", "return 2.0 ** (1 - bits)"),
             ("return 2.0 ** (1 - bits) * math.sqrt(mean_inverse_square / 12)",
              "return 2.0 ** (-bits) / math.sqrt(12)"),                                  # the top of the binade's spacing only
             ("return 2.0 ** (1 - bits) * math.sqrt(mean_inverse_square / 12)",
              "return 2.0 ** (1 - bits) / math.sqrt(12)")],                              # the bottom's only
    "11.5": [("s = scale * q @ np.swapaxes(k[:, :, c0:c0 + block_k], -1, -2)   # S stays float32",
              "s = scale * q @ np.swapaxes(k[:, :, c0:c0 + block_k], -1, -2)\n        s = s.astype(E4M3).astype(np.float32)"),
             ("(v8, v_descale)", "(v8, np.ones_like(v_descale))"),                     # v's descale forgotten
             ("O = alpha * O + p8", "O = O + p8"),                                      # no rescale
             ("p8 = p.astype(E4M3).astype(np.float32)", "p8 = p"),                      # P never rounded
             ("l = alpha * l + p.sum(axis=-1, keepdims=True)",
              "l = alpha * l + p.astype(E4M3).astype(np.float32).sum(axis=-1, keepdims=True)")],  # l sums the rounded P
    "11.6": [("last = min(r0 + block_q, nq) - 1 + nk - nq if causal else nk - 1", "last = nk - 1"),  # mask ignored
             ("(min(nk, max(0, i + nk - nq + 1)) if causal else nk)", "nk"),            # every pair converted
             ("min(nk, (last // block_k + 1) * block_k)", "(last + 1)"),                # the diagonal tile in part
             ("- 1 + nk - nq if causal", "- 1 if causal"),                             # top-left alignment
             ("for r0 in range(0, nq, block_q):\n        last = min(r0 + block_q, nq) - 1",
              "for r0 in range(0, nq - block_q + 1, block_q):\n        last = min(r0 + block_q, nq) - 1")],  # short tile dropped
    "11.7": [('"pingpong": max(L / 2, G0 + G1, (G0 + S + G1) / 2)', '"pingpong": G0 + G1'),  # always fully busy
             ('"pingpong": max(L / 2, G0 + G1, (G0 + S + G1) / 2)', '"pingpong": max(G0 + G1, (G0 + S + G1) / 2)'),
             ('"intra": max(L, G0 + max(G1, S))', '"intra": G0 + G1 + S'),
             ('"serial": L + G0 + S + G1', '"serial": G0 + S + G1')],
    "11.8": [('return ("fp8" if predicted <= budget else "fp16"), predicted', 'return "fp8", predicted'),
             ("predicted = 1.5 * float(np.abs(out - exact).max())", "predicted = 0.02"),   # a guess, not a measurement
             ("predicted = 1.5 * float(np.abs(out - exact).max())",
              "predicted = 1.5 * float(np.abs(out - exact).mean())"),                   # the mean, not the max
             ('    if np.any(np.abs(k).max(axis=(2, 3)) >= 464.0 * k_descale):\n        return "fp16", math.inf\n', ""),
             ("predicted = 1.5 * float(np.abs(out - exact).max())", "predicted = budget / 2")],  # read off the budget
}
test_the_solution_passes_on_every_salt, test_a_plausible_wrong_answer_fails_on_every_salt = \
    salted_check_tests(EXERCISES, WRONG)

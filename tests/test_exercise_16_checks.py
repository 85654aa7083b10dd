"""Exercise set 16's checks fail on plausible wrong answers (and pass the solutions).

Each case takes the solution notebook, swaps one answer for a mistake a learner
would make, and runs the setup, the answers it builds on and its check cell in
one namespace: the check must raise CheckFailed, on the published inputs and on every
salt the tests sweep (exercise_salts.SALTS).  The mistakes are edits of the
solution's own source, so each differs from a right answer in exactly the way named."""
from exercise_checks import ExerciseSet
from exercise_salts import salted_check_tests

HELPERS = "s16-02"   # the course's models and the synthetic matrix runs the checks draw
BUILDS_ON = {"16.2": ["16.1"], "16.6": ["16.5"], "16.7": ["16.1"]}   # the earlier answers each one uses
EXERCISES = ExerciseSet("16_evaluation", setup=["setup-answers", HELPERS], before=BUILDS_ON)


WRONG = {
    "16.1": [("first = max(0, r0 - w) // bc", "first = 0"),                                  # no tile skipped
             ("keys = min((last + 1) * bc, n) - first * bc", "keys = (last + 1 - first) * bc"),  # tails read whole
             ("return flops, (2 * n * d + 2 * kv_rows * d) * itemsize",
              "return flops, (2 * n * d + 2 * n * d) * itemsize"),                             # K and V read once
             ("flops += 4 * d * (r1 - r0 + 1) * keys",
              "flops += 4 * d * (r1 - r0 + 1) * min(keys, w + 1)")],                           # visible pairs, not tiles
    "16.2": [("return full / max(flops / peak, nbytes / bandwidth)", "return full_flops / flops"),   # the work ratio alone
             ("return full / max(flops / peak, nbytes / bandwidth)", "return full_bytes / nbytes"),  # the traffic ratio alone
             ("full_bytes = (2 * n * d + 2 * tiles_q * n * d) * itemsize",
              "full_bytes = (2 * n * d + 2 * n * d) * itemsize"),                                    # K, V read once unmasked
             ("return full / max(flops / peak, nbytes / bandwidth)",
              "return max(flops / peak, nbytes / bandwidth) / full")],                               # inverted
    "16.3": [("(2 * n * d + 2 * d) * itemsize", "(n * d + 2 * d) * itemsize"),                        # V forgotten
             ("return 4 * n * d /", "return 2 * n * d /"),                                            # one matmul counted
             ("(2 * n * d + 2 * d) * itemsize", "(2 * n * d) * itemsize")],                           # q and o forgotten
    "16.4": [("r[\"min_ms\"] / o[\"min_ms\"] > 1 + max(0.1, 2 * max(noise(o), noise(r)))",
              "r[\"median_ms\"] / o[\"median_ms\"] > 1.1"),                                           # the colleague's bug
             ("> 1 + max(0.1, 2 * max(noise(o), noise(r)))", "> 1.1"),                                # fastest round, no noise
             ("2 * max(noise(o), noise(r))", "2 * noise(o)"),                                         # the old run's noise only
             ("2 * max(noise(o), noise(r))", "2 * noise(r)"),                                         # the new run's noise only
             ("r[\"min_ms\"] / o[\"min_ms\"] >", "r[\"median_ms\"] / o[\"median_ms\"] >"),  # medians, noise rule
             ("if o is None or shape(o) != shape(r):", "if o is None:"),                             # a key names one bucket
             ("    return sorted(flagged)",
              "    return [max(flagged, key=lambda k: (lambda n, o: n[\"min_ms\"] / o[\"min_ms\"])(\n"
              "        *[{key(x): x for x in run}[k] for run in (new, old)]))] if flagged else []")],   # the one largest ratio
    "16.5": [("(base[\"min_ms\"] / r[\"min_ms\"], base[\"flops\"] / r[\"flops\"])",
              "(base[\"median_ms\"] / r[\"median_ms\"], base[\"flops\"] / r[\"flops\"])"),            # medians: the load's
             ("(base[\"min_ms\"] / r[\"min_ms\"], base[\"flops\"] / r[\"flops\"])",
              "(r[\"min_ms\"] / base[\"min_ms\"], base[\"flops\"] / r[\"flops\"])"),                  # gain inverted
             ("if r[\"mask\"] != \"none\" and base is not None:", "if base is not None:"),           # unmasked records too
             ("base = unmasked.get(key(r, \"none\"))",
              "base = unmasked.get(key(r, \"none\").replace(r[\"dtype\"], \"float32\"))"),           # float32's baseline for all
             ("gains[key(r, r[\"mask\"])] = (base[\"min_ms\"] / r[\"min_ms\"], base[\"flops\"] / r[\"flops\"])",
              "gains[key(r, r[\"mask\"])] = (base[\"min_ms\"] / r[\"min_ms\"], base[\"flops\"] / r[\"flops\"]) "
              "if r[\"dtype\"] == \"float32\" else (1.0, 1.0)")],                   # right for float32 only
    "16.6": [("if path == \"native\" and gain < 0.5 * work:", "if gain < 0.5 * work:"),               # SDPA's window counted
             ("return max(missing, key=missing.get)", "return \"window\""),                           # a guess
             ("return max(missing, key=missing.get)", "return min(missing, key=missing.get)"),       # the mask that skips
             ("    missing = {\"causal\": 0, \"window\": 0}",
              "    fallback_mask.calls = getattr(fallback_mask, \"calls\", 0) + 1\n"
              "    return [\"causal\", \"window\"][fallback_mask.calls % 2]\n"
              "    missing = {\"causal\": 0, \"window\": 0}")],                  # alternates: an order learnt
    "16.7": [("    return min(fits, key=seconds)", "    return max(fits)"),  # the largest tile that fits
             ("    return min(fits, key=seconds)", "    return min(fits)"),                            # the smallest tile
             ("if (2 * br * d + 2 * bc * d) * itemsize + 4 * br * bc <= sram_bytes]",
              "if (2 * br * d + 2 * bc * d) * itemsize <= sram_bytes]")],                             # S's tile forgotten
}
test_the_solution_passes_on_every_salt, test_a_plausible_wrong_answer_fails_on_every_salt = \
    salted_check_tests(EXERCISES, WRONG)


def test_the_colleagues_finder_flags_unchanged_buckets_beside_the_planted_one(capsys):
    namespace = EXERCISES.namespace()
    exec(EXERCISES.cells.by_id["s16-16"], namespace)
    out = capsys.readouterr().out
    assert out.count("the planted slowdown flagged: True") == 2
    assert "a loaded one: the planted slowdown flagged: True; 0 other" not in out

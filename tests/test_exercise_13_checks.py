"""Exercise set 13's checks fail on plausible wrong answers (and pass the solutions).

Each case takes the solution notebook, swaps one answer for a mistake a learner
would make (an edit of the solution's own source), and runs the setup, the
answer and its check cell in one namespace: the check must raise CheckFailed, on the published inputs
and on every salt the tests sweep (exercise_salts.SALTS)."""
from exercise_checks import ExerciseSet
from exercise_salts import run_salted, salted_check_tests

BEFORE = {"13.4": ["s13-buggy"], "13.7": ["s13-buggy-causal"]}
EXERCISES = ExerciseSet("13_inference", setup=["setup-answers", "s13-course"], before=BEFORE, fresh=True)


WRONG = {
    "13.1": [("% cache_k.shape[1]", "% (cache_k.shape[1] + 1)"),                       # slots of W + 1
             ("slots = (n_seen + np.arange(k_new.shape[1]))", "slots = (np.arange(k_new.shape[1]))"),  # forgets n_seen
             ("new_v[:, slots] = v_new", "new_v[:, slots] = k_new")],
    "13.2": [("filled = min(n_seen, W)", "filled = W"),                                  # reads the empty slots
             ("reshape(Hk, H // Hk, D)", "reshape(H // Hk, Hk, D).transpose(1, 0, 2)"),    # head h -> K/V head h % Hk
             ("/ np.sqrt(D)", "/ D")],
    "13.3": [("new_tokens * (new_tokens + 1) // 2", "new_tokens * (new_tokens - 1) // 2"),   # reads before the append
             ("return per_token * (prompt_len + decode)", "return per_token * decode"),        # the prefill forgotten
             ("decode = new_tokens * prompt_len + new_tokens * (new_tokens + 1) // 2",
              "decode = new_tokens * (prompt_len + new_tokens)"),                              # every step the final length
             ("per_token = 2 * n_layers", "per_token = n_layers"),                             # K only
             ("n_kv_heads * head_dim * itemsize", "n_kv_heads * head_dim * 4")],              # float32 always
    "13.4": [("by_slot = k_pool.transpose(0, 2, 1, 3).reshape(num_blocks * bs, Hk, D)",
              "by_slot = k_pool.reshape(num_blocks * bs, Hk, D)"),                        # the colleague's bug
             ("slots = block_table[positions // bs] * bs", "slots = positions // bs * bs"),   # ignores the table
             ("+ positions % bs", "+ positions // bs")],
    "13.5": [("shared = prefix_len // block_size", "shared = -(-prefix_len // block_size)"),   # the partial block shared
             ("shared = prefix_len // block_size", "shared = 0"),                               # no sharing
             ("own = sum(-(-n // block_size) - shared for n in lengths)",
              "own = -(-sum(n - prefix_len for n in lengths) // block_size)"),                 # own tokens packed together
             ("return (shared + own) * block_size * bytes_per_token",
              "return (prefix_len + sum(n - prefix_len for n in lengths)) * bytes_per_token")],  # tokens, not blocks
    "13.6": [("allowed = [2 ** e for e in range(9) if -(-max(lengths) // 2 ** e) <= max_pages]",
              "allowed = [2 ** e for e in range(9)]"),                                     # ignores the tile limit
             ("for n in lengths:", "for n in sorted(lengths):"),                          # shortest first, not first come
             ("used += -(-n // bs) * bs * bytes_per_token", "used += n * bytes_per_token")],  # no rounding up to blocks
    "13.7": [("(j >= p_i - window)", "(j >= i - window)"),                                # the colleague's bug
             ("(j >= p_i - window)", "(j > p_i - window)"),                                # the window one key short
             ("p = np.exp(s - s.max(axis=-1, keepdims=True))", "p = np.exp(s)"),            # no max subtracted: overflows
             ("(j <= p_i) & (j >= p_i - window)", "(j <= i) & (j >= i - window)")],         # top-left, as PyTorch
}
ERRORS = {exercise: (ValueError, IndexError) for exercise in WRONG}   # a wrong slot or head index may raise first
test_the_solution_passes_on_every_salt, test_a_plausible_wrong_answer_fails_on_every_salt = \
    salted_check_tests(EXERCISES, WRONG, errors=ERRORS)


def test_13_4s_drawn_case_fits_its_pool_on_every_salt(capsys):
    # the drawn sequence once needed more blocks than its pool of 12 on about 4% of salts: a correct
    # gather then raised
    for salt in range(300):
        run_salted(EXERCISES, "13.4", salt, capsys=capsys)
        assert "FAIL" not in capsys.readouterr().out, salt

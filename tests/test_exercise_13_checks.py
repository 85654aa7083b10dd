"""Exercise set 13's checks fail on plausible wrong answers (and pass the solutions).

Each case takes the solution notebook, swaps one answer for a mistake a learner
would make (an edit of the solution's own source), and runs the setup, the
answer and its check cell in one namespace: the check must raise CheckFailed."""
from exercise_checks import ExerciseSet, check_tests

BEFORE = {"13.4": ["s13-buggy"], "13.7": ["s13-buggy-causal"]}
EXERCISES = ExerciseSet("13_inference", setup=["setup-answers", "s13-course"], before=BEFORE, fresh=True)


WRONG = {
    "13.1": [("% cache_k.shape[1]", "% (cache_k.shape[1] + 1)"),                       # slots of W + 1
             ("slots = (n_seen + np.arange(k_new.shape[1]))", "slots = (np.arange(k_new.shape[1]))"),  # forgets n_seen
             ("new_v[:, slots] = v_new", "new_v[:, slots] = k_new")],
    "13.2": [("filled = min(n_seen, W)", "filled = W"),                                  # reads the empty slots
             ("reshape(Hk, H // Hk, D)", "reshape(H // Hk, Hk, D).transpose(1, 0, 2)"),    # head h -> K/V head h % Hk
             ("/ np.sqrt(D)", "/ D")],
    "13.3": [("* (n_cached + 1)", "* n_cached"),                                         # before the append
             ("return 2 * n_layers", "return n_layers"),                                 # K only
             ("n_kv_heads * head_dim * itemsize", "n_kv_heads * head_dim * 4")],          # float32 always
    "13.4": [("by_slot = k_pool.transpose(0, 2, 1, 3).reshape(num_blocks * bs, Hk, D)",
              "by_slot = k_pool.reshape(num_blocks * bs, Hk, D)"),                        # the colleague's bug
             ("slots = block_table[positions // bs] * bs", "slots = positions // bs * bs"),   # ignores the table
             ("+ positions % bs", "+ positions // bs")],
    "13.5": [("blocks = sum(-(-n // block_size) for n in lengths)", "blocks = sum(n // block_size for n in lengths)"),
             ("return contiguous, blocks * block_size * bytes_per_token", "return contiguous, sum(lengths) * bytes_per_token"),
             ("contiguous = len(lengths) * max_len * bytes_per_token",
              "contiguous = sum(lengths) * bytes_per_token")],                            # no reservation
    "13.6": [("allowed = [2 ** e for e in range(9) if -(-max(lengths) // 2 ** e) <= max_pages]",
              "allowed = [2 ** e for e in range(9)]"),                                     # ignores the tile limit
             ("for n in lengths:", "for n in sorted(lengths):"),                          # shortest first, not first come
             ("used += -(-n // bs) * bs * bytes_per_token", "used += n * bytes_per_token")],  # no rounding up to blocks
    "13.7": [("j <= i + Nk - Nq", "j <= i"),                                             # the colleague's bug
             ("j <= i + Nk - Nq", "j <= i + Nk - Nq + 1"),
             ("j <= i + Nk - Nq", "j >= i + Nk - Nq")],
}
ERRORS = {exercise: (ValueError, IndexError) for exercise in WRONG}   # a wrong slot or head index may raise first
test_the_solution_passes_its_check, test_a_plausible_wrong_answer_fails_its_check = \
    check_tests(EXERCISES, WRONG, errors=ERRORS)

"""The tensor-core steps (chapter 11's GPU half): what can be checked without a GPU.

The kernels are inline PTX and run on a GPU only; their checks at awkward shapes, the sanitizer runs
and the timings are benchmarks/gpu_mma.py's, committed in notebooks/records/gpu_mma.jsonl (read here).
What the kernel's correctness rests on, and what is checked here on the CPU: the fragment tables (where
each lane's registers sit), the two ways P leaves S's accumulators for P V's A fragment, the host's
conversion of the inputs to words, and the registry / availability rules.
"""
import json
from pathlib import Path

import numpy as np
import pytest

import course_lib
from course_lib import kernels
from course_lib.core import rules
from course_lib.kernels.cuda_steps import mma
from course_lib.kernels.cuda_steps import tensor_core as tc

RECORDS = Path(__file__).resolve().parent.parent / "notebooks" / "records" / "gpu_mma.jsonl"


def spots(table, regs, lanes=32):
    return [table(lane, r) for lane in range(lanes) for r in range(regs)]


@pytest.mark.parametrize("table, regs, shape", [(mma.a_word, 4, (16, 8)), (mma.b_word, 2, (8, 8)),
                                                (mma.c_elem, 4, (16, 8))])
def test_every_element_of_a_fragment_is_held_by_exactly_one_register(table, regs, shape):
    held = spots(table, regs)
    assert sorted(held) == sorted((i, j) for i in range(shape[0]) for j in range(shape[1]))


def emulate_mma(a_regs, b_regs, c_regs):
    """A warp's m16n8k8 as the tables say it is: rebuild A (16 x 8), B (n 8 x k 8), C from the lanes'
    registers, D = A B^T + C, handed back in C's layout."""
    A, B, C = np.zeros((16, 8)), np.zeros((8, 8)), np.zeros((16, 8))
    for lane in range(32):
        for r in range(4):
            A[mma.a_word(lane, r)] = a_regs[lane][r]
            C[mma.c_elem(lane, r)] = c_regs[lane][r]
        for r in range(2):
            B[mma.b_word(lane, r)] = b_regs[lane][r]
    D = A @ B.T + C
    return [[D[mma.c_elem(lane, r)] for r in range(4)] for lane in range(32)]


def test_p_leaves_s_for_p_v_without_a_move_in_halves():
    """HALF_A: the packed C floats of the chunk's two 8-key tiles are exactly A's (row, word) for every
    lane and register; word w of A holds keys 2w and 2w + 1."""
    for lane in range(32):
        for r, (tile, low, high) in enumerate(tc.HALF_A):
            row, word = mma.a_word(lane, r)
            assert mma.c_elem(lane, low) == (row, 2 * word - 8 * tile)
            assert mma.c_elem(lane, high) == (row, 2 * word + 1 - 8 * tile)


def test_a_wrong_half_table_is_caught():
    wrong = ((0, 0, 1), (1, 0, 1), (0, 2, 3), (1, 2, 3))    # registers 1 and 2 swapped
    lane, r = 5, 1
    tile, low, _ = wrong[r]
    row, word = mma.a_word(lane, r)
    assert mma.c_elem(lane, low) != (row, 2 * word - 8 * tile)


def p_v_tf32(P, V, key_of, a_floats):
    """One 16 x 8 chunk of P V the way the 3xTF32 kernel does it (in exact arithmetic): A's register r is
    C float a_floats[r] of S's fragment, B's word w is V's key key_of(w)."""
    a_regs = [[P[mma.c_elem(lane, a_floats[r])] for r in range(4)] for lane in range(32)]
    b_regs = [[V[key_of(mma.b_word(lane, r)[1]), mma.b_word(lane, r)[0]] for r in range(2)] for lane in range(32)]
    D = emulate_mma(a_regs, b_regs, [[0.0] * 4 for _ in range(32)])
    out = np.zeros((16, 8))
    for lane in range(32):
        for r in range(4):
            out[mma.c_elem(lane, r)] = D[lane][r]
    return out


def test_the_tf32_key_order_makes_p_v_right():
    rng = np.random.default_rng(0)
    P, V = rng.standard_normal((16, 8)), rng.standard_normal((8, 8))
    assert sorted(tc.tf32_key(w) for w in range(8)) == list(range(8))
    np.testing.assert_allclose(p_v_tf32(P, V, tc.tf32_key, tc.TF32_A), P @ V, rtol=1e-12, atol=1e-12)
    # C's layout read as A's without the key order (keys w and w + 4 where they lie): wrong
    assert not np.allclose(p_v_tf32(P, V, lambda w: w, tc.TF32_A), P @ V)


def test_inputs_become_words_zero_padded():
    x = (np.arange(2 * 3 * 5 * 7, dtype=np.float32).reshape(2, 3, 5, 7) / 7).astype(np.float16)
    w = tc.words(x, "f16")
    assert w.dtype == np.uint32 and w.shape == (2, 3, 5, 8)          # 7 halves -> 16 -> 8 words
    halves = w.view(np.float16)
    np.testing.assert_array_equal(halves[..., :7], x)
    assert (halves[..., 7:] == 0).all()
    y = np.ones((1, 1, 3, 64), np.float32)
    assert tc.words(y, "tf32x3").shape == (1, 1, 3, 64) and tc.words(y, "tf32x3").view(np.float32).sum() == 192


def test_each_step_takes_only_its_dtypes():
    assert tc.kind_of("mma_f16", np.float16) == "f16" and tc.kind_of("mma_f16", rules.ml_dtypes.bfloat16) == "bf16"
    assert tc.kind_of("mma_3xtf32", np.float32) == "tf32x3" and tc.kind_of("mma_tf32", np.float32) == "tf32x1"
    with pytest.raises(TypeError, match="mma_3xtf32 for float32"):
        tc.kind_of("mma_f16", np.float32)
    with pytest.raises(TypeError, match="float32 inputs"):
        tc.kind_of("mma_3xtf32", np.float16)
    with pytest.raises(ValueError, match="step must be one of"):
        tc.kind_of("mma_fp8", np.float16)


def test_every_tiling_fits_static_shared_memory():
    for kind in tc.KINDS:
        for D in (8, 40, 64, 96, 128, 256):
            t = tc.default_tiling(kind, D, D)
            assert tc.shared_bytes(kind, t, D, D) <= 48 * 1024, (kind, D, t)
    with pytest.raises(ValueError, match="shared"):
        tc.make_mma_kernel("tf32x3", tc.MmaTiling(4, 128), 128, 128)


def test_the_tensor_core_impls_are_registered_gpu_only_and_not_offered_without_a_gpu():
    names = {"cuda_mma_f16", "cuda_mma_tf32", "cuda_mma_3xtf32"}
    assert all(kernels.IMPLS[n].gpu_only and kernels.IMPLS[n].cuda for n in names)
    assert all(f"``{n}``" in kernels.__doc__ for n in names)
    if not tc.available():
        assert not names & set(course_lib.available_impls())
        q = np.zeros((1, 1, 16, 16), np.float16)
        with pytest.raises(ValueError, match="not available on this machine"):
            course_lib.attention(q, q, q, impl="cuda_mma_f16")


def records():
    return [json.loads(line) for line in RECORDS.read_text().splitlines()]


def test_the_gpu_records_hold_every_check_and_the_planted_tf32_fails():
    checks = [r for r in records() if r["benchmark"] == "gpu_mma_check"]
    assert checks
    for r in checks:
        if r["impl"] == "cuda_mma_tf32":     # one TF32 product: not float32's accuracy, on every case
            assert r["verdict"].startswith("FAIL"), r
        else:
            assert r["verdict"] == "PASS", r
    assert {(r["impl"], r["dtype"]) for r in checks} >= {("cuda_mma_f16", "float16"), ("cuda_mma_f16", "bfloat16"),
                                                          ("cuda_mma_3xtf32", "float32")}
    variants = [r for r in records() if r["benchmark"] == "gpu_mma_variants" and "check" in r]
    assert variants and all(r["check"].startswith("PASS") for r in variants)
    sanitized = {r["tool"]: r["summary"] for r in records() if r["benchmark"] == "gpu_mma_sanitize"}
    assert set(sanitized) == {"memcheck", "racecheck", "synccheck"}
    assert all(" 0 errors" in s or "0 hazards" in s for s in sanitized.values())


def test_the_tuned_table_is_what_the_tuned_run_chose():
    chosen = {(r["impl"], r["D"]): r["tiling"] for r in records() if r["benchmark"] == "gpu_mma_tuned"}
    kind_of_impl = {"cuda_mma_f16": "f16", "cuda_mma_3xtf32": "tf32x3"}
    assert {(kind_of_impl[i], D) for i, D in chosen} == set(tc.TUNED)
    for (impl, D), t in chosen.items():
        assert tc.TUNED[kind_of_impl[impl], D] == tc.MmaTiling(t["warps"], t["Bc"], t["staged"], t["prefetch"])

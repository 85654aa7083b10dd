"""The tensor-core steps (chapter 11's GPU half): what can be checked without a GPU.

The kernels are inline PTX; on a GPU their checks at awkward shapes, the sanitizer runs and the timings are
benchmarks/gpu_mma.py's, committed in notebooks/records/gpu_mma.jsonl (read here); in numba's simulator,
their instructions emulated, tests/test_tensor_core_sim.py checks every version at small shapes.
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
from course_lib.kernels import tensor_cores as tc
from course_lib.kernels.tensor_cores import mma

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


def test_every_tiling_fits_its_shared_memory():
    """Register-staged tilings use static shared memory (48 KB at most); cp.async's two stages are dynamic
    (up to what an H200 block may ask for)."""
    for kind in tc.KINDS:
        for D in (8, 40, 64, 96, 128, 256):
            t = tc.staged_tiling(kind, D, D)
            assert t.stages == 1 and tc.shared_bytes(kind, t, D, D) <= 48 * 1024, (kind, D, t)
            t = tc.default_tiling(kind, D, D)
            assert t.ldmatrix and t.stages == 2 and tc.shared_bytes(kind, t, D, D) <= tc.MAX_SHARED, (kind, D, t)
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


def tiling_of(t):
    return tc.MmaTiling(t["warps"], t["Bc"], t["staged"], t["prefetch"], t.get("ldmatrix", False), t.get("stages", 1))


def test_the_tuned_tables_are_what_the_tuned_runs_chose():
    kind_of_impl = {"cuda_mma_f16": "f16", "cuda_mma_3xtf32": "tf32x3"}
    staged = {(kind_of_impl[r["impl"]], r["D"]): tiling_of(r["tiling"]) for r in records()
              if r["benchmark"] == "gpu_mma_tuned"}
    assert staged == tc.TUNED_STAGED
    chained = {(kind_of_impl[r["impl"]], r["D"]): tiling_of(r["tiling"]) for r in records()
               if r["benchmark"] == "gpu_mma_chain_tuned" and r["run"] == tc.RUN_TUNED.get((kind_of_impl[r["impl"]], r["D"]))}
    assert chained == tc.TUNED


def test_the_chain_was_checked_at_every_case_and_sanitized():
    """Steps (c) and (d), and 3xTF32's (e) and (f), passed check_attention at every awkward case in the records,
    and each tuned tiling's shape was then checked again as the default (gpu_mma_check of a later run)."""
    chain = [r for r in records() if r["benchmark"] == "gpu_mma_chain_check"]
    steps = {(i, s) for i in ("cuda_mma_f16", "cuda_mma_3xtf32") for s in ("ldmatrix", "cp_async")}
    steps |= {("cuda_mma_3xtf32", "split_once"), ("cuda_mma_3xtf32", "q_shared")}
    assert {(r["impl"], r["step"]) for r in chain} == steps
    assert all(r["verdict"] == "PASS" for r in chain)
    for impl, step in steps:
        assert len({r["case"] for r in chain if (r["impl"], r["step"]) == (impl, step)}) >= 11, (impl, step)
    later = [r for r in records() if r["benchmark"] == "gpu_mma_check" and r["run"] > max(tc.RUN_TUNED.values())]
    assert {r["impl"] for r in later} >= {"cuda_mma_f16", "cuda_mma_3xtf32"}
    # the tuned tilings, once adopted as the defaults, were checked as defaults: every verdict PASS
    assert all(r["verdict"] == "PASS" for r in later if r["impl"] in ("cuda_mma_f16", "cuda_mma_3xtf32"))
    sanitized = [r for r in records() if r["benchmark"] == "gpu_mma_sanitize" and "cp_async" in " ".join(r["launches"])]
    assert {r["tool"] for r in sanitized} == {"memcheck", "racecheck", "synccheck"}


# -- ldmatrix on swizzled tiles (steps c and d): the addresses each lane gives, emulated --------------

def ldmatrix_x4(flat, addresses, trans=False):
    """A warp's ldmatrix.x4 as the PTX ISA says it is: lane i gives the word address of row i % 8 of
    matrix i // 8 (16 bytes, 4 words, must be 16-byte aligned); register j of each lane gets matrix j's
    word (mma.ldmatrix_word).  Halves: each word is two uint16."""
    mats = np.zeros((4, 8, 8), np.uint16)            # matrix, row, half
    for lane in range(32):
        a = addresses[lane]
        assert a % 4 == 0, "ldmatrix needs 16-byte-aligned rows"
        m, r = mma.ldmatrix_row(lane)
        mats[m, r] = flat[a:a + 4].view(np.uint16)
    regs = np.zeros((32, 4), np.uint32)
    for lane in range(32):
        for j in range(4):
            if trans:
                r0, r1, col = mma.ldmatrix_word(lane, j, trans=True)
                pair = np.array([mats[j, r0, col], mats[j, r1, col]], np.uint16)
            else:
                row, w = mma.ldmatrix_word(lane, j)
                pair = mats[j, row, 2 * w:2 * w + 2]
            regs[lane, j] = pair.view(np.uint32)[0]
    return regs


def swizzled(tile, swizzle=tc.swizzle):
    """A (rows, rw) tile of words stored the way the kernel stores it."""
    rows, rw = tile.shape
    flat = np.zeros(rows * rw, np.uint32)
    for row in range(rows):
        for w in range(rw):
            flat[swizzle(row, w, rw)] = tile[row, w]
    return flat


@pytest.mark.parametrize("rw", [8, 16, 24, 32, 48, 64])
def test_the_swizzle_is_a_permutation_that_keeps_chunks_whole(rw):
    rows = 64
    spots = [tc.swizzle(r, w, rw) for r in range(rows) for w in range(rw)]
    assert sorted(spots) == list(range(rows * rw))
    assert all(tc.swizzle(r, w, rw) == tc.swizzle(r, w & ~3, rw) + (w & 3) for r in range(rows) for w in range(rw))


def banks_hit(addresses):
    """How many of the 32 banks one 8-row phase of ldmatrix touches (32: no conflict)."""
    return len({(a + i) % 32 for a in addresses for i in range(4)})


@pytest.mark.parametrize("rw", [8, 16, 32, 64])
def test_each_ldmatrix_phase_hits_all_32_banks(rw):
    """ldmatrix reads a matrix's 8 rows (8 x 16 bytes) in one pass: conflict-free if they cover all banks."""
    chunks = rw // 4
    for r0 in range(0, 64, 8):
        for c in range(chunks):
            assert banks_hit([tc.swizzle(r0 + i, 4 * c, rw) for i in range(8)]) == 32, (rw, r0, c)
    # the plain layout (no XOR) at 32 or 64 words a row: all 8 rows in the same 4 banks
    if rw >= 32:
        assert banks_hit([(r0 + i) * rw for i in range(8) for r0 in (0,)]) == 4


def half_tile(rng, rows, halves):
    return rng.integers(0, 2 ** 16, size=(rows, halves), dtype=np.uint16)


@pytest.mark.parametrize("DW", [8, 16, 32, 64])
def test_ldmatrix_gives_s_its_b_fragments_from_the_swizzled_k_tile(DW):
    rng = np.random.default_rng(DW)
    Bc = 32
    K = half_tile(rng, Bc, 2 * DW).view(np.uint32)          # keys x words
    flat = swizzled(K)
    for kc in range(DW // 8):
        for j in range(0, Bc // 8, 2):
            regs = ldmatrix_x4(flat, [tc.swizzle(*tc.k_rows(lane, j, kc), DW) for lane in range(32)])
            for lane in range(32):
                for tile in (0, 1):
                    for r in (0, 1):
                        n, w = mma.b_word(lane, r)
                        assert regs[lane, 2 * tile + r] == K[(j + tile) * 8 + n, kc * 8 + w]


@pytest.mark.parametrize("VW", [8, 16, 32, 64])
def test_transposed_ldmatrix_gives_p_v_its_b_fragments_from_v_by_keys(VW):
    """B of P V (k = key, n = dim): word w of B's column n holds keys 2w and 2w + 1 of dim n (lower, upper)."""
    rng = np.random.default_rng(VW)
    Bc = 32
    V = half_tile(rng, Bc, 2 * VW)                           # keys x dims (halves)
    flat = swizzled(V.view(np.uint32))
    for pc in range(Bc // 16):
        for e in range(0, 2 * VW // 8, 2):
            regs = ldmatrix_x4(flat, [tc.swizzle(*tc.v_rows(lane, e, pc), VW) for lane in range(32)], trans=True)
            for lane in range(32):
                for tile in (0, 1):
                    for r in (0, 1):
                        n, w = mma.b_word(lane, r)
                        keys = pc * 16 + 2 * w, pc * 16 + 2 * w + 1
                        dim = (e + tile) * 8 + n
                        want = np.array([V[keys[0], dim], V[keys[1], dim]], np.uint16).view(np.uint32)[0]
                        assert regs[lane, 2 * tile + r] == want


def test_a_wrong_ldmatrix_address_or_a_missing_swizzle_is_caught():
    rng = np.random.default_rng(1)
    K = half_tile(rng, 32, 64).view(np.uint32)
    flat = swizzled(K)
    def fragments(rows, swizzle):
        return ldmatrix_x4(flat, [swizzle(*rows(lane, 0, 0), 32) for lane in range(32)])
    good = fragments(tc.k_rows, tc.swizzle)
    # matrices 1 and 2 swapped (key tile and word half mixed up)
    swapped = lambda lane, j, kc: tc.k_rows(lane ^ 24 if (lane >> 3) in (1, 2) else lane, j, kc)
    assert (fragments(swapped, tc.swizzle) != good).any()
    # the addresses of the plain layout read from the swizzled tile
    assert (fragments(tc.k_rows, lambda r, w, rw: r * rw + w) != good).any()


def k_swizzled(lane, j, kc, rw):
    return tc.swizzle(*tc.k_rows(lane, j, kc), rw)


def v_swizzled(lane, e, pc, rw):
    return tc.swizzle(*tc.v_rows(lane, e, pc), rw)


def v_word_swizzled(lane, reg, e, pc, rw):
    n, w = mma.b_word(lane, reg)
    return tc.swizzle(pc * 8 + tc.tf32_key(w), e * 8 + n, rw)


@pytest.mark.parametrize("rw", [32, 64, 96, 128])
def test_the_folded_addresses_are_the_swizzled_ones(rw):
    """The kernel's folded ldmatrix / 3xTF32 addresses (rows of a multiple of 8 chunks) against swizzle of
    the (row, word) they stand for, for every lane and every fragment of a 64-key tile."""
    for lane in range(32):
        for kc in range(rw // 8):
            for j in range(0, 8, 2):
                assert tc.k_address(lane, j, kc, rw) == k_swizzled(lane, j, kc, rw), (lane, j, kc)
        for e in range(0, rw // 4, 2):              # halves: 2 rw dims, 8 a fragment
            for pc in range(4):
                assert tc.v_address(lane, e, pc, rw) == v_swizzled(lane, e, pc, rw), (lane, e, pc)
        for e in range(rw // 8):                    # tf32: rw dims
            for pc in range(8):
                for reg in (0, 1):
                    assert tc.v_word_address(lane, reg, e, pc, rw) == v_word_swizzled(lane, reg, e, pc, rw)


def test_a_wrong_fold_is_caught():
    """The test above fails on a fold that drops the lane's row from the XOR, on one that takes word w's key
    to be w, and on the fold used for rows of fewer than 8 chunks (why the kernel tests KCH % 8)."""
    def k_no_row(lane, j, kc, rw):
        return (j * 8 + (lane >> 4) * 8 + (lane & 7)) * rw + (((2 * kc) ^ ((lane >> 3) & 1)) << 2)

    def v_word_plain_key(lane, reg, e, pc, rw):
        n, key = lane >> 2, (lane & 3) + 4 * reg
        return (pc * 8 + key) * rw + (((2 * e) ^ ((n >> 2) ^ key)) << 2) + (n & 3)
    assert any(k_no_row(lane, 0, 1, 64) != k_swizzled(lane, 0, 1, 64) for lane in range(32))
    assert any(v_word_plain_key(lane, 1, 2, 3, 64) != v_word_swizzled(lane, 1, 2, 3, 64) for lane in range(32))
    assert any(tc.k_address(lane, 0, 1, 16) != k_swizzled(lane, 0, 1, 16) for lane in range(32))


def test_cp_async_tilings_are_checked_when_built():
    with pytest.raises(ValueError, match="needs ldmatrix"):
        tc.make_mma_kernel("f16", tc.MmaTiling(4, 64, stages=2), 64, 64)
    with pytest.raises(ValueError, match="staged loads or by cp.async"):
        tc.make_mma_kernel("f16", tc.MmaTiling(4, 64, staged=False, ldmatrix=True), 64, 64)
    t = tc.MmaTiling(4, 64, ldmatrix=True, stages=2)
    assert tc.shared_bytes("f16", t, 128, 128) == 2 * 4 * 64 * (64 + 64)      # two stages, no padding


# Decode's GQA packing (``tc.pack_decode``) is a host transform: the G query heads of a K / V head become G rows
# of one head, without a mask.  Run through the numpy flash forward, the packed call must give the unpacked one's
# answer where it packs, and it must not pack where a row's keys depend on its position or its head.
PACKING = {   # name: (H, Hk, Nq, Nk, options, packs)
    "gqa4": (8, 2, 1, 70, {}, True),
    "mqa8_causal_bottom_right": (8, 1, 1, 70, {"causal": True}, True),
    "gqa2_window_covering_every_key": (4, 2, 1, 70, {"window_size": (80, 3)}, True),
    "gqa2_left_window": (4, 2, 1, 70, {"window_size": (20, -1)}, False),
    "gqa2_causal_top_left": (4, 2, 1, 70, {"causal": True, "causal_align": "top_left"}, False),
    "gqa2_alibi": (4, 2, 1, 70, {"alibi_slopes": np.array([[0.5, 0.25, 0.125, 0.0625]])}, False),
    "mha": (4, 4, 1, 70, {}, False),
    "two_rows": (4, 2, 2, 70, {}, False),
}


def packed_forward(q, k, v, opts, mask):
    """The numpy flash forward on what ``pack_decode`` makes of the call, unpacked as the launcher does."""
    from course_lib.kernels.flash_numpy import attention_forward
    B, H, Nq, _ = q.shape
    group, qp, maskp = tc.pack_decode(q, k, opts, mask)
    out, lse = attention_forward(qp, k, v, opts, maskp)
    packed_forward.group = group
    return out.reshape(B, H, Nq, v.shape[3]), lse.reshape(B, H, Nq)


@pytest.mark.parametrize("name", PACKING)
def test_decode_packs_a_groups_query_heads_only_where_the_answer_is_the_same(name):
    from course_lib.core.options import call_forward
    H, Hk, Nq, Nk, options, packs = PACKING[name]
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, H, Nq, 24), (1, Hk, Nk, 24), (1, Hk, Nk, 16)))
    want, want_lse = course_lib.attention(q, k, v, impl="reference", return_lse=True, **options)
    got, got_lse = call_forward(packed_forward, q, k, v, return_lse=True, **options)
    assert (packed_forward.group > 1) == packs, f"{name}: packed into groups of {packed_forward.group}"
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(got_lse, want_lse, rtol=2e-5, atol=2e-6)


def test_packing_where_a_row_sees_other_keys_would_be_caught():
    """Packing the causal top-left call anyway (its one row sees key 0 only) changes the answer: the test above
    would fail if ``packed_group`` let it through."""
    from course_lib.core.masks import MaskSpec
    from course_lib.core.options import call_forward
    from course_lib.kernels.flash_numpy import attention_forward
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, 4, 1, 24), (1, 2, 70, 24), (1, 2, 70, 16)))

    def forced(q, k, v, opts, mask):
        out, lse = attention_forward(q.reshape(1, 2, 2, 24), k, v, opts, MaskSpec(2, 70))
        return out.reshape(1, 4, 1, 16), lse.reshape(1, 4, 1)
    options = {"causal": True, "causal_align": "top_left"}
    want = course_lib.attention(q, k, v, impl="reference", **options)
    got = call_forward(forced, q, k, v, **options)
    assert np.abs(got - want).max() > 0.1

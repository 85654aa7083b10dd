"""What the checks of exercise sets 10-12 compare an answer with, kept out of the learner's way.

A check cell is the first thing a learner reads after the statement: a reference it named from
the course's library (``hardware.occupancy``, ``cs.Tiling.shared_bytes``, ``overlap.run``) was the
answer one click away.  The references live here instead, in the package a learner never opens,
and where they can be computed another way than the closed form the exercise asks for, they are:
occupancy by filling an SM one block at a time, rounding by searching a format's list of values.
"""
from __future__ import annotations

import math

import numpy as np

# -- set 10 --------------------------------------------------------------------------------------


def warps_per_sm(regs, shared, threads, sm):
    """(warps, limiter) of the blocks one SM holds, found by adding blocks until one more does not fit.

    Over a per-block limit no block fits; the limiter is then the first limit broken, in the
    exercise's order (warps, registers, shared, blocks), as it is for a tie."""
    warps = -(-threads // 32)
    per_warp = -(-regs * 32 // sm["reg_unit"]) * sm["reg_unit"]
    need = {"warps": warps, "registers": per_warp * warps, "shared": shared + sm["reserved_per_block"], "blocks": 1}
    have = {"warps": sm["max_threads"] // 32, "registers": sm["regs_per_sm"], "shared": sm["smem_per_sm"],
            "blocks": sm["max_blocks"]}
    broken = [name for name, over in (("registers", regs > sm["max_regs_per_thread"]),
                                      ("shared", shared > sm["smem_per_block"])) if over]
    if broken:
        return 0, broken[0]
    blocks = 0
    while True:
        short = [name for name in need if have[name] < need[name]]
        if short:
            return blocks * warps, short[0]
        for name in need:
            have[name] -= need[name]
        blocks += 1


def tiled_shared_bytes(Br, Bc, threads, tx, pad, D, Dv):
    """The shared bytes of a scalar micro-tiled step, as the course's kernels allocate them."""
    from ..kernels import cuda_steps as cs

    return cs.Tiling(Br=Br, Bc=Bc, threads=threads, tx=tx, pad=pad).shared_bytes(D, Dv)


def load_bound_tflops(record, peak_tflops, fma_per_load=4):
    """The shared-load bound of one timed record's kernel, from the course's model of its loads."""
    from ..kernels import cuda_steps as cs

    if record["step"] in ("row", "row_exp2"):
        return peak_tflops * min(1.0, 1 / fma_per_load)
    t = cs.Tiling(**record["tiling"])
    D, Dv = record["D"], record["head_dim_v"]
    return peak_tflops * min(1.0, t.fmas(D, Dv) / (fma_per_load * t.shared_loads(D, Dv)))


def step_loads_per_fma(step, D, Dv):
    """Shared-load instructions per FMA of one of chapter 10's steps, on the course's model."""
    from ..kernels import cuda_steps as cs

    t = cs.STEP_TILING[step]
    return t.shared_loads(D, Dv) / t.fmas(D, Dv)


def tiling_model(Br, Bc, threads, tx, D, Dv):
    """(valid, live floats, shared loads per useful FMA) of a tiled_padded tiling on the course's model."""
    from ..kernels import cuda_steps as cs

    t = cs.Tiling(Br=Br, Bc=Bc, threads=threads, tx=tx, pad=1, prefetch=False)
    try:
        t.check(D, Dv)
    except ValueError:
        return False, None, None
    return True, t.live_floats(D, Dv), t.shared_loads(D, Dv) * threads / (Br * Bc * (D + Dv))


def tiling_shared_bytes(Br, Bc, threads, tx, D, Dv):
    """The shared bytes of a tiled_padded tiling (pad 1) on the course's model."""
    from ..kernels import cuda_steps as cs

    return cs.Tiling(Br=Br, Bc=Bc, threads=threads, tx=tx, pad=1, prefetch=False).shared_bytes(D, Dv)


# -- set 11 --------------------------------------------------------------------------------------

def format_values(bits, min_exponent, max_value):
    """The non-negative values of a format, from 0 up to one whole binade past ``max_value``, and
    whether each one's significand (its integer multiple of the quantum) is even."""
    quantum = min_exponent
    ks = np.arange(0, 2 ** bits)                       # the subnormals and the first binade
    values, even = [ks * 2.0 ** quantum], [ks % 2 == 0]
    while values[-1][-1] <= 2 * max_value:
        quantum += 1
        ks = np.arange(2 ** (bits - 1), 2 ** bits)
        values.append(ks * 2.0 ** quantum)
        even.append(ks % 2 == 0)
    return np.concatenate(values), np.concatenate(even)


def round_to_format(x, bits, min_exponent, max_value, overflow):
    """x rounded to the nearest value of the format (a tie to the even significand), by searching its values."""
    x = np.asarray(x, dtype=np.float64)
    grid, even = format_values(bits, min_exponent, max_value)
    a = np.abs(np.where(np.isnan(x), 0.0, x))
    hi = np.clip(np.searchsorted(grid, a), 1, len(grid) - 1)
    lo = hi - 1
    below, above = a - grid[lo], grid[hi] - a
    pick = np.where(below < above, lo, np.where(above < below, hi, np.where(even[lo], lo, hi)))
    y = np.copysign(grid[pick], x)
    too_big = (a > grid[-1]) | (np.abs(y) > max_value)
    y = np.where(too_big, np.nan if overflow == "nan" else np.copysign(np.inf, x), y)
    return np.where(np.isnan(x), np.nan, y)


def _library_formats():
    import ml_dtypes

    known = set()
    for name in dir(ml_dtypes):
        kind = getattr(ml_dtypes, name)
        if not (isinstance(kind, type) and issubclass(kind, np.generic)):
            continue
        try:
            info = ml_dtypes.finfo(kind)
        except (TypeError, ValueError):   # an integer type
            continue
        known.add((int(info.nmant) + 1, float(info.max)))
    for dtype in (np.float16, np.float32):
        info = np.finfo(dtype)
        known.add((int(info.nmant) + 1, float(info.max)))
    return known


def drawn_formats(draw, n):
    """``n`` small float formats no library has: {label: (bits, min_exponent, max_value, overflow)}."""
    known, found = _library_formats(), {}
    while len(found) < n:
        bits, min_normal, top = int(draw.integers(2, 8)), int(draw.integers(-14, -1)), int(draw.integers(3, 16))
        overflow = "nan" if draw.integers(2) else "inf"
        # an "inf" format's top significand is all ones; a "nan" one gives that pattern to NaN, as e4m3fn does
        max_value = (2 - 2.0 ** (1 - bits) * (2 if overflow == "nan" and bits > 2 else 1)) * 2.0 ** top
        if (bits, max_value) in known:
            continue
        params = (bits, min_normal - (bits - 1), max_value, overflow)
        found[f"{bits} bits, 2^{params[1]} .. {max_value:g}, overflow to {overflow}"] = params
    return found


def rounding_cases(draw, bits, min_exponent, max_value, overflow):
    """Values to round: the format's own, the ties between them, values across its range and past its
    top, and the special ones; all of them values float32 holds exactly."""
    grid, _ = format_values(bits, min_exponent, max_value)
    grid = grid[grid <= max_value]
    grid = np.concatenate([grid, -grid])
    grid = np.sort(grid[draw.choice(len(grid), min(len(grid), 600), replace=False)])
    ties = (grid[1:] + grid[:-1]) / 2
    spread = np.exp2(draw.uniform(min_exponent - 2, math.log2(max_value) + 1, 500)) * draw.choice([-1, 1], 500)
    x = np.concatenate([grid, ties, spread, [0.0, -0.0, max_value, -max_value, max_value * 1.03, max_value * 1.1,
                                             -max_value * 2, np.inf, -np.inf, np.nan]])
    with np.errstate(over="ignore"):
        return x.astype(np.float32).astype(np.float64)


def rounded_p_case(draw):
    """float8 inputs of one softmax whose P does not round away its own error: every row's scores are
    equal save key 0's, its max, so every other key's P is one value e, rounded the same way.

    Returns (q8, k8, v8, descales, expected out): expected is FA3's recipe, P rounded to e4m3 for
    the matmul with V and summed unrounded into l, in float64."""
    import ml_dtypes

    e4m3 = ml_dtypes.float8_e4m3fn
    values = np.arange(256, dtype=np.uint8).view(e4m3).astype(np.float64)
    grid = np.unique(values[np.isfinite(values) & (values > 0)])
    steps = grid[(grid >= 0.5) & (grid <= 2.0)]
    D, B, H = 32, 1, 2
    while True:
        a, b = np.sort(draw.choice(steps, 2, replace=False))[::-1]
        e = math.exp(-(a - b) * D / math.sqrt(D))
        rounded = float(round_to_format(np.array([e]), 4, -9, 448.0, "nan")[0])
        i = np.searchsorted(grid, e)
        if not 0 < i < len(grid):
            continue
        spacing = grid[i] - grid[i - 1]
        tie = (grid[i] + grid[i - 1]) / 2
        if e > 2.0 ** -6 and abs(rounded - e) > 0.01 * e and abs(e - tie) > 0.2 * spacing:
            break
    Nq, Nk = int(draw.integers(4, 17)), int(draw.integers(100, 600))
    q8 = np.ones((B, H, Nq, D)).astype(e4m3)
    k = np.full((B, H, Nk, D), b)
    k[:, :, 0] = a
    v = draw.standard_normal((B, H, Nk, D)).astype(e4m3)
    vv = v.astype(np.float64)
    out = (vv[:, :, :1] + rounded * vv[:, :, 1:].sum(axis=2, keepdims=True)) / (1 + (Nk - 1) * e)
    ones = np.ones((B, H), np.float32)
    return q8, k.astype(e4m3), v, (ones, ones, ones), np.broadcast_to(out, (B, H, Nq, D)).astype(np.float32)


def tc_busy(schedule, costs, n_tiles=150):
    """The share of time the tensor cores work, from the chapter's simulator of the schedule."""
    from ..lowp import overlap

    return overlap.run(schedule, costs, n_tiles=n_tiles)["tc_busy"]


def _round_bits(x, bits):
    """x rounded to ``bits`` significant bits, half to even, with no exponent limits."""
    _, exponent = np.frexp(x)
    return np.ldexp(np.round(np.ldexp(x, bits - exponent)), exponent - bits)


def p_rounding_error(q, k, v, bits, block_k=128):
    """The relative RMS error of out when P = exp(S - m), and nothing else, is rounded to ``bits``
    significant bits (any exponent) in the tiled forward in float64; l sums the unrounded P."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    outs = []
    for rounding in (lambda p: p, lambda p: _round_bits(p, bits)):
        m = np.full(q.shape[:3] + (1,), -np.inf)
        l = np.zeros(q.shape[:3] + (1,))
        O = np.zeros(q.shape[:3] + (v.shape[-1],))
        for c0 in range(0, k.shape[2], block_k):
            s = scale * q @ np.swapaxes(k[:, :, c0:c0 + block_k], -1, -2)
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
            alpha, p = np.exp(m - m_new), np.exp(s - m_new)
            l = alpha * l + p.sum(axis=-1, keepdims=True)
            O = alpha * O + rounding(p) @ v[:, :, c0:c0 + block_k]
            m = m_new
        outs.append(O / l)
    exact, rounded = outs
    return float(np.sqrt(np.mean((rounded - exact) ** 2) / np.mean(exact ** 2)))

"""Choosing the numbers on the GPU: the autotuner (``TUNED``), split-KV's rule, a kernel's resources.

- ``autotune`` times candidate Tilings at one head dim and keeps the fastest
  in ``TUNED[D]``, which step ``tuned`` runs with;
- ``decode_splits`` picks the number of split-KV pieces for decode: the fewest
  that give ``DECODE_WAVES`` full waves of resident blocks;
- ``resources`` reads what numba compiled: registers, shared and local bytes.
"""
from __future__ import annotations

from dataclasses import replace

try:
    from numba import cuda
except ModuleNotFoundError:  # numba (with numba-cuda) missing: the steps are unavailable
    cuda = None

from ...core import hardware
from .device import on_gpu
from .tiling import CANDIDATES, TUNED, Tiling

DECODE_WAVES = 2           # split-KV aims at this many full waves of resident blocks


def resources(kernel):
    """Registers / thread, static shared bytes / block and local (spill) bytes / thread of every
    compiled version of a kernel, from numba's dispatcher (on a GPU only)."""
    out = {}
    for name in ("get_regs_per_thread", "get_shared_mem_per_block", "get_local_mem_per_thread"):
        try:
            value = getattr(kernel, name)()
            values = sorted({int(x) for x in value.values()}) if isinstance(value, dict) else [int(value)]
            out[name[4:]] = values[0] if len(values) == 1 else values
        except Exception as error:  # noqa: BLE001 -- recorded as what it is
            out[name[4:]] = f"{type(error).__name__}: {error}"
    return out


def decode_splits(rows, tiles, tiling, D, Dv, regs=64, sms=None, waves=DECODE_WAVES, shared=None):
    """Split-KV's rule: the fewest splits (a power of two) that give ``waves`` full waves of blocks.

    ``rows`` blocks run without a split (B * H * Tr); a multiprocessor holds ``blocks_per_sm`` of
    them at once (``core.hardware.occupancy`` of the tiling's shared memory, threads and ``regs`` on
    an H200), so the chip holds ``sms * blocks_per_sm``.  Fewer blocks leave multiprocessors idle or shallow (too few
    loads in flight); more only add partials to merge.  Never more splits than key tiles.
    ``shared``: the block's shared bytes where the tiling does not say them itself (a tensor-core
    tiling's depend on its kind).  Returns (splits, the numbers the rule used)."""
    h200 = hardware.hardware("h200")
    if sms is None:
        sms = cuda.get_current_device().MULTIPROCESSOR_COUNT if on_gpu() else int(float(h200.units))
    shared = tiling.shared_bytes(D, Dv) if shared is None else shared
    per_sm = hardware.occupancy(h200, regs, shared, tiling.threads).blocks
    want = waves * sms * per_sm
    splits = 1
    while rows * splits < want and splits * 2 <= max(1, tiles):
        splits *= 2
    return splits, {"rows": rows, "key_tiles": tiles, "sms": sms, "blocks_per_sm": per_sm, "waves": waves,
                    "blocks": rows * splits, "regs": regs}


def autotune(D, time_plan, candidates=None, prefetch=(False, True), base=None):
    """Time every candidate Tiling at head dim D with ``time_plan(tiling) -> seconds`` (None: it
    failed), keep the fastest in ``TUNED[D]`` and return (best, [(tiling, seconds), ...]).
    ``base`` gives the switches the candidates share (default: ``tiled_prefetch``'s kernel,
    pad 1); each candidate is (Br, Bc, threads, tx[, register cap]), tried with each ``prefetch``."""
    candidates = candidates or CANDIDATES
    base = base or Tiling(pad=1)
    results = []
    for Br, Bc, threads, tx, *cap in candidates:
        for pf in prefetch:
            tiling = replace(base, Br=Br, Bc=Bc, threads=threads, tx=tx, prefetch=pf, max_regs=(cap or [0])[0])
            try:
                tiling.check(D, D)
            except ValueError:
                continue
            results.append((tiling, time_plan(tiling)))
    timed = [(t, s) for t, s in results if s is not None]
    if not timed:
        raise RuntimeError(f"no candidate tiling ran at D={D}")
    best = min(timed, key=lambda ts: ts[1])[0]
    TUNED[D] = best
    return best, results

"""Decode on the tensor cores at the bandwidth limit: K + V bytes a second beside FlashAttention-2 and cuDNN, MHA
and GQA, in one run.

    python benchmarks/gpu_decode.py --out notebooks/records/gpu_decode.jsonl [--parts check time]

Needs a CUDA GPU (sm_80 or newer), numba-cuda and torch; a benchmark, not a test.

Decode (one query row a head against a long cache) does 4 FLOPs a byte of K and V at most: it is judged by the
bytes it moves a second, against the card's datasheet HBM bandwidth (``core.hardware``), not by TFLOP/s.

- ``check``: decode cases against the float64 reference (``checks.check_attention``): GQA and MQA packed into
  the mma's rows (``tc.packed_group``: causal aligned bottom right, a window covering every key, 32 heads a
  group: more rows than one warp's 16), and the ones that must not pack (a left window, causal top left,
  ALiBi), split-KV included, fp16 and bf16, D = 64 and 128.
- ``time``: B = 8, H = 16 query heads, Nk = 32K, D = 64 / 128, fp16, H / Hk = 1, 4, 8: the course's kernel
  with the query heads of a group packed (the default) and, for GQA, unpacked (each head its own block, the
  K / V rows read once a head), split-KV's choice (``tc.decode_splits``) and half / twice as many splits, the
  decode tiling's key tile 32 / 64 / 128; beside torch_sdpa_flash (FlashAttention-2, ``enable_gqa``) and
  torch_sdpa_cudnn.  CUDA events, warm-up, median of 20; every row carries its TB/s of K + V and the
  fraction of the datasheet's bandwidth.
- ``profile``: one launch of the time part's problem (``--profile D GROUP``, packed, split-KV's choice),
  warmed up, then run once between cudaProfilerStart / Stop, for ncu; notebooks/records/ncu/ holds its reports:

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \\
        --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \\
        python benchmarks/gpu_decode.py --out /tmp/profile.jsonl --parts profile --profile 64 8
"""
from __future__ import annotations

import argparse
import time
import traceback
from dataclasses import replace

import numpy as np
from gpu_mma import problem

from course_lib import bench, checks
from course_lib.bench.peers import peer_runs_on
from course_lib.core import hardware
from course_lib.core.options import call_forward
from course_lib.kernels import tensor_cores as tc

OUT = ENV = None
REPEATS = 20
# name: (B, H, Hk, Nq, Nk, D, Dv, options, splits)
CASES = {
    "gqa4_d64": (2, 8, 2, 1, 1000, 64, 64, {}, 1),
    "gqa8_causal_split_kv": (2, 16, 2, 1, 1000, 64, 64, {"causal": True}, 4),
    "mqa16_d128_tail": (1, 16, 1, 1, 333, 128, 128, {}, 2),
    "mqa32_rows_over_a_warp": (1, 32, 1, 1, 500, 128, 128, {}, 2),
    "gqa4_window_covering_every_key": (1, 8, 2, 1, 300, 64, 64, {"window_size": (400, 0)}, 1),
    "gqa4_left_window_not_packed": (1, 8, 2, 1, 300, 64, 64, {"window_size": (100, -1)}, 1),
    "gqa4_causal_top_left_not_packed": (1, 8, 2, 1, 300, 64, 64, {"causal": True, "causal_align": "top_left"}, 1),
    "gqa4_alibi_not_packed": (1, 4, 2, 1, 300, 64, 64, {"alibi_slopes": [[0.5, 0.25, 0.125, 0.0625]]}, 2),
    "mha_split_kv": (2, 4, 4, 1, 1000, 128, 128, {}, 4),
}


def part_check():
    for dtype in ("float16", "bfloat16"):
        for name, (B, H, Hk, Nq, Nk, D, Dv, options, splits) in CASES.items():
            q, k, v = problem(B, H, Hk, Nq, Nk, D, Dv, dtype)
            opts = {a: (np.array(b) if a == "alibi_slopes" else b) for a, b in options.items()}
            got = {}

            def grab(q, k, v, o, mask):
                got["group"] = tc.packed_group(q, k, o, mask)
                return np.zeros(1), np.zeros(1)
            call_forward(grab, q, k, v, **opts)

            def go():
                out, lse = tc.attention(q, k, v, step="mma_f16", splits=splits, return_lse=True, **opts)
                checks.check_attention(out, q, k, v, lse=lse, **opts)
            result = bench.verdict(go)
            bench.log(f"check {dtype} {name} (packed {got['group']}): {result}")
            OUT.write({"benchmark": "gpu_decode_check", "impl": "cuda_mma_f16", "dtype": dtype, "case": name,
                       "shape": [B, H, Hk, Nq, Nk, D, Dv], "options": options, "splits": splits,
                       "packed_group": got["group"], "verdict": result})


def launch(q, k, v, *, splits, tiling=None, pack=True):
    """A zero-argument callable launching mma_f16 on q, k, v (converted and copied to the device once)."""
    got = {}

    def grab(q, k, v, opts, mask):
        got["go"] = tc.launcher("mma_f16", q, k, v, opts, mask, splits=splits, tiling=tiling, pack=pack)
        return np.zeros(1), np.zeros(1)
    call_forward(grab, q, k, v)
    return got["go"]


def timed(fn, rec):
    fn()
    median, times = bench.cuda_time_it(fn, REPEATS, warmup=3)
    B, H, Hk, Nk, D = rec["B"], rec["H"], rec["Hk"], rec["Nk"], rec["D"]
    kv_bytes = 2 * B * Hk * Nk * 2 * D          # K and V, fp16
    preset = hardware.preset_for(ENV.get("gpu"))
    peak = hardware.hardware(preset).bandwidth.value if preset else None
    rec = {**rec, "median_s": median, "times_ms": times, "kv_bytes": kv_bytes, "tb_per_s": kv_bytes / median / 1e12,
           "datasheet_tb_per_s": peak / 1e12 if peak else None,
           "of_datasheet": kv_bytes / median / peak if peak else None, "layer": "kernel"}
    bench.log(f"{rec['impl']:18s} D={D} H/Hk={H // Hk} {rec.get('variant', ''):28s} {median * 1e3:7.3f} ms "
              f"{rec['tb_per_s']:5.2f} TB/s" + (f" {rec['of_datasheet']:.0%}" if peak else ""))
    OUT.write(rec)
    return median


def part_time():
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    B, H, Nk = 8, 16, 32768
    for D in (64, 128):
        for group in (1, 4, 8):
            Hk = H // group
            q, k, v = problem(B, H, Hk, 1, Nk, D, D, "float16", seed=3)
            base = {"benchmark": "gpu_decode_time", "dtype": "float16", "B": B, "H": H, "Hk": Hk, "Nq": 1, "Nk": Nk,
                    "D": D, "group": group}
            ours = {**base, "impl": "cuda_mma_f16", "runs_on": "mma.sync m16n8k16"}
            tiling = tc.decode_tiling("f16", D, D)
            chosen = tc.decode_splits("mma_f16", q.dtype, B, H, 1, Nk, D, D, group=group)[0]
            ref = None
            for splits in sorted({max(1, chosen // 2), chosen, 2 * chosen}):
                go, out, _ = launch(q, k, v, splits=splits)
                timed(go, {**ours, "variant": f"packed, {splits} splits", "packed": group > 1, "splits": splits,
                           "chosen": splits == chosen, "tiling": {"warps": tiling.warps, "Bc": tiling.Bc}})
                ref = out.copy_to_host() if ref is None else ref
            for Bc in (32, 64, 128):
                t = replace(tiling, Bc=Bc)
                if t == tiling or tc.shared_bytes("f16", t, D, D) > tc.MAX_SHARED:
                    continue
                splits = tc.decode_splits("mma_f16", q.dtype, B, H, 1, Nk, D, D, tiling=t, group=group)[0]
                go, out, _ = launch(q, k, v, splits=splits, tiling=t)
                timed(go, {**ours, "variant": f"packed, key tile {Bc}, {splits} splits", "packed": group > 1,
                           "splits": splits, "chosen": False, "tiling": {"warps": t.warps, "Bc": Bc},
                           "max_diff": float(np.abs(out.copy_to_host() - ref).max())})
            if group > 1:
                splits = tc.decode_splits("mma_f16", q.dtype, B, H, 1, Nk, D, D)[0]
                go, out, _ = launch(q, k, v, splits=splits, pack=False)
                timed(go, {**ours, "variant": f"each head its block, {splits} splits", "packed": False,
                           "splits": splits, "chosen": True, "tiling": {"warps": tiling.warps, "Bc": tiling.Bc},
                           "max_diff": float(np.abs(out.copy_to_host() - ref).max())})
            qt, kt, vt = (torch.from_numpy(np.asarray(x, np.float32)).to("cuda", torch.float16) for x in (q, k, v))
            for name, backend in (("torch_sdpa_flash", SDPBackend.FLASH_ATTENTION),
                                  ("torch_sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
                def go(backend=backend):
                    with sdpa_kernel(backend), torch.no_grad():
                        return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=group > 1)
                try:
                    timed(go, {**base, "impl": name, "runs_on": peer_runs_on(name, "float16"), "variant": "enable_gqa"})
                except Exception as error:  # noqa: BLE001 - a peer that refuses GQA is recorded, not fatal
                    bench.log(f"{name} D={D} group={group}: {type(error).__name__}: {str(error)[:200]}")
                    OUT.write({**base, "impl": name, "error": f"{type(error).__name__}: {str(error)[:300]}"})


PROFILE = [64, 8]     # main's --profile: D, query heads a K / V head


def part_profile():
    import torch.cuda.profiler as profiler
    from numba import cuda
    D, group = PROFILE
    B, H, Nk = 8, 16, 32768
    q, k, v = problem(B, H, H // group, 1, Nk, D, D, "float16", seed=3)
    splits = tc.decode_splits("mma_f16", q.dtype, B, H, 1, Nk, D, D, group=group)[0]
    go = launch(q, k, v, splits=splits)[0]
    go()
    go()
    cuda.synchronize()
    profiler.start()
    go()
    cuda.synchronize()
    profiler.stop()
    OUT.write({"benchmark": "gpu_decode_profile", "D": D, "group": group, "B": B, "H": H, "Nk": Nk, "splits": splits})


PARTS = {"check": part_check, "time": part_time, "profile": part_profile}


def main():
    global OUT, ENV
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--parts", nargs="+", default=["check", "time"], choices=list(PARTS))
    parser.add_argument("--profile", nargs=2, type=int, default=PROFILE, metavar=("D", "GROUP"),
                        help="the profile part's head dim and query heads a K / V head")
    args = parser.parse_args()
    PROFILE[:] = args.profile
    run, ENV = bench.new_run(), bench.gpu_environment()
    with bench.RecordFile(args.out, run=run, run_id=run, environment=ENV) as OUT:
        for part in args.parts:
            t0 = time.time()
            try:
                PARTS[part]()
            except Exception:  # noqa: BLE001 - one part failing leaves the others' records
                traceback.print_exc()
                OUT.write({"benchmark": f"gpu_decode_{part}", "error": traceback.format_exc()[-2000:]})
            bench.log(f"part {part}: {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()

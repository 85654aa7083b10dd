"""Start N ranks as processes, run a function on each under torch.distributed, collect what they return.

Every rank is a fresh *spawned* interpreter (never forked: Numba's threading
layer and gloo's threads do not survive a fork), with one thread for torch,
BLAS and Numba, so N ranks on an N-core machine do not fight over cores.

A distributed run must never hang its caller.  The parent watches every rank:
a rank that raises sends its traceback and the whole run stops with
``RankFailed`` naming it; a rank that dies without a word (killed, a crash in
native code) is seen by its exit code; a rank that is still running ``timeout``
seconds after every rank joined the group (starting an interpreter and
importing torch is not counted: ``startup_timeout`` bounds that) stops the run
with ``RankTimeout``, naming the ranks that finished and those that did not.  Either way every rank still alive is killed
before the error is raised: no orphan keeps a port or a core.

``fault=("raise", r)`` or ``("hang", r)`` makes rank r fail on purpose after
it joins the group (the drill the tests and the lecture run).
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue as queue_module
import socket
import time
import traceback

ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "NUMBA_NUM_THREADS": "1"}
FAULTS = ("raise", "hang")


class RankFailed(RuntimeError):
    """A rank raised or died; the message names it and carries its traceback or exit code."""


class RankTimeout(RuntimeError):
    """The run passed its deadline; the message names the ranks that had not finished."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def choose_backend(device: str) -> str:
    """NCCL for CUDA tensors when torch has it, gloo for CPU tensors."""
    import torch.distributed as dist
    if device == "cuda":
        if not dist.is_nccl_available():
            raise ValueError("device 'cuda' needs torch built with NCCL; this torch has none: use --device cpu")
        return "nccl"
    if device != "cpu":
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    return "gloo"


def rank_device(device: str, rank: int):
    """The torch device of a rank: its own GPU (rank modulo the GPUs this host has), or the CPU."""
    import torch
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' asked for, but torch sees no GPU here: use --device cpu")
        index = rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def _rank_main(target, rank, world_size, port, device, timeout, fault, args, results):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    try:
        dev = rank_device(device, rank)
        dist.init_process_group(choose_backend(device), init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, timeout=datetime.timedelta(seconds=timeout))
        results.put((rank, "ready", None))
        if fault and fault[1] == rank:
            if fault[0] == "raise":
                raise RuntimeError(f"fault injected on rank {rank}")
            time.sleep(10 * timeout + 60)   # "hang": the parent's deadline must end it
        result = target(rank, world_size, dev, *args)
        dist.barrier()
        dist.destroy_process_group()
        results.put((rank, "ok", result))
    except BaseException:  # noqa: BLE001 - everything a rank raises is reported to the parent
        results.put((rank, "error", traceback.format_exc()))
        raise SystemExit(1) from None   # the parent has the traceback


def run_ranks(target, world_size, args=(), *, device="cpu", timeout=120.0, fault=None, startup_timeout=120.0):
    """Run ``target(rank, world_size, torch_device, *args)`` on ``world_size`` spawned ranks.

    Returns the list of what each rank returned, in rank order.  Raises
    ``RankFailed`` or ``RankTimeout`` (every rank killed first) instead of hanging.
    ``target`` and ``args`` must be picklable (a module-level function).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if fault is not None and (fault[0] not in FAULTS or not 0 <= fault[1] < world_size):
        raise ValueError(f"fault must be (one of {FAULTS}, a rank below {world_size}), got {fault!r}")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    saved = {name: os.environ.get(name) for name in ONE_THREAD}
    os.environ.update(ONE_THREAD)   # the children inherit the environment at start
    try:
        procs = [ctx.Process(target=_rank_main, name=f"rank{r}", daemon=True,
                             args=(target, r, world_size, port, device, timeout, fault, args, results))
                 for r in range(world_size)]
        for p in procs:
            p.start()
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
    try:
        return _collect(procs, results, world_size, timeout, startup_timeout)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(5)


def _collect(procs, results, world_size, timeout, startup_timeout):
    done, ready, deadline = {}, set(), time.monotonic() + startup_timeout
    while len(done) < world_size:
        try:
            rank, status, payload = results.get(timeout=0.2)
        except queue_module.Empty:
            for r, p in enumerate(procs):
                if r not in done and p.exitcode not in (None, 0):
                    time.sleep(0.5)   # its own report may still be on the way
                    _drain(results, done)
                    if r not in done:
                        raise RankFailed(f"rank {r} died with exit code {p.exitcode} and no report "
                                         f"(killed, or a crash in native code); the run was stopped") from None
            if time.monotonic() > deadline:
                if len(ready) < world_size:
                    late = [r for r in range(world_size) if r not in ready]
                    raise RankTimeout(f"ranks {late} did not join the process group within "
                                      f"{startup_timeout:g} s; every rank was stopped") from None
                missing = [r for r in range(world_size) if r not in done]
                raise RankTimeout(f"ranks {missing} did not finish within {timeout:g} s of starting (ranks "
                                  f"{sorted(done)} did); every rank was stopped. One rank that hangs holds up "
                                  f"every rank that waits for it in a collective or a receive") from None
            continue
        if status == "ready":
            ready.add(rank)
            if len(ready) == world_size:
                deadline = time.monotonic() + timeout
            continue
        if status == "error":
            raise RankFailed(f"rank {rank} raised; the run was stopped. Its traceback:\n{payload}")
        done[rank] = payload
    return [done[r] for r in range(world_size)]


def _drain(results, done):
    while True:
        try:
            rank, status, payload = results.get_nowait()
        except queue_module.Empty:
            return
        if status == "error":
            raise RankFailed(f"rank {rank} raised; the run was stopped. Its traceback:\n{payload}")
        done[rank] = payload

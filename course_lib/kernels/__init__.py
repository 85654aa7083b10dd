"""The attention impls, by name: every kernel version of the course.

Each impl is a function ``attention_forward(q, k, v, opts, mask)`` taking
validated dense inputs (see ``core.options``) and returning ``(out, lse)``:
``IMPLS[name]`` says in which module it lives, under which name, with which
keyword arguments bound, and what that version changes.  Like llm.c's
``attention_forward.cu``, each version is a diff on the one before:

========================  =======================================================================  ===============
impl                      what it changes                                                                  TFLOP/s
========================  =======================================================================  ===============
``reference``             float64 ``softmax(Q K^T) V``: the truth every impl is checked on
``naive``                 the same math in the input dtype (chapter 01)
``flash_numpy``           tiles + online softmax, FA2 loop order: O stays on chip (ch. 05)
``flash_numpy_fa1``       FA1's loop order: key tiles outside, O, l, m back to HBM each step
``..._cpu_microkernel``   chapter 08: ``flash_numpy``'s loops compiled, a 4 x 2 micro-kernel
``flash_numba_cpu_blas``  the two tile matmuls by ``np.dot`` inside njit (SciPy's BLAS)
``..._cpu_rowvec``        a row's scores scaled, capped and masked with no branch per score
``..._cpu_balanced``      work items by cost, heaviest and lightest in turn: even runs
``..._cpu_tuned``         tiles sized by the L2; keys split across cores when items are few
``..._cpu_exp2``          base 2: the row max vectorised, exp2 and its sum in one loop
``..._cpu_wide``          PyTorch's tiles, 256 x 512: half as many BLAS calls, each longer
``..._cpu_scratch``       tile buffers allocated once per thread, not once per work item
``flash_numba_cpu``       items heaviest first, each thread taking the next from a shared counter
``flash_numba_cuda``      chapter 09: one thread per query row, K / V tiles in shared memory
``cuda_row``              chapter 10 starts from chapter 09's kernel, unchanged                       16.2 / 8.9 a
``cuda_row_exp2``         base 2: log2(e) folded into the scale, ``exp2`` one ``ex2.approx``          16.6 / 9.0 a
``cuda_tiled``            register micro-tiles: one shared load feeds RN (or RM) FMAs                  6.4 / 5.3 a
``cuda_tiled_unsigned``   unsigned shared indices: no wraparound test and add per access               7.5 / 7.0 a
``cuda_tiled_padded``     shared rows padded by one float: no TX-way bank conflict                   11.2 / 10.8 a
``cuda_tiled_prefetch``   the next K / V tile loaded into registers during this one                  13.4 / 10.5 b
``cuda_tiled_rebuilt``    ``tiled_vec4``'s kernel on 64 x 32 tiles, switches off, no prefetch        24.8 / 10.6 b
``cuda_tiled_shuffle``    row max and row sum by warp shuffles: one barrier a tile fewer             25.1 / 10.6 b
``cuda_tiled_reorder``    grid: heads fastest, the last query tiles (longest rows) first              24.4 / 9.1 b
``cuda_tiled_aligned``    the shared buffer declared 16-byte aligned                                  24.4 / 9.1 b
``cuda_tiled_vec4``       128 x 64 tiles over 256 threads (``tiled_aligned``: 64 x 32, 128)          24.9 / 13.7 b
``cuda_tiled_staged``     every K / V load of a tile in flight at once, a tile ahead                 30.4 / 33.6 a
``cuda_tuned``            ``cuda_tiled_staged`` with tile sizes and threads autotuned per D          30.4 / 33.5 d
``cuda_mma_f16``          fp16 / bf16 on the tensor cores (mma.sync inline PTX), P in registers    181.6 / 229.4 d
``cuda_mma_tf32``         float32 as one TF32 product: fails float32's tolerance, on purpose         42.1 / 44.1 c
``cuda_mma_3xtf32``       float32 as three TF32 products (hi hi + hi lo + lo hi): float32's          37.0 / 31.2 d
========================  =======================================================================  ===============

TFLOP/s: D = 64 / D = 128, B*H = 64, N = 4096, not causal, CUDA events around the kernel; float32,
and float16 for ``cuda_mma_f16``.  Each figure is from the newest run that timed its row at that
shape, named by its letter (a: notebooks/records/gpu_steps.jsonl, run 20261201T142142+0000, NVIDIA
H200; b: notebooks/records/gpu_steps_chain.jsonl, run 20261202T010153+0000, NVIDIA H200 (the median
of its alternated rounds); c: notebooks/records/gpu_mma.jsonl, run 20261202T151436+0000, NVIDIA
H200; d: notebooks/records/gpu_mma.jsonl, run 20261206T074745+0000, NVIDIA H100 80GB HBM3).
``python benchmarks/results.py`` writes this column from the records; the ratios to the peers of the
same runs are in benchmarks/README.md.

The tensor-core rows (chapter 11's GPU half, ``tensor_cores``) are inline PTX, listed on a
real GPU only (``gpu_only``): numba's simulator runs them too, their instructions emulated
(``tensor_cores.sim``), but only at the small shapes of their own sweep (tests/forward_mma_sim.py).  The CPU impls' times are in
notebooks/records/cpu_attention.jsonl and bench_cpu.jsonl.

Where an impl runs.  ``cuda``: a CUDA kernel, float32 only; without a GPU a
simulator runs it, one Python thread per CUDA thread, so it takes only small
shapes (tests give the CUDA impls their own small loops).  ``flash_numba_cuda``
runs in numba's simulator or in ``course_lib.cudacheck``; chapter 10's steps
need a GPU or numba's simulator (``NUMBA_ENABLE_CUDASIM=1``), and are not
listed by ``available_impls()`` where neither is.

Modules are imported on first use so that a missing optional package only
disables its own impl; any other failure to import (a bug, a syntax error, a
course module that is missing) is raised, with the impl's name, so that an
impl never silently drops out of ``available_impls()`` and out of every test
that loops over it.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import partial


@dataclass(frozen=True)
class Impl:
    """Where one impl lives and what it is."""

    module: str                              # the module that holds its function
    what: str                                # one line: what this version changes
    function: str = "attention_forward"      # the function's name in the module
    options: dict = field(default_factory=dict)   # keyword arguments bound to it
    cuda: bool = False                       # a CUDA kernel: float32 only, simulated (small shapes) without a GPU
    gpu_only: bool = False                   # inline PTX (the tensor cores): listed on a real GPU only


def _step(name, what):
    return Impl("course_lib.kernels.cuda_steps", what, "forward", {"step": name}, cuda=True)


def _mma_step(name, what):
    return Impl("course_lib.kernels.tensor_cores.forward", what, "mma_forward", {"step": name}, cuda=True,
                gpu_only=True)


def _cpu_step(name, what):
    return Impl("course_lib.kernels.cpu_steps", what, "flash_forward", {"step": name})


IMPLS = {
    "reference": Impl("course_lib.core.reference", "float64 softmax(Q K^T) V: the truth every impl is checked on"),
    "naive": Impl("course_lib.kernels.naive", "the same math in the input dtype (chapter 01)"),
    "flash_numpy": Impl("course_lib.kernels.flash_numpy", "tiles and online softmax, FA2 loop order (chapter 05)"),
    "flash_numpy_fa1": Impl("course_lib.kernels.flash_numpy", "FA1's loop order: O, l, m back to HBM every step",
                            "flash_forward", {"loop_order": "fa1"}),
    "flash_numba_cpu_microkernel": _cpu_step("microkernel", "flash_numpy's loops compiled, a 4 x 2 micro-kernel"),
    "flash_numba_cpu_blas": _cpu_step("blas", "tile matmuls by np.dot: SciPy's BLAS inside njit"),
    "flash_numba_cpu_rowvec": _cpu_step("rowvec", "scores scaled and masked by whole-row loops, no branch"),
    "flash_numba_cpu_balanced": _cpu_step("balanced", "work items by cost, heaviest and lightest in turn"),
    "flash_numba_cpu_tuned": _cpu_step("tuned", "tiles sized by the L2, keys split when items are few"),
    "flash_numba_cpu_exp2": _cpu_step("exp2", "base 2: the row max vectorised, exp2 and its sum in one loop"),
    "flash_numba_cpu_wide": _cpu_step("wide", "PyTorch's tiles (256 x 512), on the base-2 row pass"),
    "flash_numba_cpu_scratch": _cpu_step("scratch", "tile buffers allocated once per thread, not per work item"),
    "flash_numba_cpu": Impl("course_lib.kernels.cpu_steps",
                            "work items heaviest first, one at a time from a shared counter (chapter 08)"),
    "flash_numba_cuda": Impl("course_lib.kernels.flash_numba_cuda",
                             "one CUDA thread per query row, K / V tiles in shared memory (chapter 09)", cuda=True),
    "cuda_row": _step("row", "chapter 10's start: chapter 09's kernel, unchanged"),
    "cuda_row_exp2": _step("row_exp2", "base 2: log2(e) folded into the scale, exp2 one instruction"),
    "cuda_tiled": _step("tiled", "register micro-tiles: one shared load feeds many FMAs"),
    "cuda_tiled_unsigned": _step("tiled_unsigned", "unsigned shared indices: no wraparound code per access"),
    "cuda_tiled_padded": _step("tiled_padded", "shared rows padded by one float: no bank conflicts"),
    "cuda_tiled_prefetch": _step("tiled_prefetch", "the next K / V tile loaded into registers during this one"),
    "cuda_tiled_rebuilt": _step("tiled_rebuilt", "tiled_vec4's kernel on tiled_prefetch's tiling, switches off, no prefetch"),
    "cuda_tiled_shuffle": _step("tiled_shuffle", "row max and row sum by warp shuffles: one barrier a tile fewer"),
    "cuda_tiled_reorder": _step("tiled_reorder", "grid: heads fastest, the last query tiles first"),
    "cuda_tiled_aligned": _step("tiled_aligned", "the shared buffer declared 16-byte aligned"),
    "cuda_tiled_vec4": _step("tiled_vec4", "128 x 64 tiles over 256 threads (tiled_aligned: 64 x 32 over 128)"),
    "cuda_tiled_staged": _step("tiled_staged", "every K / V load of a tile in flight at once, a tile ahead"),
    "cuda_tuned": _step("tuned", "tiled_staged with tile sizes and threads autotuned per head dim"),
    "cuda_mma_f16": _mma_step("mma_f16", "float16 / bfloat16 on the tensor cores: mma.sync, P kept in registers"),
    "cuda_mma_tf32": _mma_step("mma_tf32", "float32 on the tf32 tensor cores, one product: not float32's accuracy"),
    "cuda_mma_3xtf32": _mma_step("mma_3xtf32", "float32 as three tf32 products (hi hi + hi lo + lo hi): float32's accuracy"),
}

# The backward impls (chapter 12): each an ``attention_backward(q, k, v, out, lse, dout, opts, mask)``
# returning (dq, dk, dv); validated by ``core.backward_options``.
BACKWARD_IMPLS = {
    "reference": Impl("course_lib.core.reference_backward", "float64, P materialised: the truth",
                      "attention_backward"),
    "naive": Impl("course_lib.core.reference_backward", "the same math in the input dtype", "naive_backward"),
    "flash_numpy": Impl("course_lib.kernels.backward_numpy", "FA2: K/V tiles outer, P recomputed, dQ in HBM",
                        "attention_backward"),
    "flash_numpy_fa1": Impl("course_lib.kernels.backward_numpy", "FA1: D_i recomputed from O_i every step",
                            "flash_backward", {"loop_order": "fa1"}),
    "flash_numba_cpu": Impl("course_lib.kernels.backward_numba_cpu",
                            "compiled, BLAS tiles: prange over key tiles, per-thread dQ partials merged", "attention_backward"),
    "flash_numba_cpu_dq_pass": Impl("course_lib.kernels.backward_numba_cpu",
                                    "compiled, BLAS tiles: dK, dV by key tiles, then dQ by a second pass",
                                    "attention_backward", {"dq": "second_pass"}),
    "flash_numba_cuda": Impl("course_lib.kernels.backward_numba_cuda",
                             "CUDA, float32 SIMT: a thread per key row for dK, dV (GQA summed there), then per query row for dQ",
                             "attention_backward", cuda=True),
    "cuda_mma_f16": Impl("course_lib.kernels.tensor_cores.backward",
                         "CUDA, float16 / bfloat16 on the tensor cores: the same two kernels, each product an mma.sync",
                         "attention_backward", cuda=True),
}

# Impls that compute attention for the learner; exercises may not call them.
COURSE_KERNELS = tuple(IMPLS)


def load(name, registry=IMPLS):
    """The function of impl ``name`` in ``registry`` (``IMPLS`` or ``BACKWARD_IMPLS``), or None when it
    is not usable here."""
    impl = registry[name]
    try:
        module = importlib.import_module(impl.module)
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] == "course_lib":
            raise ImportError(f"impl {name!r} failed to import: {error}") from error
        return None  # an optional package this impl needs is not installed
    except Exception as error:
        raise ImportError(f"impl {name!r} failed to import: {type(error).__name__}: {error}") from error
    available = getattr(module, "available", None)
    if available is not None and not available():
        return None
    forward = getattr(module, impl.function)
    return partial(forward, **impl.options) if impl.options else forward

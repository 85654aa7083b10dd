"""Chapters 11 and 12 on the tensor cores: FlashAttention's forward and backward with ``mma.sync``.

Like llm.c's ``attention_forward.cu``, the forward's versions live side by side, each kernel a diff on
the one before (``versions``; the impl registry, ``course_lib.kernels``, says how fast each step ran):

    plain      (a0) padded K / V tiles loaded a word at a time by each thread, B fragments read word by word
    staged     (a)  a thread's words of a tile all loaded into registers before any is stored
    prefetch   (b)  the same with the next tile's words in flight during this one
    ldmatrix   (c)  swizzled, unpadded tiles; K's (and, for halves, V's) B fragments by ``ldmatrix``
    cp_async   (d)  the tiles copied by ``cp.async`` into two stages, the next in flight (the default)

each for four kinds of operands: ``f16`` / ``bf16`` (step ``mma_f16``), ``tf32x1`` (``mma_tf32``: one TF32
product, short of float32's accuracy on purpose) and ``tf32x3`` (``mma_3xtf32``: three).  A tiling
(``MmaTiling``) picks the version (``version_of``).

    mma.py        the instructions as inline PTX (mma.sync, ldmatrix, cp.async, conversions) and the PTX
                  ISA's fragment tables
    sim.py        the same instructions emulated in Python, for numba's simulator
    layout.py     the host's side: tilings, tuned tables, kernel shapes, the swizzle, inputs as words
    fragments.py  what every forward version shares on the device: products, rules, online softmax
    loads.py      how the tiles reach shared memory: register-staged loads, cp.async
    versions.py   the forward kernels, one a version
    forward.py    plan, launch and run a forward step (``mma_forward``: impls ``cuda_mma_*``)
    backward.py   chapter 12's backward on the tensor cores (backward impl ``cuda_mma_f16``), two kernels

Both run on a GPU (inline PTX) and in numba's simulator, their instructions emulated (``sim``; a kernel calls
them through ``instructions.ops``), at small shapes.
"""
from ..cuda_steps.tiling import MAX_SHARED, STATIC_SHARED
from .forward import (
                       attention,
                       available,
                       decode_splits,
                       launcher,
                       make_mma_kernel,
                       mma_forward,
                       pack_decode,
                       packed_group,
                       plan,
                       version_of,
)
from .layout import (
                      DECODE_ROWS,
                      HALF_A,
                      INPUT_DTYPE,
                      KINDS,
                      RUN_CHAIN,
                      RUN_TUNED,
                      TENSOR_CORE_STEPS,
                      TF32_A,
                      TUNED,
                      TUNED_STAGED,
                      KernelShape,
                      MmaTiling,
                      decode_tiling,
                      default_tiling,
                      k_address,
                      k_rows,
                      kernel_shape,
                      kind_of,
                      padded,
                      shared_bytes,
                      staged_tiling,
                      swizzle,
                      tf32_key,
                      v_address,
                      v_rows,
                      v_word_address,
                      words,
)

__all__ = ["DECODE_ROWS", "HALF_A", "INPUT_DTYPE", "KINDS", "MAX_SHARED", "RUN_CHAIN", "RUN_TUNED", "STATIC_SHARED",
           "TENSOR_CORE_STEPS", "TF32_A", "TUNED", "TUNED_STAGED", "KernelShape", "MmaTiling", "attention",
           "available", "decode_splits", "decode_tiling", "default_tiling", "k_address", "k_rows", "kernel_shape",
           "kind_of", "launcher", "make_mma_kernel", "mma_forward", "pack_decode", "packed_group", "padded", "plan",
           "shared_bytes", "staged_tiling", "swizzle", "tf32_key", "v_address", "v_rows", "v_word_address", "version_of", "words"]

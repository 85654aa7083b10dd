"""The tensor cores from Numba: one warp-wide matrix multiply, ``mma.sync``, as inline PTX.

Numba has no tensor-core intrinsics, but it can emit any PTX instruction
through LLVM's inline assembly (``numba.cuda.extending.intrinsic``): the
instruction's operands are ordinary Numba values, so the fragments stay in
registers and the call costs nothing but the instruction (a linked CUDA C++
device function would pass them through memory on every call).  Two shapes:

- ``mma_f16`` / ``mma_bf16``: D (16 x 8, float32) = A (16 x 16, half) B (16 x 8, half) + C,
  ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`` (and ``.bf16``);
- ``mma_tf32``: D (16 x 8) = A (16 x 8, tf32) B (8 x 8, tf32) + C, ``m16n8k8``.

Each of a warp's 32 lanes holds a fixed part of each matrix, in 32-bit
registers ("words": two halves, or one tf32).  Where each word sits is the
PTX ISA's "Matrix fragments for mma" table, written here once as plain
functions of (lane, register) that the kernel compiles and the chapter draws:

- ``a_word(lane, reg)``: the (row, word) of A that register ``reg`` (0-3) holds;
- ``b_word(lane, reg)``: the (n, word) of B, B stored as n rows of k words
  (so that a row of K *is* a column of B: Q K^T needs no transpose);
- ``c_elem(lane, reg)``: the (row, column) of C / D that float ``reg`` (0-3) holds.

With g = lane // 4 and t = lane % 4: A's registers hold rows g and g + 8 and
words t and t + 4 of a 16 x 8-word tile; C's hold rows g and g + 8 and columns
2t, 2t + 1 of a 16 x 8 tile.  So the C fragments of two neighbouring 8-column
tiles, each pair of floats rounded to a half and packed into one word, are
exactly the A fragment of a 16 x 16 tile: P leaves Q K^T's accumulators and
enters P V without a move (FlashAttention-2's register reuse).

Conversions and moves, also single instructions: ``pack_f16`` / ``pack_bf16``
(two float32 to one word of halves, ``cvt.rn.f16x2.f32``), ``to_tf32``
(``cvt.rna.tf32.f32``), ``word_of`` / ``float_of`` (reinterpret the bits),
``prmt`` (pick two halves of two words).  The simulators cannot run inline
PTX: these kernels run on a GPU only.
"""
from __future__ import annotations

try:
    from llvmlite import ir
    from numba import cuda, types
    from numba.cuda.extending import intrinsic
except ModuleNotFoundError:   # numba (with numba-cuda) missing: the tensor-core steps are unavailable
    cuda = None


# -- where each lane's registers sit (the PTX ISA's fragment tables) ---------------------

def a_word(lane, reg):
    """A fragment (16 rows x 8 words): register ``reg`` of ``lane`` holds (row, word)."""
    return (lane >> 2) + 8 * (reg & 1), (lane & 3) + 4 * (reg >> 1)


def b_word(lane, reg):
    """B fragment (8 columns n, each 8 words of k): register ``reg`` of ``lane`` holds (n, word)."""
    return lane >> 2, (lane & 3) + 4 * reg


def c_elem(lane, reg):
    """C / D fragment (16 rows x 8 columns of float32): float ``reg`` of ``lane`` is (row, column)."""
    return (lane >> 2) + 8 * (reg >> 1), 2 * (lane & 3) + (reg & 1)


# -- the instructions --------------------------------------------------------------------

if cuda is not None:
    _F32, _I32 = ir.FloatType(), ir.IntType(32)
    _C4 = types.UniTuple(types.float32, 4)

    def _asm(builder, ret, args, text, constraints):
        fnty = ir.FunctionType(ret, [a.type for a in args])
        return builder.call(ir.InlineAsm(fnty, text, constraints), args)

    def _mma(shape_and_types):
        """An intrinsic for one ``mma.sync``: (4 A words, 2 B words, 4 floats of C) -> 4 floats of D."""
        text = (f"mma.sync.aligned.{shape_and_types} "
                "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};")
        constraints = ",".join(["=f"] * 4 + ["r"] * 6 + ["f"] * 4)

        @intrinsic
        def mma(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            def codegen(context, builder, sig, args):
                d = _asm(builder, ir.LiteralStructType([_F32] * 4), list(args), text, constraints)
                return context.make_tuple(builder, _C4, [builder.extract_value(d, i) for i in range(4)])
            return _C4(*([types.uint32] * 6 + [types.float32] * 4)), codegen
        return mma

    mma_f16 = _mma("m16n8k16.row.col.f32.f16.f16.f32")
    mma_bf16 = _mma("m16n8k16.row.col.f32.bf16.bf16.f32")
    mma_tf32 = _mma("m16n8k8.row.col.f32.tf32.tf32.f32")

    def _pack(kind):
        text = f"cvt.rn.{kind}x2.f32 $0, $2, $1;"     # the first source goes to the upper half

        @intrinsic
        def pack(typingctx, lo, hi):
            """Two float32 -> one word: ``lo`` rounded in the lower half, ``hi`` in the upper."""
            def codegen(context, builder, sig, args):
                return _asm(builder, _I32, list(args), text, "=r,f,f")
            return types.uint32(types.float32, types.float32), codegen
        return pack

    pack_f16 = _pack("f16")
    pack_bf16 = _pack("bf16")

    @intrinsic
    def to_tf32(typingctx, x):
        """float32 -> its nearest tf32 (10 mantissa bits), as a word."""
        def codegen(context, builder, sig, args):
            return _asm(builder, _I32, list(args), "cvt.rna.tf32.f32 $0, $1;", "=r,f")
        return types.uint32(types.float32), codegen

    @intrinsic
    def float_of(typingctx, w):
        """The float32 whose bits are the word ``w``."""
        def codegen(context, builder, sig, args):
            return _asm(builder, _F32, list(args), "mov.b32 $0, $1;", "=f,r")
        return types.float32(types.uint32), codegen

    @intrinsic
    def word_of(typingctx, x):
        """The bits of the float32 ``x``, as a word."""
        def codegen(context, builder, sig, args):
            return _asm(builder, _I32, list(args), "mov.b32 $0, $1;", "=r,f")
        return types.uint32(types.float32), codegen

    def _prmt(selector):
        text = f"prmt.b32 $0, $1, $2, {selector:#x};"

        @intrinsic
        def prmt(typingctx, a, b):
            def codegen(context, builder, sig, args):
                return _asm(builder, _I32, list(args), text, "=r,r,r")
            return types.uint32(types.uint32, types.uint32), codegen
        return prmt

    low_halves = _prmt(0x5410)    # (a, b) -> a word of a's lower half (below) and b's lower half (above)
    high_halves = _prmt(0x7632)   # the same with the upper halves

    a_word_gpu, b_word_gpu, c_elem_gpu = (cuda.jit(device=True)(f) for f in (a_word, b_word, c_elem))

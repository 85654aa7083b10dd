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
(``cvt.rna.tf32.f32``; ``round_tf32`` in integer arithmetic, for 3xTF32's split), ``word_of`` /
``float_of`` (reinterpret the bits),
``prmt`` (pick two halves of two words), ``max_nan`` (``max.NaN.f32``: the online softmax's max,
a NaN let through, in one instruction).

Two more for feeding the fragments from shared memory (steps c and d of chapter 11):

- ``ldmatrix_x4`` / ``ldmatrix_x4_trans``: four 8 x 8 matrices of halves from shared memory into one
  register each, ``ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16``.  Lane i gives the address of
  row ``i % 8`` of matrix ``i // 8`` (``ldmatrix_row``); register j of every lane then holds a word of
  matrix j (``ldmatrix_word``): row lane // 4, word lane % 4, or, transposed, the two halves of
  column lane // 4 in rows 2 (lane % 4) and 2 (lane % 4) + 1.  That is B's fragment for K (rows of
  keys, k along a row) as it is, and for V (rows of keys, dims along a row) transposed: one
  instruction instead of four 32-bit loads, and no transpose on the way into shared memory.
- ``cp_async16``, ``cp_async_commit``, ``cp_async_wait0`` / ``cp_async_wait1``: ``cp.async.cg``
  copies 16 bytes from global to shared memory without passing through registers (bytes past
  ``nbytes`` are zero-filled: a tile's rows past Nk), ``commit_group`` closes a batch of copies, and
  ``wait_group N`` waits until at most N batches are still in flight: double buffering.

The simulators cannot run inline PTX: ``sim`` emulates each of these instructions there, and a kernel
calls them through ``instructions.ops``, this module on a GPU and ``sim`` in numba's simulator.
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


def ldmatrix_row(lane):
    """ldmatrix.x4: lane gives the address of (matrix, row) (each row 8 halves = 4 words, 16 bytes)."""
    return lane >> 3, lane & 7


def ldmatrix_word(lane, reg, trans=False):
    """ldmatrix.x4: register ``reg`` of ``lane`` holds matrix ``reg``'s (row, word) as stored; transposed,
    (row0, row1, column): the halves of column ``column`` in rows row0 (lower half) and row1 (upper)."""
    if trans:
        return 2 * (lane & 3), 2 * (lane & 3) + 1, lane >> 2
    return lane >> 2, lane & 3


# -- the instructions --------------------------------------------------------------------

if cuda is not None:
    _F32, _I32 = ir.FloatType(), ir.IntType(32)
    _C4 = types.UniTuple(types.float32, 4)

    def _asm(builder, ret, args, text, constraints, side_effect=False):
        """One inline PTX instruction; ``side_effect`` (with a memory clobber in ``constraints``) for those
        that touch memory LLVM cannot see, so that they are neither dropped nor moved across others."""
        fnty = ir.FunctionType(ret, [a.type for a in args])
        return builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=side_effect), args)

    def _four(context, builder, tuple_type, d):
        """An asm result of four registers as a Numba tuple."""
        return context.make_tuple(builder, tuple_type, [builder.extract_value(d, i) for i in range(4)])

    def _mma(shape_and_types):
        """An intrinsic for one ``mma.sync``: (4 A words, 2 B words, 4 floats of C) -> 4 floats of D."""
        text = (f"mma.sync.aligned.{shape_and_types} "
                "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};")
        constraints = ",".join(["=f"] * 4 + ["r"] * 6 + ["f"] * 4)

        @intrinsic
        def mma(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            def codegen(context, builder, sig, args):
                d = _asm(builder, ir.LiteralStructType([_F32] * 4), list(args), text, constraints)
                return _four(context, builder, _C4, d)
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
    def round_tf32(typingctx, w):
        """A float32's word -> its tf32 rounded to nearest (ties away from zero), as ``to_tf32`` but in two
        integer instructions (add half a tf32 unit in the last place, clear the 13 bits tf32 drops), where
        ``cvt.rna.tf32.f32`` takes about six on sm_90.  The same for every finite float and infinity; a
        NaN may come out as an infinity, so it serves 3xTF32's split alone (whose remainder, x - hi, is then
        NaN and carries the NaN into the product), never a lone tf32 product."""
        def codegen(context, builder, sig, args):
            return _asm(builder, _I32, list(args), "{ .reg .b32 t; add.u32 t, $1, 4096; and.b32 $0, t, -8192; }",
                        "=r,r")
        return types.uint32(types.uint32), codegen

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

    def _shared_address(context, builder, aryty, ary, index, indexty):
        """The 32-bit shared-window address of word ``index`` of a 1-D shared array: the array's start
        turned back into a shared address once (Numba hands shared arrays around as generic pointers;
        ``cvta.to.shared``, an asm without side effects, so LLVM computes it once for every call), plus
        4 index in 32-bit arithmetic, whose constant parts LLVM folds into the instruction's offset."""
        a = context.make_array(aryty)(context, builder, ary)
        generic = builder.ptrtoint(a.data, ir.IntType(64))
        base = _asm(builder, _I32, [generic], "{ .reg .u64 t; cvta.to.shared.u64 t, $1; cvt.u32.u64 $0, t; }",
                    "=r,l")
        i = builder.trunc(context.cast(builder, index, indexty, types.intp), _I32)
        return builder.add(base, builder.shl(i, ir.Constant(_I32, 2)))

    def _ldmatrix(trans):
        text = ("ldmatrix.sync.aligned.m8n8.x4" + (".trans" if trans else "") +
                ".shared.b16 {$0,$1,$2,$3}, [$4];")

        @intrinsic
        def ldmatrix(typingctx, tile, index):
            """Four 8 x 8 matrices of halves: this lane's row starts at word ``index`` of ``tile``."""
            def codegen(context, builder, sig, args):
                address = _shared_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
                # a memory clobber: not moved across the barriers and copies that fill the tile
                d = _asm(builder, ir.LiteralStructType([_I32] * 4), [address], text, "=r,=r,=r,=r,r,~{memory}",
                         side_effect=True)
                return _four(context, builder, _U4, d)
            return _U4(tile, index), codegen
        return ldmatrix

    _U4 = types.UniTuple(types.uint32, 4)
    ldmatrix_x4 = _ldmatrix(False)
    ldmatrix_x4_trans = _ldmatrix(True)

    @intrinsic
    def cp_async16(typingctx, tile, index, src, word, nbytes):
        """16 bytes from word ``word`` of ``src`` (a C-contiguous array, its words counted flat: one head's
        (keys, words) rows) to ``tile[index:index + 4]``, asynchronously; only the first ``nbytes`` are
        read, the rest of the 16 are zeros.  ``word`` in 32 bits: one head's K or V is far below 2**31 words."""
        def codegen(context, builder, sig, args):
            dst = _shared_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            s = context.make_array(sig.args[2])(context, builder, args[2])
            w = builder.trunc(context.cast(builder, args[3], sig.args[3], types.intp), _I32)
            ptr = builder.gep(s.data, [builder.sext(w, ir.IntType(64))])
            size = context.cast(builder, args[4], sig.args[4], types.uint32)
            text = "{ .reg .u64 g; cvta.to.global.u64 g, $1; cp.async.cg.shared.global [$0], [g], 16, $2; }"
            _asm(builder, ir.VoidType(), [dst, builder.ptrtoint(ptr, ir.IntType(64)), size], text,
                 "r,l,r,~{memory}", side_effect=True)
            return context.get_dummy_value()
        return types.void(tile, index, src, word, nbytes), codegen

    @intrinsic
    def max_nan(typingctx, a, b):
        """max(a, b) with a NaN from either side let through, as ``rules.max_nan``: one ``max.NaN.f32``
        (sm_80 on), where the rule written in Python compiles to a compare and two selects."""
        def codegen(context, builder, sig, args):
            return _asm(builder, _F32, list(args), "max.NaN.f32 $0, $1, $2;", "=f,f,f")
        return types.float32(types.float32, types.float32), codegen

    def _bare(text):
        @intrinsic
        def op(typingctx):
            def codegen(context, builder, sig, args):
                _asm(builder, ir.VoidType(), [], text, "~{memory}", side_effect=True)
                return context.get_dummy_value()
            return types.void(), codegen
        return op

    cp_async_commit = _bare("cp.async.commit_group;")
    cp_async_wait0 = _bare("cp.async.wait_group 0;")    # every batch of copies has landed
    cp_async_wait1 = _bare("cp.async.wait_group 1;")    # all but the newest batch have

    a_word_gpu, b_word_gpu, c_elem_gpu = (cuda.jit(device=True)(f) for f in (a_word, b_word, c_elem))
    shfl_xor_sync = getattr(cuda, "shfl_xor_sync", None)   # numba's own; the simulator has none (``sim``'s)

"""``dot_add(a, b, out)``: out += a @ b on tiles, inside njit, in one BLAS call.

``np.dot(a, b, out)`` inside njit calls the BLAS's gemm with beta = 0, so a
kernel that accumulates (the backward's dVj += Pij^T dOi, dKj += dSij^T Q'i,
dQi += dSij Kj) needs a scratch tile and a second pass over it to add.  gemm
computes C = alpha A B + beta C; with beta = 1 the addition happens inside
the matmul, on the tile while it is in registers.  This is the same call
``np.dot`` makes (numba's ``numba_xxgemm``, SciPy's BLAS), with beta = 1:
2-D float32 or float64 arrays, a and b in C or F order (a transposed view of a
C tile is F, so ``dot_add(P.T, dO, dV)`` feeds BLAS without a copy), out in C order.
"""
from __future__ import annotations

try:
    import numba
except ModuleNotFoundError:  # an optional package missing: the impl is unavailable, nothing else
    numba = None

if numba is not None:
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic
    from numba.np import linalg

    def _contiguous_2d(t):
        return isinstance(t, types.Array) and t.ndim == 2 and t.layout in "CF" \
            and t.dtype in (types.float32, types.float64)

    @intrinsic
    def _gemm_add(typingctx, a, b, out):
        """out (m, n) += a (m, k) @ b (k, n): BLAS gemm with alpha = beta = 1 (shapes checked by the caller)."""
        if not (all(_contiguous_2d(t) for t in (a, b, out)) and out.layout == "C" and a.dtype == b.dtype == out.dtype):
            return None
        sig = types.none(a, b, out)

        def codegen(context, builder, sig, args):
            linalg.ensure_blas()
            x_type, y_type, out_type = sig.args
            x, y, z = (context.make_array(t)(context, builder, v) for t, v in zip(sig.args, args))
            m, k = cgutils.unpack_tuple(builder, x.shape)
            _, n = cgutils.unpack_tuple(builder, y.shape)
            fnty = ir.FunctionType(ir.IntType(32), [linalg.ll_char, linalg.ll_char, linalg.ll_char,
                                                    linalg.intp_t, linalg.intp_t, linalg.intp_t,
                                                    linalg.ll_void_p, linalg.ll_void_p, linalg.intp_t,
                                                    linalg.ll_void_p, linalg.intp_t, linalg.ll_void_p,
                                                    linalg.ll_void_p, linalg.intp_t])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "numba_xxgemm")
            one = linalg.make_constant_slot(context, builder, x_type.dtype, 1.0)

            def param(ty, shapes, data):   # as np.dot's: transpose when the layout differs from out's
                trans = ir.Constant(linalg.ll_char, ord("n" if ty.layout == out_type.layout else "t"))
                return trans, shapes[1] if ty.layout == "C" else shapes[0], builder.bitcast(data, linalg.ll_void_p)

            # row-major out = a b is column-major out^T = b^T a^T: BLAS gets b first, then a
            transa, lda, data_a = param(y_type, cgutils.unpack_tuple(builder, y.shape), y.data)
            transb, ldb, data_b = param(x_type, cgutils.unpack_tuple(builder, x.shape), x.data)
            kind = ir.Constant(linalg.ll_char, ord(linalg.get_blas_kind(x_type.dtype)))
            one_p = builder.bitcast(one, linalg.ll_void_p)
            res = builder.call(fn, (kind, transa, transb, n, m, k, one_p, data_a, lda, data_b, ldb,
                                    one_p, builder.bitcast(z.data, linalg.ll_void_p), n))
            linalg.check_blas_return(context, builder, res)
            return context.get_dummy_value()

        return sig, codegen

    @numba.njit(cache=True)
    def dot_add(a, b, out):
        """out += a @ b for 2-D float tiles (a, b in C or F order, out in C order): one gemm, no scratch tile."""
        m, k = a.shape
        k2, n = b.shape
        if k2 != k or out.shape[0] != m or out.shape[1] != n:
            raise ValueError("dot_add: shapes do not match (a is (m, k), b (k, n), out (m, n))")
        if m == 0 or n == 0 or k == 0:
            return
        _gemm_add(a, b, out)

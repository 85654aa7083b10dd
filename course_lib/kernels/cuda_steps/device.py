"""What every step's kernel shares on the device.

- the scalar rules (mask, softcap, ALiBi's rebased distance, the online-softmax step in
  base 2, finalize): ``course_lib.core.rules``, as chapter 09's module compiled
  them for the GPU;
- ``SIMULATOR``: True when numba's simulator runs the kernels (it has no warp
  shuffles, takes no shared-memory alignment and checks every array's bounds,
  so the vectorised kernels say a few things differently there);
- ``on_gpu``: whether a real GPU runs them;
- ``tile_slot``: where each of a thread's loads of a K / V tile falls;
- a ``Tiling`` and a ``Layout`` (``tiling``) handed to a kernel or a device
  function are compile-time constants: numba reads each of their attributes as
  a literal number, as it reads a number a kernel's closure holds, so that
  ``cuda.local.array(T.rm, ...)`` has a fixed size and every loop over it
  unrolls.  (The simulator runs the kernels as Python and reads them as Python.)
"""
from __future__ import annotations

try:
    import numba
    from numba import cuda
except ModuleNotFoundError:  # numba (with numba-cuda) missing: the steps are unavailable
    numba = None

from .. import flash_numba_cuda as ch09
from .tiling import Layout, Tiling

SIMULATOR = numba is not None and bool(numba.config.ENABLE_CUDASIM)

if numba is not None:
    visible, softcap, max_nan = ch09.visible, ch09.softcap, ch09.max_nan
    alibi_rebased_distance = ch09.alibi_rebased_distance
    shift_of, rescale_exp2, finalize = ch09.shift_of, ch09.rescale_exp2, ch09.finalize


def _compile_time_constants(*classes):
    """numba's type for an instance of ``classes``: the instance itself, each attribute a literal."""
    from numba.cuda import types
    from numba.cuda.core.imputils import lower_constant
    from numba.cuda.datamodel import models
    from numba.cuda.extending import infer_getattr, lower_getattr_generic, register_model, typeof_impl
    from numba.cuda.typing.templates import AttributeTemplate

    class Constants(types.Dummy):
        def __init__(self, value):
            self.value = value
            super().__init__(f"Constants({value})")

        @property
        def key(self):
            return self.value

    register_model(Constants)(models.OpaqueModel)
    for cls in classes:
        typeof_impl.register(cls)(lambda value, c: Constants(value))

    @infer_getattr
    class ConstantAttributes(AttributeTemplate):
        key = Constants

        def generic_resolve(self, ty, attr):
            return types.literal(getattr(ty.value, attr))

    @lower_getattr_generic(Constants)
    def attribute(context, builder, ty, value, attr):
        constant = getattr(ty.value, attr)
        return context.get_constant(numba.typeof(constant), constant)

    @lower_constant(Constants)
    def instance(context, builder, ty, value):
        return context.get_dummy_value()     # nothing to pass at run time: every attribute is in the code


if numba is not None and not SIMULATOR:
    _compile_time_constants(Tiling, Layout)


def on_gpu() -> bool:
    return ch09.on_gpu()


def jit_options(tiling):
    """The options every micro-tiled kernel is compiled with: fast math, and the Tiling's register cap."""
    return {"fastmath": True, **({} if SIMULATOR or not tiling.max_regs else {"max_registers": tiling.max_regs})}


if numba is not None:
    @cuda.jit(device=True)
    def tile_slot(T, W, u, t, row0, col):
        """Where the u-th of thread t's loads falls when the T.threads threads of a block load a T.Bc x W
        tile: (row c, column, whether it is inside the tile).  When the threads cover whole rows
        (T.threads % W == 0), thread t always loads column ``col`` = t % W of rows ``row0`` +
        (T.threads // W) u, with ``row0`` = t // W (both computed once, before the loops); otherwise
        it walks the flat tile."""
        rows = max(1, T.threads // W)
        if T.threads % W == 0:
            c = row0 + u * rows
            return c, col, T.Bc % rows == 0 or c < T.Bc
        x = t + u * T.threads
        return x // W, x % W, x < T.Bc * W

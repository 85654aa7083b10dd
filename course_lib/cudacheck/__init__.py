"""cudacheck: run a ``numba.cuda`` kernel in a tracing simulator and report what a GPU would hide.

    import numba
    from numba import cuda
    from course_lib import cudacheck

    @cuda.jit
    def reverse(a, out):                       # out[i] = a[block end - 1 - i], one block at a time
        tile = cuda.shared.array(64, numba.float32)
        t, i = cuda.threadIdx.x, cuda.grid(1)
        tile[t] = a[i]
        cuda.syncthreads()                     # delete this line and cudacheck names the race
        out[i] = tile[cuda.blockDim.x - 1 - t]

    report = cudacheck.check(reverse, 2, 64, a, out)    # what reverse[2, 64](a, out) would do
    print(report)                              # one-line verdict, then one paragraph per problem
    assert report.ok, report

The kernel is the ordinary ``@cuda.jit`` function (or the plain Python function
under it): cudacheck runs its Python body with ``cuda`` replaced by a tracing
twin, the same trick numba's own simulator uses, and follows calls into
``@cuda.jit(device=True)`` helpers.  Arguments are what the launch would take:
numpy arrays (copied in, and copied back if writable, as a launch does), device
arrays, scalars, ``uninitialized(shape, dtype)`` where the GPU code would pass
``cuda.device_array`` (memory nobody has written yet) and ``to_device(array)``
where it would pass ``cuda.to_device(array)`` (slices of it, ``x[1:]``, are
views of one device array, as slices of a device array are).

It runs the kernel as the GPU would, not as Python would: a ``cuda.shared.array``
is one array for the block, however often its declaration runs (a device
function called twice, a loop's every trip); one device array passed as two
arguments (or two overlapping slices of it) is one buffer; ``math`` and ``/``
give IEEE results (``log(0.0)`` is -inf and ``1.0 / 0.0`` inf, not errors), an
integer cast such as ``int16(x)`` wraps to the type's width, and an integer
array's elements read as wide integers, as numba widens them before arithmetic.

What it reports, naming the block and thread, the array, the index and the line:
- ``race``: an element written by one thread and read or written by another
  with no ``cuda.syncthreads()`` between them (same block, same barrier
  interval), or by threads of two different blocks (nothing orders blocks);
- ``barrier``: threads of a block waiting at different ``syncthreads`` calls,
  or some threads finishing the kernel while others wait at one;
- ``out_of_bounds``: an index outside an axis of a global, shared or local
  array (also a negative one, which numba silently wraps to the other end);
- ``uninitialized``: a read of shared or local memory, or of an
  ``uninitialized`` argument, that nothing wrote earlier in this launch (an
  atomic update of such an element too), or a shuffle reading a lane its mask
  does not name;
- ``integer_overflow``: a value stored into an integer element too narrow for
  it (an int8 accumulator, an unclamped requantization): the GPU keeps the low
  bits without a word.  An explicit cast (``int16(x)``) wraps silently: the
  kernel asked for that width.

Why its verdicts never depend on luck: each CUDA thread is a Python thread,
but only one runs at a time, in a fixed order.  Thread 0 runs until it reaches
a barrier (or the end), then thread 1, and so on; when every thread of the
block waits, the next barrier interval begins; blocks run one after another.
A race is found from the log of who touched each element in which interval,
not from a bad interleaving happening to show up, so a kernel that is racy is
flagged on every run, and a kernel that is not is never flagged.

Warp shuffles and votes (``shfl(_up/_down/_xor)_sync``, ``all/any/ballot_sync``)
exchange values among the lanes waiting at them; a lane that the mask names and
that never comes is a ``barrier`` finding.  ``syncwarp(mask)`` is a barrier of
the lanes its mask names, with the same rule, and orders their memory accesses;
``activemask()`` gives the lanes of the warp that reached that call together.
``MODELLED`` lists what of ``cuda`` a kernel may use.  Not modelled (each raises
a clear error if a kernel uses it): dynamic shared memory, cooperative groups.
Its cost is a few microseconds per memory access: a tiled attention kernel on a
2 x 2 grid of 32 threads checks in a second or two.

The modules, in the order a launch meets them: ``binding`` (the kernel's
function rebound to ``fakecuda``, the ``cuda`` it sees, and to ``gpumath``),
``checked_launch`` (arguments in and out, allocations), ``serial`` (one thread at a
time, barriers) and ``warps`` (shuffles and votes), ``memory`` (traced arrays)
and ``hazards`` (the access log: races, bounds, uninitialized reads, fences),
``report`` (what was found); ``grid`` and ``sites`` name threads and source
lines in its messages.  ``corpus`` holds kernels with planted bugs and their
fixed twins, ``sanitizer_record`` what NVIDIA's compute-sanitizer said of them.
Nothing here imports the rest of ``course_lib``: the grader's kernel sandbox
holds this package alone.
"""
from __future__ import annotations

from .binding import STANDIN, SourceKernel, python_function
from .checked_launch import Launch
from .fakecuda import MODELLED, WARP_SIZE
from .grid import Dim3, dim3
from .memory import DeviceArray, TracedArray, Uninitialized, to_device, uninitialized
from .report import KINDS, Finding, KernelError, Report

__all__ = ["check", "Report", "Finding", "KernelError", "KINDS", "uninitialized", "Uninitialized", "to_device",
           "DeviceArray", "STANDIN", "SourceKernel", "TracedArray", "Dim3", "WARP_SIZE", "MODELLED"]


def check(kernel, griddim, blockdim, *args) -> Report:
    """Run ``kernel[griddim, blockdim](*args)`` in the tracing simulator and report what it found.

    ``kernel``: a ``@cuda.jit`` kernel (from the real numba.cuda or its
    simulator) or the plain Python function under it.  ``griddim`` and
    ``blockdim``: an int or a tuple of up to 3 ints, as in a launch.  Arrays in
    ``args`` are written back after the run, as a launch with host arrays does.
    """
    elsewhere = getattr(type(kernel), "__cudacheck__", None)
    if elsewhere is not None:   # a kernel checked in another process (the grader's sandbox) says so
        return elsewhere(kernel, griddim, blockdim, *args)
    fn = python_function(kernel, "kernel")
    launch = Launch(fn, dim3(griddim, "griddim"), dim3(blockdim, "blockdim"), args)
    return launch.run()

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
arrays, scalars, and ``uninitialized(shape, dtype)`` where the GPU code would
pass ``cuda.device_array`` (memory nobody has written yet).

What it reports, naming the block and thread, the array, the index and the line:
- ``race``: an element written by one thread and read or written by another
  with no ``cuda.syncthreads()`` between them (same block, same barrier
  interval), or by threads of two different blocks (nothing orders blocks);
- ``barrier``: threads of a block waiting at different ``syncthreads`` calls,
  or some threads finishing the kernel while others wait at one;
- ``out_of_bounds``: an index outside an axis of a global, shared or local
  array (also a negative one, which numba silently wraps to the other end);
- ``uninitialized``: a read of shared or local memory, or of an
  ``uninitialized`` argument, that nothing wrote earlier in this launch.

Why its verdicts never depend on luck: each CUDA thread is a Python thread,
but only one runs at a time, in a fixed order.  Thread 0 runs until it reaches
a barrier (or the end), then thread 1, and so on; when every thread of the
block waits, the next barrier interval begins; blocks run one after another.
A race is found from the log of who touched each element in which interval,
not from a bad interleaving happening to show up, so a kernel that is racy is
flagged on every run, and a kernel that is not is never flagged.

Not modelled (each raises a clear error if a kernel uses it): warp shuffles and
votes, ``syncwarp``, dynamic shared memory, cooperative groups.  Its cost is
a few microseconds per memory access: a tiled attention kernel on a 2 x 2 grid
of 32 threads checks in a second or two.
"""
from __future__ import annotations

import inspect
import linecache
import re
import sys
import threading
import traceback
import types
from dataclasses import dataclass, field

import numpy as np

KINDS = ("race", "barrier", "out_of_bounds", "uninitialized")
WARP_SIZE = 32

# ---------------------------------------------------------------- the report


@dataclass
class Finding:
    """One problem, as the first thread that showed it saw it; ``count`` says how often it recurred."""
    kind: str                  # one of KINDS
    message: str               # the paragraph a learner reads: who, what, where, and what to do
    block: tuple               # blockIdx of the thread that showed it
    thread: tuple              # its threadIdx
    array: str | None = None   # the array's name, e.g. "shared array `tile`"
    index: tuple | None = None
    line: int | None = None    # the source line of the access (or barrier)
    count: int = 1

    def __str__(self):
        times = f" ({self.count} times)" if self.count > 1 else ""
        return f"{self.kind}{times}: {self.message}"


@dataclass
class Report:
    """What one checked launch found.  ``str(report)``: the verdict line, then one paragraph per problem."""
    kernel: str
    griddim: tuple
    blockdim: tuple
    findings: list = field(default_factory=list)
    intervals: int = 0          # barrier intervals run, summed over blocks
    traffic: dict = field(default_factory=dict)  # {"global reads": n, "global writes": n, "shared reads": ...}
    global_reads: dict = field(default_factory=dict)  # reads of each global array, by argument name: {"k": n, ...}

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def kinds(self) -> set:
        return {f.kind for f in self.findings}

    def launch(self) -> str:
        grid, block = (d[0] if len(d) == 1 else d for d in (self.griddim, self.blockdim))
        return f"{self.kernel}[grid {grid}, block {block}]"

    def __str__(self):
        if self.ok:
            moved = ", ".join(f"{n} {what if n > 1 else what[:-1]}" for what, n in self.traffic.items() if n)
            return (f"cudacheck {self.launch()}: no races, barrier errors, out-of-bounds or uninitialized "
                    f"reads ({moved or 'no memory accesses'})")
        n = len(self.findings)
        lines = [f"cudacheck {self.launch()}: {n} problem{'s' if n > 1 else ''}"]
        lines += [f"- {f}" for f in self.findings]
        return "\n".join(lines)


class KernelError(RuntimeError):
    """The kernel's own Python code raised; the message names the thread and the line."""


def uninitialized(shape, dtype=np.float32):
    """An argument standing for ``cuda.device_array(shape, dtype)``: GPU memory nobody has written yet.

    After the check, ``copy_to_host()`` gives what the kernel left in it.
    """
    shape = (shape,) if isinstance(shape, (int, np.integer)) else shape
    return Uninitialized(tuple(int(n) for n in shape), _numpy_dtype(dtype))


class Uninitialized:
    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype
        self._host = None

    def copy_to_host(self):
        if self._host is None:
            raise RuntimeError("this uninitialized array has not been through cudacheck.check yet")
        return self._host.copy()


# ----------------------------------------------------------------- check()


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
    fn = _python_function(kernel, "kernel")
    launch = _Launch(fn, _dim3(griddim, "griddim"), _dim3(blockdim, "blockdim"), args)
    return launch.run()


class SourceKernel:
    """A ``@cuda.jit`` function defined where there is no numba: what ``STANDIN.jit`` makes of it.

    The grader defines a learner's kernels from their source in a sandbox that has
    cudacheck but no numba; ``cuda.jit`` there is ``STANDIN.jit``, and cudacheck treats
    the result as it treats a numba kernel (``py_func`` is the Python body).
    """

    def __init__(self, py_func, device=False):
        self.py_func, self.device = py_func, device
        self.__name__ = py_func.__name__

    def __call__(self, *args):  # a device function called outside a checked kernel
        raise TypeError(f"{self.__name__} is a kernel for cudacheck.check, not a Python function")


class _CudaStandIn:
    """``cuda`` while kernels are defined without numba: only ``cuda.jit`` means anything then;
    inside a checked kernel cudacheck puts its tracing twin in its place, as for numba's."""

    def jit(self, fn=None, *signature, device=False, **options):
        if isinstance(fn, types.FunctionType):
            return SourceKernel(fn, device)
        return lambda f: SourceKernel(f, device)   # @cuda.jit(...) with options or a signature


STANDIN = _CudaStandIn()


# ---------------------------------------------------------- dims and names


def _dim3(dim, what):
    dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, (int, np.integer)) and d >= 1 for d in dims):
        raise ValueError(f"{what} must be a positive int or a tuple of 1 to 3 positive ints, got {dim!r}")
    return tuple(int(d) for d in dims)


class Dim3(tuple):
    """(x, y, z), readable as ``.x``, ``.y``, ``.z`` like ``cuda.threadIdx``."""
    x = property(lambda self: self[0])
    y = property(lambda self: self[1])
    z = property(lambda self: self[2])


def _padded(dims):
    return Dim3(tuple(dims) + (1,) * (3 - len(dims)))


def _unravel(linear, dims):
    x, y, z = _padded(dims)
    return Dim3((linear % x, linear // x % y, linear // (x * y)))


def _name(idx, ndim):
    """(5, 0, 0) in a 1-D launch reads as 5; in a 2-D one as (5, 0)."""
    return str(idx[0]) if ndim == 1 else str(tuple(idx[:ndim]))


def _threads(tids, blockdim):
    """Linear thread numbers of one block, in words: 'threads 0-15, 32-47'."""
    plural = "s" if len(tids) > 1 else ""
    if len(blockdim) > 1:
        shown = ", ".join(_name(_unravel(t, blockdim), len(blockdim)) for t in tids[:3])
        return f"thread{plural} {shown}" + (f" and {len(tids) - 3} more" if len(tids) > 3 else "")
    runs = []
    for t in tids:
        if runs and t == runs[-1][1] + 1:
            runs[-1][1] = t
        else:
            runs.append([t, t])
    return f"thread{plural} " + ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _where(site):
    """'line 17 of reverse (`out[i] = tile[t]`)'."""
    code, line = site
    text = linecache.getline(code.co_filename, line).split("  #")[0].strip()
    return f"line {line} of {code.co_name}" + (f" (`{text}`)" if text else "")


def _declared_name(site, fallback):
    """The variable a ``cuda.shared.array`` / ``cuda.local.array`` line assigns to."""
    code, line = site
    m = re.match(r"\s*(\w+)\s*(?::[^=]*)?=", linecache.getline(code.co_filename, line))
    return m.group(1) if m else fallback


def _numpy_dtype(dtype):
    try:
        return np.dtype(dtype)
    except TypeError:
        from numba.np import numpy_support  # a numba type such as numba.float32
        return numpy_support.as_dtype(dtype)


def _junk(dtype):
    """What never-written memory holds here: NaN, or the largest int (an index that far is out of bounds)."""
    if dtype.kind == "f" or dtype.kind == "c":
        return np.nan
    if dtype.kind == "b":
        return True
    return np.iinfo(dtype).max


# ------------------------------------------------------------------ memory


class _Memory:
    """One allocation: its data, and who touched each element when, for the checks."""

    def __init__(self, launch, name, space, data, initialized):
        self.launch, self.name, self.space = launch, name, space   # space: global | shared | local
        self.data = data                 # C-contiguous: element keys are flat indices
        self.flat = data.reshape(-1)
        self.initialized = initialized   # False: a read of an element never written is reported
        self.private = space == "local"  # one thread's own: no races possible
        self.writes = {}   # flat index -> (thread, interval, site, atomic) of the last write
        self.reads = {}    # flat index -> [interval, thread, site, other thread, other site, older-block thread, site]
        self.n_reads = self.n_writes = 0

    def title(self):
        return f"{self.space} array `{self.name}`" if self.space != "global" else f"`{self.name}`"


class TracedArray:
    """A numba array as the kernel sees it: indexing goes through the checks."""
    __slots__ = ("_mem", "_offset", "_strides", "_view", "name", "shape", "ndim", "dtype", "size")

    def __init__(self, mem, view, name):
        self._mem, self._view, self.name = mem, view, name
        item = view.itemsize
        self._offset = (view.__array_interface__["data"][0] - mem.data.__array_interface__["data"][0]) // item
        self._strides = tuple(s // item for s in view.strides)
        self.shape, self.ndim, self.dtype, self.size = view.shape, view.ndim, view.dtype, view.size

    def __len__(self):
        return self.shape[0]

    def __repr__(self):
        return f"<{self._mem.space} array {self.name} {self.dtype}{list(self.shape)}>"

    def _locate(self, index, access, frame):
        """The flat key of the element ``index`` names, a sub-array, or None when out of bounds."""
        if type(index) is not tuple:
            index = (index,)
        if len(index) != self.ndim or not all(type(i) is int for i in index):
            index = tuple(_as_index(i, self.name) for i in index)
            if len(index) > self.ndim:
                raise IndexError(f"{self.name} has {self.ndim} axes, indexed with {len(index)}: {index}")
            if len(index) < self.ndim or any(type(i) is slice for i in index):
                return self._subarray(index, access, frame)
        key = self._offset
        for axis, (i, n, s) in enumerate(zip(index, self.shape, self._strides)):
            if i < 0 or i >= n:
                self._mem.launch.out_of_bounds(self, index, axis, access, frame)
                if not -n <= i < 0:
                    return None
                i += n   # numba wraps a negative index, as Python does
            key += i * s
        return key

    def _subarray(self, index, access, frame):
        for axis, i in enumerate(index):
            if type(i) is int and not 0 <= i < self.shape[axis]:
                self._mem.launch.out_of_bounds(self, index, axis, access, frame)
                if not -self.shape[axis] <= i < 0:   # nowhere to point: scratch memory, so the kernel runs on
                    return _detached(self._mem.launch, self.name, np.zeros(_sub_shape(self.shape, index),
                                                                           self.dtype))
        name = f"{self.name}[{', '.join(_index_text(i) for i in index)}]"
        return TracedArray(self._mem, self._view[index], name)

    def _fast_key(self, index):
        """The flat key of an in-bounds element named by plain ints (nearly every access), else None."""
        if type(index) is int:
            if self.ndim == 1 and 0 <= index < self.shape[0]:
                return self._offset + index * self._strides[0]
            return None
        if type(index) is not tuple or len(index) != self.ndim:
            return None
        key = self._offset
        for i, n, s in zip(index, self.shape, self._strides):
            if type(i) is not int or not 0 <= i < n:
                return None
            key += i * s
        return key

    def __getitem__(self, index):
        frame = sys._getframe(1)
        key = self._fast_key(index)
        if key is not None:
            return self._mem.launch.read(self._mem, key, self, index, frame)
        key = self._locate(index, "reads", frame)
        if type(key) is int:
            return self._mem.launch.read(self._mem, key, self, index, frame)
        if key is None:
            return self.dtype.type(_junk(self.dtype))
        return key

    def __setitem__(self, index, value):
        frame = sys._getframe(1)
        key = self._fast_key(index)
        if key is not None:
            return self._mem.launch.write(self._mem, key, self, index, frame, value)
        key = self._locate(index, "writes", frame)
        if type(key) is int:
            self._mem.launch.write(self._mem, key, self, index, frame, value)
        elif key is not None:
            raise TypeError(f"cudacheck models element assignments only: `{self.name}[{index}] = ...` "
                            "assigns a whole sub-array; write a loop over its elements")


def _as_index(i, name):
    if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer, slice)):
        raise TypeError(f"index into {name} must be an integer, got {type(i).__name__} {i!r}: "
                        "use // for integer division, or int(...)")
    return i if type(i) is slice else int(i)


def _index_text(i):
    if type(i) is slice:
        return ":" if i == slice(None) else f"{'' if i.start is None else i.start}:{'' if i.stop is None else i.stop}"
    return str(i)


def _sub_shape(shape, index):
    kept = [len(range(n)[i]) for i, n in zip(index, shape) if type(i) is slice]
    return tuple(kept) + tuple(shape[len(index):])


def _detached(launch, name, data):
    return TracedArray(_Memory(launch, name, "local", data, True), data, name)


# ------------------------------------------------ the fake `cuda` module


class _FakeCuda:
    """What ``cuda`` is inside a checked kernel: numba.cuda's kernel-side API, traced."""
    warpsize = WARP_SIZE

    def __init__(self, launch):
        self._launch = launch
        self.shared = _Arrays(launch, "shared")
        self.local = _Arrays(launch, "local")
        self.const = _Const()
        self.atomic = _Atomic(launch)

    threadIdx = property(lambda self: self._launch.thread.threadIdx)
    blockIdx = property(lambda self: self._launch.thread.blockIdx)
    blockDim = property(lambda self: self._launch.blockdim)
    gridDim = property(lambda self: self._launch.griddim)
    laneid = property(lambda self: self._launch.thread.tid % WARP_SIZE)

    def grid(self, ndim):
        t = self._launch.thread
        pos = tuple(b * d + i for b, d, i in zip(t.blockIdx, self._launch.blockdim, t.threadIdx))
        return pos[0] if ndim == 1 else pos[:ndim]

    def gridsize(self, ndim):
        size = tuple(g * b for g, b in zip(self._launch.griddim, self._launch.blockdim))
        return size[0] if ndim == 1 else size[:ndim]

    def syncthreads(self):
        self._launch.barrier(sys._getframe(1), None)

    def syncthreads_count(self, predicate):
        return sum(self._launch.barrier(sys._getframe(1), bool(predicate)))

    def syncthreads_and(self, predicate):
        return int(all(self._launch.barrier(sys._getframe(1), bool(predicate))))

    def syncthreads_or(self, predicate):
        return int(any(self._launch.barrier(sys._getframe(1), bool(predicate))))

    def threadfence(self):
        pass  # orders one thread's writes for other blocks: it makes no race go away, so nothing to model

    threadfence_block = threadfence_system = threadfence

    def __getattr__(self, name):
        real = getattr(sys.modules.get("numba.cuda"), name, None)
        if type(real).__module__.startswith("numba.core.types"):   # cuda.float32 and the like: plain types
            return real
        raise NotImplementedError(
            f"cudacheck does not model cuda.{name}; it models threadIdx, blockIdx, blockDim, gridDim, grid, "
            "gridsize, shared.array, local.array, const.array_like, syncthreads(_count/_and/_or), threadfence "
            "and atomic.add/sub/max/min/exch/cas. Check a version of the kernel without it.")


class _Arrays:
    def __init__(self, launch, space):
        self._launch, self._space = launch, space

    def array(self, shape, dtype, alignment=None):
        return self._launch.allocate(self._space, shape, _numpy_dtype(dtype), sys._getframe(1))


class _Const:
    def array_like(self, ary):
        return ary


class _Atomic:
    def __init__(self, launch):
        self._launch = launch

    def _op(name, combine):  # noqa: N805 -- builds the methods below
        def op(self, ary, idx, val):
            return self._launch.atomic(ary, idx, sys._getframe(1), lambda old: combine(old, val), name)
        op.__name__ = name
        return op

    add = _op("add", lambda old, v: old + v)
    sub = _op("sub", lambda old, v: old - v)
    max = _op("max", lambda old, v: old if old >= v else v)
    min = _op("min", lambda old, v: old if old <= v else v)
    exch = _op("exch", lambda old, v: v)
    del _op

    def cas(self, ary, idx, old, val):
        return self._launch.atomic(ary, idx, sys._getframe(1), lambda cur: val if cur == old else cur, "cas")

    def compare_and_swap(self, ary, old, val):
        return self.cas(ary, 0, old, val)


# ------------------------------------------------ binding the kernel's code


def _python_function(obj, what):
    """The Python function under a @cuda.jit object (real numba.cuda or its simulator), or obj itself."""
    fn = getattr(obj, "py_func", obj)
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"{what} must be a @cuda.jit function or a plain Python function, "
                        f"got {type(obj).__name__}")
    return fn


def _is_cuda_module(value):
    numba_cuda = sys.modules.get("numba.cuda")
    return value is numba_cuda or value is STANDIN or type(value).__name__ == "FakeCUDAModule"


def _is_jit_function(value):
    return (type(value).__name__ in ("CUDADispatcher", "FakeCUDAKernel", "CPUDispatcher")
            or type(value) is SourceKernel) and isinstance(getattr(value, "py_func", None), types.FunctionType)


_PLAIN_MODULES = {"math", "cmath", "numpy", "operator"}


class _ModuleProxy(types.ModuleType):
    """A module seen from a checked kernel: ``numba.cuda`` and its device functions become traced."""

    def __init__(self, module, binder):
        super().__init__(module.__name__)
        self._module, self._binder = module, binder

    def __getattr__(self, name):
        value = self._binder.swap(getattr(self._module, name))
        setattr(self, name, value)
        return value


class _Binder:
    """Makes copies of the kernel and every function it calls with ``cuda`` bound to the tracing fake."""

    def __init__(self, fake):
        self.fake, self.done = fake, {}

    def swap(self, value):
        if _is_cuda_module(value):
            return self.fake
        if _is_jit_function(value):
            return self.bind(value.py_func)
        if isinstance(value, types.ModuleType) and value.__name__.split(".")[0] not in _PLAIN_MODULES:
            key = id(value)
            if key not in self.done:
                self.done[key] = _ModuleProxy(value, self)
            return self.done[key]
        return value

    def bind(self, fn):
        if fn in self.done:
            return self.done[fn]
        globs = dict(fn.__globals__)
        closure = None
        if fn.__closure__:
            closure = tuple(types.CellType(self.swap(_cell(c))) for c in fn.__closure__)
        bound = types.FunctionType(fn.__code__, globs, fn.__name__, fn.__defaults__, closure)
        bound.__kwdefaults__ = fn.__kwdefaults__
        self.done[fn] = bound
        for name in _global_names(fn.__code__):
            if name in globs:
                globs[name] = self.swap(globs[name])
        return bound


def _cell(c):
    try:
        return c.cell_contents
    except ValueError:  # an empty cell (a name assigned later)
        return None


def _global_names(code):
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


# ------------------------------------------------------------ the launch


def _locked():
    """A lock that starts taken: acquire() waits until another thread releases it (a 0/1 semaphore)."""
    lock = threading.Lock()
    lock.acquire()
    return lock


class _Abort(BaseException):
    """Unwinds a simulated thread when the launch stops early."""


class _Thread:
    """One simulated CUDA thread: a Python thread that runs only when the scheduler hands it the turn."""

    def __init__(self, launch, tid, blockIdx):
        self.launch, self.tid, self.blockIdx = launch, tid, blockIdx
        self.threadIdx = _unravel(tid, launch.blockdim)
        self.gtid = launch.block_linear * launch.nthreads + tid   # unique in the launch
        self.turn = _locked()             # released: this thread's turn to run
        self.state = "ready"          # ready | barrier | done | error | aborted
        self.site = None              # the barrier it waits at
        self.predicate = None
        self.result = None
        self.error = None
        self.allocations = {}         # (code, line) -> how many arrays this thread allocated there
        self.os_thread = threading.Thread(target=self.main, daemon=True,
                                          name=f"cudacheck block {blockIdx} thread {self.threadIdx}")

    def main(self):
        launch = self.launch
        self.turn.acquire()
        try:
            if launch.aborting:
                raise _Abort
            launch.fn(*launch.kernel_args)
            self.state = "done"
        except _Abort:
            self.state = "aborted"
        except BaseException as e:  # the learner's code raised: the scheduler reports it
            self.state, self.error = "error", e
        finally:
            launch.yielded.release()


class _Launch:
    def __init__(self, fn, griddim, blockdim, args):
        self.fn_name = fn.__name__
        self.gridnd, self.blocknd = len(griddim), len(blockdim)
        self.griddim, self.blockdim = _padded(griddim), _padded(blockdim)
        self.nthreads = int(np.prod(self.blockdim))
        if self.nthreads > 1024:
            raise ValueError(f"blockdim {blockdim} has {self.nthreads} threads; a CUDA block has at most 1024")
        self.findings, self._seen = [], {}
        self.memories = []
        self.epoch = 0            # the barrier interval; unique across blocks, since blocks run in turn
        self.intervals = 0
        self.thread = None
        self.block_linear = 0
        self.aborting = False
        self.yielded = _locked()         # released: the running thread has stopped
        self.pending_uninit = []
        self.fake = _FakeCuda(self)
        self.fn = _Binder(self.fake).bind(fn)
        self.args, self.kernel_args = args, self._device_args(fn, args)

    # ---- arguments in and out

    def _device_args(self, fn, args):
        params = list(inspect.signature(fn).parameters)
        if len(params) != len(args):
            raise TypeError(f"{fn.__name__} takes {len(params)} arguments ({', '.join(params)}), "
                            f"{len(args)} were given")
        out = []
        for name, arg in zip(params, args):
            if isinstance(arg, Uninitialized):
                data = np.full(arg.shape, _junk(arg.dtype), arg.dtype)
                out.append(self._global(name, data, initialized=False))
            elif isinstance(arg, np.ndarray):
                out.append(self._global(name, np.array(arg, order="C"), initialized=True))
            elif hasattr(arg, "copy_to_host"):
                out.append(self._global(name, np.ascontiguousarray(arg.copy_to_host()), initialized=True))
            elif isinstance(arg, (int, float, complex, np.number, np.bool_)):
                out.append(arg)
            else:
                raise TypeError(f"argument {name!r}: cudacheck takes numpy arrays, device arrays, "
                                f"cudacheck.uninitialized(...) and scalars, got {type(arg).__name__}")
        return out

    def _global(self, name, data, initialized):
        mem = _Memory(self, name, "global", data, initialized)
        self.memories.append(mem)
        return TracedArray(mem, data, name)

    def _copy_back(self):
        for arg, traced in zip(self.args, self.kernel_args):
            if isinstance(arg, Uninitialized):
                arg._host = traced._mem.data.copy()
            elif isinstance(arg, np.ndarray) and arg.flags.writeable:
                arg[...] = traced._mem.data
            elif hasattr(arg, "copy_to_device"):
                arg.copy_to_device(traced._mem.data)

    # ---- running

    def run(self) -> Report:
        gx, gy, gz = self.griddim
        for linear in range(gx * gy * gz):
            self._run_block(linear, _unravel(linear, self.griddim))
        self._copy_back()
        traffic = {}
        for mem in self.memories:
            for what, n in (("reads", mem.n_reads), ("writes", mem.n_writes)):
                key = f"{mem.space} {what}"
                traffic[key] = traffic.get(key, 0) + n
        by_array = {mem.name: mem.n_reads for mem in self.memories if mem.space == "global"}
        return Report(self.fn_name, self.griddim[:self.gridnd], self.blockdim[:self.blocknd],
                      self.findings, self.intervals, traffic, by_array)

    def _run_block(self, linear, blockIdx):
        self.block_linear, self.shared = linear, {}
        self.epoch += 1
        threads = [_Thread(self, tid, blockIdx) for tid in range(self.nthreads)]
        for t in threads:
            t.os_thread.start()
        running, finished = threads, []
        try:
            while running:
                for t in running:       # each in turn, up to its next barrier or its end
                    self.thread = t
                    t.turn.release()
                    self.yielded.acquire()
                    if t.state == "error":
                        raise self._kernel_error(t)
                waiting = [t for t in running if t.state == "barrier"]
                finished += [t for t in running if t.state == "done"]
                self._end_interval()
                if waiting:
                    self._check_barrier(waiting, finished)
                    predicates = [t.predicate for t in waiting]
                    for t in waiting:
                        t.result = predicates
                running = waiting
        finally:
            if any(t.state in ("ready", "barrier") for t in threads):
                self.aborting = True
                for t in threads:
                    if t.state in ("ready", "barrier"):
                        t.turn.release()
                        self.yielded.acquire()
            for t in threads:
                t.os_thread.join()

    def _end_interval(self):
        self.intervals += 1
        for mem, key, t, site, array, index in self.pending_uninit:
            # written later in this interval by another thread: that is a race, reported as one
            if mem.private or key not in mem.writes or mem.writes[key][0] == t.gtid:
                self._report("uninitialized", (mem.name, site[1]), t,
                             f"{self._who(t)} reads {array.name}[{_index_str(index)}] at {_where(site)}, "
                             f"but nothing wrote {mem.title()} there earlier in this launch"
                             f"{self._uninit_hint(mem)}", mem, index, site)
        self.pending_uninit = []
        self.epoch += 1

    def _uninit_hint(self, mem):
        if mem.space == "shared":
            return (": shared memory starts as garbage in every block. Write every element a thread will "
                    "read before the barrier, e.g. a neutral value (0, or -inf for a running max) past a tail.")
        if mem.space == "local":
            return ": a local array starts as garbage. Set it (e.g. to 0) before accumulating into it."
        return (": it came from cuda.device_array, which is not zeroed. Write it before reading it, or "
                "pass an initialized array.")

    def barrier(self, frame, predicate):
        t = self.thread
        t.site, t.predicate, t.state = (frame.f_code, frame.f_lineno), predicate, "barrier"
        self.yielded.release()
        t.turn.acquire()
        if self.aborting:
            raise _Abort
        t.state = "ready"
        return t.result

    def _check_barrier(self, waiting, finished):
        sites = {}
        for t in waiting:
            sites.setdefault(t.site, []).append(t.tid)
        block = self._block_name()
        if len(sites) > 1:
            (s1, t1), (s2, t2) = list(sites.items())[:2]
            self._report("barrier", ("divergent", s1, s2), waiting[0],
                         f"in block {block}, {_threads(t1, self.blockdim[:self.blocknd])} wait at "
                         f"cuda.syncthreads() on {_where(s1)} while "
                         f"{_threads(t2, self.blockdim[:self.blocknd])} wait at the one on {_where(s2)}: "
                         "every thread of a block must reach the same syncthreads. Move it out of the "
                         "branch that only some threads take.", line=s1[1])
        if finished:
            site, tids = next(iter(sites.items()))
            done = sorted(t.tid for t in finished)
            self._report("barrier", ("not reached", site), waiting[0],
                         f"in block {block}, {_threads(done, self.blockdim[:self.blocknd])} finished the "
                         f"kernel without reaching the cuda.syncthreads() on {_where(site)} that "
                         f"{_threads(tids, self.blockdim[:self.blocknd])} wait at: a barrier must be reached "
                         "by every thread of the block, as often as by the others. Don't return before a "
                         "barrier (guard the loads and stores with `if i < n:` instead), and give a loop that "
                         "holds one the same trip count in every thread (mask inside it instead).",
                         line=site[1])

    def _kernel_error(self, t):
        frames = [f for f in traceback.extract_tb(t.error.__traceback__) if f.filename != __file__]
        where = f" at line {frames[-1].lineno} of {frames[-1].name} (`{(frames[-1].line or '').strip()}`)" \
            if frames else ""
        err = KernelError(f"{self.fn_name}: {self._who(t)} raised {type(t.error).__name__}{where}: {t.error}")
        err.__cause__ = t.error
        return err

    # ---- allocations

    def allocate(self, space, shape, dtype, frame):
        site = (frame.f_code, frame.f_lineno)
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        if space == "shared" and shape in ((), (0,)):
            raise NotImplementedError("cudacheck does not model dynamic shared memory (a shared array of "
                                      "shape 0): give the array its size, a compile-time constant")
        name = _declared_name(site, f"{space} array at line {site[1]}")
        if space == "shared":  # one array per call site (and per call there) for the whole block
            t = self.thread
            n = t.allocations[site] = t.allocations.get(site, 0) + 1
            mem = self.shared.get((site, n))
            if mem is not None:
                return TracedArray(mem, mem.data, name)
            mem = self.shared[(site, n)] = _Memory(self, name, space, np.full(shape, _junk(dtype), dtype), False)
        else:
            mem = _Memory(self, name, space, np.full(shape, _junk(dtype), dtype), False)
        self.memories.append(mem)
        return TracedArray(mem, mem.data, name)

    # ---- the checks

    def _who(self, t):
        return f"thread {_name(t.threadIdx, self.blocknd)} of block {_name(t.blockIdx, self.gridnd)}"

    def _who_g(self, gtid):
        blockIdx, threadIdx = _unravel(gtid // self.nthreads, self.griddim), _unravel(gtid % self.nthreads,
                                                                                      self.blockdim)
        if gtid // self.nthreads == self.block_linear:
            return f"thread {_name(threadIdx, self.blocknd)}"
        return f"thread {_name(threadIdx, self.blocknd)} of block {_name(blockIdx, self.gridnd)}"

    def _block_name(self):
        return _name(_unravel(self.block_linear, self.griddim), self.gridnd)

    def _conflicts(self, gtid, other, other_epoch):
        """Two accesses by thread gtid (now) and other (in other_epoch) are unordered."""
        return other != gtid and (other_epoch == self.epoch or other // self.nthreads != gtid // self.nthreads)

    # Who touched an element, kept small: the last write, and for reads the first two threads that read
    # it in the latest interval that read it, plus one reader from an older block.  That is enough to
    # find a race on every racy element: blocks run in turn and intervals in order, so a write races
    # with an earlier read exactly when the reader is another thread of this interval or of an older
    # block, and if any such reader exists, one of the kept ones is such a reader.

    def read(self, mem, key, array, index, frame):
        mem.n_reads += 1
        if mem.private:   # a thread's own local array: only whether it was ever written matters
            if key not in mem.writes:
                self.pending_uninit.append((mem, key, self.thread, (frame.f_code, frame.f_lineno), array, index))
            return mem.flat[key]
        site = (frame.f_code, frame.f_lineno)
        t = self.thread
        w = mem.writes.get(key)
        g = t.gtid
        if w is not None and self._conflicts(g, w[0], w[1]):
            self._race(mem, array, index, t, "reads", site, w[0], "wrote", w[2])
        slot = mem.reads.get(key)
        if slot is None:
            mem.reads[key] = [self.epoch, g, site, None, None, None, None]
        elif slot[0] != self.epoch:
            if slot[1] // self.nthreads != g // self.nthreads:   # keep one reader of an older block
                slot[5], slot[6] = slot[1], slot[2]
            slot[:5] = [self.epoch, g, site, None, None]
        elif slot[3] is None and slot[1] != g:
            slot[3], slot[4] = g, site
        if not mem.initialized and key not in mem.writes:
            self.pending_uninit.append((mem, key, t, site, array, index))
        return mem.flat[key]

    def write(self, mem, key, array, index, frame, value, atomic=False):
        mem.n_writes += 1
        if mem.private:
            mem.writes[key] = True   # only whether it was written: nobody else can touch it
            mem.flat[key] = value
            return
        site = (frame.f_code, frame.f_lineno)
        t = self.thread
        g = t.gtid
        w = mem.writes.get(key)
        if w is not None and self._conflicts(g, w[0], w[1]) and not (atomic and w[3]):
            self._race(mem, array, index, t, "writes", site, w[0], "wrote", w[2])
        slot = mem.reads.get(key)
        if slot is not None:
            for reader, rsite, repoch in ((slot[1], slot[2], slot[0]), (slot[3], slot[4], slot[0]),
                                          (slot[5], slot[6], -1)):
                if reader is not None and self._conflicts(g, reader, repoch):
                    self._race(mem, array, index, t, "writes", site, reader, "read", rsite)
                    break
        mem.writes[key] = (g, self.epoch, site, atomic)
        mem.flat[key] = value

    def atomic(self, ary, idx, frame, update, name):
        if not isinstance(ary, TracedArray):
            raise TypeError(f"cuda.atomic.{name}: the first argument must be an array, got {type(ary).__name__}")
        key = ary._locate(idx, "updates", frame)
        if type(key) is not int:
            if key is None:
                return ary.dtype.type(_junk(ary.dtype))
            raise TypeError(f"cuda.atomic.{name}: index {idx!r} names a sub-array of {ary.name}, not an element")
        mem = ary._mem
        mem.n_reads += 1
        old = mem.flat[key]
        if not mem.initialized and key not in mem.writes:
            self.pending_uninit.append((mem, key, self.thread, (frame.f_code, frame.f_lineno), ary, idx))
        self.write(mem, key, ary, idx, frame, update(old), atomic=True)
        return old

    def _race(self, mem, array, index, t, verb, site, other, other_verb, other_site):
        where_other = "" if other // self.nthreads == t.gtid // self.nthreads else " (another block)"
        if other // self.nthreads != t.gtid // self.nthreads:
            fix = ("Nothing orders two blocks: give each element to one block, or use cuda.atomic "
                   "for a sum that several blocks add to.")
            when = "in the same launch"
        elif verb == "reads":
            fix = ("Put cuda.syncthreads() between the write and the read; in a loop over tiles, also one at "
                   "the end of the loop body, so that the next load waits for the last read.")
            when = "in the same barrier interval"
        elif other_verb == "read":
            fix = ("Add a cuda.syncthreads() after the last read, before the element is overwritten "
                   "(in a loop over tiles: at the end of the loop body).")
            when = "in the same barrier interval, so the write can land before the read"
        else:
            fix = "Let one thread write each element, or separate the writes with cuda.syncthreads()."
            when = "in the same barrier interval"
        self._report("race", (mem.name, site[1], other_site[1]), t,
                     f"{mem.title()}: {self._who(t)} {verb} {array.name}[{_index_str(index)}] at "
                     f"{_where(site)}, which {self._who_g(other)}{where_other} {other_verb} at "
                     f"{_where(other_site)} {when}. {fix}", mem, index, site)

    def out_of_bounds(self, array, index, axis, access, frame):
        site = (frame.f_code, frame.f_lineno)
        t, mem = self.thread, array._mem
        i, n = index[axis], array.shape[axis]
        shape = f"shape {tuple(array.shape)}"
        if i < 0 and i >= -n:
            what = (f"index {i} on axis {axis} is negative: numba wraps it to {i + n}, the other end of the "
                    "axis, without a word, which a kernel almost never means. Guard the edge "
                    "(e.g. `if i > 0:`) before reaching for a neighbour.")
        else:
            what = (f"index {i} is outside axis {axis} of length {n}: on a GPU this {access[:-1]} lands on "
                    "another element or outside the allocation, with no error. Guard it, e.g. "
                    f"`if i < {array.name}.shape[{axis}]:`.")
        self._report("out_of_bounds", (mem.name, site[1], i < 0), t,
                     f"{mem.title()} ({shape}): {self._who(t)} {access} {array.name}[{_index_str(index)}] at "
                     f"{_where(site)}: {what}", mem, index, site)

    def _report(self, kind, key, t, message, mem=None, index=None, site=None, line=None):
        key = (kind,) + key
        if key in self._seen:
            self._seen[key].count += 1
            return
        finding = Finding(kind, message, t.blockIdx[:self.gridnd], t.threadIdx[:self.blocknd],
                          mem.title() if mem else None, _index_tuple(index) if index is not None else None,
                          site[1] if site else line)
        self._seen[key] = finding
        self.findings.append(finding)


def _index_tuple(index):
    return tuple(index) if isinstance(index, tuple) else (index,)


def _index_str(index):
    return ", ".join(_index_text(i) if type(i) is slice else str(i) for i in _index_tuple(index))

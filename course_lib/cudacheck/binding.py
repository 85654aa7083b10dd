"""How a kernel's Python function runs checked: a copy of it, and of every function it calls,
with ``cuda`` bound to the tracing twin; and ``STANDIN``, ``cuda`` where kernels are defined without numba."""
from __future__ import annotations

import sys
import types

from .gpumath import gpu_version


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


def python_function(obj, what):
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


_PLAIN_MODULES = {"cmath", "numpy", "operator"}


class _ModuleProxy(types.ModuleType):
    """A module seen from a checked kernel: ``numba.cuda`` and its device functions become traced."""

    def __init__(self, module, binder):
        super().__init__(module.__name__)
        self._module, self._binder = module, binder

    def __getattr__(self, name):
        value = self._binder.swap(getattr(self._module, name))
        setattr(self, name, value)
        return value


class Binder:
    """Makes copies of the kernel and every function it calls with ``cuda`` bound to the tracing fake,
    and ``math`` and integer types to what they compute on a GPU (``gpumath``)."""

    def __init__(self, fake):
        self.fake, self.done = fake, {}

    def swap(self, value):
        if _is_cuda_module(value):
            return self.fake
        if _is_jit_function(value):
            return self.bind(value.py_func)
        gpu = gpu_version(value)
        if gpu is not None:
            return gpu
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

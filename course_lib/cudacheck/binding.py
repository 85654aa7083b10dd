"""How a kernel's Python function runs checked: a copy of it, and of every function it calls,
with ``cuda`` bound to the tracing twin; and ``STANDIN``, ``cuda`` where kernels are defined without numba."""
from __future__ import annotations

import ast
import inspect
import sys
import textwrap
import types

from .gpumath import divide, gpu_version

DIVIDE = "__cudacheck_divide__"   # the name a kernel's `/` calls in its checked copy


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
        globs[DIVIDE] = divide
        code = ieee_division(fn)
        closure = None
        if fn.__closure__:
            cells = dict(zip(fn.__code__.co_freevars, fn.__closure__))
            closure = tuple(types.CellType(self.swap(_cell(cells[name]))) for name in code.co_freevars)
        bound = types.FunctionType(code, globs, fn.__name__, fn.__defaults__, closure)
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


_DIVISION = {}   # a function's code -> the same code with every `/` a call of gpumath.divide


def ieee_division(fn):
    """``fn``'s code with ``a / b`` and ``a /= b`` computed as a GPU does (inf or nan by zero);
    its own code where its source cannot be read or has no ``/``."""
    code = fn.__code__
    if code not in _DIVISION:
        _DIVISION[code] = _rewrite_division(fn) or code
    return _DIVISION[code]


class _Division(ast.NodeTransformer):
    def visit_BinOp(self, node):
        self.generic_visit(node)
        if not isinstance(node.op, ast.Div):
            return node
        return ast.copy_location(ast.Call(ast.Name(DIVIDE, ast.Load()), [node.left, node.right], []), node)

    def visit_AugAssign(self, node):
        self.generic_visit(node)
        if not isinstance(node.op, ast.Div) or not isinstance(node.target, (ast.Name, ast.Subscript)):
            return node
        read = ast.copy_location(type(node.target)(**{**vars(node.target), "ctx": ast.Load()}), node.target)
        call = ast.copy_location(ast.Call(ast.Name(DIVIDE, ast.Load()), [read, node.value], []), node)
        return ast.copy_location(ast.Assign([node.target], call), node)


def _rewrite_division(fn):
    code = fn.__code__
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):   # no source to read (a kernel built in memory): as it is
        return None
    node = tree.body[0] if tree.body else None
    if not isinstance(node, ast.FunctionDef) or node.name != code.co_name or \
            not any(isinstance(n, ast.Div) for n in ast.walk(node)):
        return None
    node.decorator_list = []
    body = [_Division().visit(node)]
    if code.co_freevars:   # a closure: define it inside a function whose locals are its free names
        args = ast.arguments([], [ast.arg(name) for name in code.co_freevars], None, [], [], None, [])
        body = [ast.FunctionDef("__cudacheck_outer__", args, body + [ast.Return(ast.Name(node.name, ast.Load()))],
                                [], None)]
    module = ast.fix_missing_locations(ast.Module(body, []))
    ast.increment_lineno(module, code.co_firstlineno - 1)   # line 1 of the source read is co_firstlineno
    compiled = compile(module, code.co_filename, "exec")
    for const in _code_consts(compiled):
        if const.co_name == code.co_name and const.co_firstlineno >= code.co_firstlineno:
            return const
    return None


def _code_consts(code):
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield const
            yield from _code_consts(const)

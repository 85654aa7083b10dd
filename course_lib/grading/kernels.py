"""A learner's CUDA kernels, graded through cudacheck without trusting the sandbox that ran them.

A check hands an answer's ``@cuda.jit`` kernel to ``cudacheck.check``, and a kernel is
code, not plain data: it cannot come back from the answer's sandbox, and a cudacheck
running there, beside the answer's other code, could be patched to say anything.  So
the grader takes the kernel from the one thing it trusts, the *text* of the answer cell:

1. ``extract`` parses the cell here and keeps only its top-level ``@cuda.jit`` functions and
   constant assignments (``BC, D = 16, 8``), each as the exact text of that one statement: a
   statement beside a constant on its line (``N = 4; exec(...)``) is not kept, and the kept
   source must parse back to exactly the kept statements.  Nothing else of the cell is kept.
2. ``problems`` holds each function to the part of Python that numba.cuda compiles, and
   narrower: arithmetic, ``if`` / ``for ... in range`` / ``while``, indexing, and as names
   only its arguments and locals, the cell's constants and kernels, ``cuda``, ``math``,
   ``np`` and numba's scalar types, with a fixed list of attributes on each.  No imports,
   strings beyond a message, comprehensions, ``try``, classes, closures or underscores:
   nothing in that list leads to an object the kernel was not given.
3. A second sandbox (``sandbox.Session(kernels=True)``), which never runs the answer's
   other code, defines the kept source there with only those names and runs
   cudacheck on it; its report and the arrays the kernel wrote come back as plain data.

So a kernel can only compute; it cannot reach cudacheck, the grader or the first
sandbox, and a kernel cudacheck would flag in the learner's notebook is flagged here.
What decides a verdict is the check cell, here: it compares the arrays the kernel wrote
(decoded strictly, ``report_back``) with values it computes itself.  The one thing taken
from the kernel sandbox unrecomputed is cudacheck's list of findings and counts, and only
the kept source, which rule 2 allows, ever runs beside cudacheck there.
``require_gradable`` lets the notebook's own check apply rule 2, so that a kernel the
grader would refuse fails there first, with the same message.
"""
from __future__ import annotations

import ast
import linecache
from dataclasses import dataclass, field

import numpy as np

from ..cudacheck import MODELLED
from . import wire

# What a kernel may name besides its arguments, its locals and its cell's constants and kernels
NUMBA_TYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64",
               "uint8", "uint16", "uint32", "uint64", "boolean")
BUILTINS = ("range", "min", "max", "abs", "float", "int", "bool", "len", "round", "print", "NotImplementedError")
MODULES = {
    "math": {"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "pow", "fabs", "floor", "ceil",
             "trunc", "isinf", "isnan", "isfinite", "inf", "nan", "pi", "e", "tanh", "sin", "cos", "tan",
             "erf", "copysign", "fmod", "hypot", "atan", "atan2", "sinh", "cosh", "asin", "acos"},
    "np": set(NUMBA_TYPES[:-1]) | {"bool_", "inf", "nan", "pi", "e"},
    "cuda": set(MODELLED) | {f"{name}.{axis}" for name in ("threadIdx", "blockIdx", "blockDim", "gridDim")
                             for axis in "xyz"} | {"jit"},
}
MODULES["numpy"] = MODULES["np"]
VALUE_ATTRIBUTES = {"shape", "size", "ndim", "x", "y", "z"}   # of an array, or of threadIdx and the like
RULE = ("a kernel sees only its arguments, its own variables, the constants and kernels of its own cell, "
        "and cuda, math, np and numba's types (float32, int32, ...)")

_STATEMENTS = (ast.Assign, ast.AugAssign, ast.For, ast.While, ast.If, ast.Break, ast.Continue, ast.Pass,
               ast.Return, ast.Expr, ast.Raise)
_EXPRESSIONS = (ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call, ast.Name, ast.Constant,
                ast.Attribute, ast.Subscript, ast.Tuple, ast.keyword, ast.operator, ast.unaryop, ast.boolop,
                ast.cmpop, ast.expr_context)
_WHAT = {ast.ListComp: "a list comprehension", ast.SetComp: "a set comprehension", ast.DictComp:
         "a dict comprehension", ast.GeneratorExp: "a generator expression", ast.Lambda: "a lambda",
         ast.List: "a list", ast.Dict: "a dict", ast.Set: "a set", ast.JoinedStr: "an f-string",
         ast.Try: "try / except", ast.With: "with", ast.Import: "an import", ast.ImportFrom: "an import",
         ast.Global: "global", ast.Nonlocal: "nonlocal", ast.ClassDef: "a class", ast.FunctionDef:
         "a function inside a kernel", ast.Delete: "del", ast.Assert: "assert", ast.Slice: "a slice",
         ast.Starred: "*args", ast.NamedExpr: ":=", ast.AnnAssign: "an annotation", ast.Yield: "yield",
         ast.Await: "await", ast.AsyncFunctionDef: "async def"}


@dataclass
class Kernels:
    """What a cell holds for cudacheck: the source to define (only the kept statements, each at its
    own lines, so line numbers match the cell), its kernels, what is wrong with each, if anything,
    and ``error``: why none of the cell can be taken (then ``source`` is empty)."""
    source: str = ""
    error: str = ""
    names: list = field(default_factory=list)
    problems: dict = field(default_factory=dict)   # kernel name -> [message, ...]
    unfinished: set = field(default_factory=set)   # kernels that still hold the exercise's stub


def _is_cuda_jit(node) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    return (isinstance(target, ast.Attribute) and target.attr == "jit" and isinstance(target.value, ast.Name)
            and target.value.id == "cuda")


CONSTANT_DEPTH = 60   # nesting of a constant's expression: ``BC, D = 16, 8`` is 2 deep


def _constant_problem(node, constants):
    """Why ``node`` is not a kernel constant (a number, a name of an earlier constant, or arithmetic
    and tuples of those, at most ``CONSTANT_DEPTH`` deep), or None.  Walks without recursion."""
    stack = [(node, 1)]
    while stack:
        child, depth = stack.pop()
        if depth > CONSTANT_DEPTH:
            return f"nested more than {CONSTANT_DEPTH} deep"
        if isinstance(child, ast.Constant):
            if type(child.value) not in (int, float, bool):
                return f"a {type(child.value).__name__} is not a number"
        elif isinstance(child, ast.Name):
            if child.id not in constants or child.id.startswith("__"):
                return f"`{child.id}` is not an earlier constant of the cell"
        elif isinstance(child, ast.Tuple):
            stack.extend((e, depth + 1) for e in child.elts)
        elif isinstance(child, ast.UnaryOp):
            stack.append((child.operand, depth + 1))
        elif isinstance(child, ast.BinOp) and not isinstance(child.op, ast.Pow):
            stack.extend(((child.left, depth + 1), (child.right, depth + 1)))
        else:
            return f"{type(child).__name__} is not arithmetic on numbers"
    return None


def _target_names(target):
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
        return [e.id for e in target.elts]
    return None


def _segment(lines, node, first_line):
    """The exact text of ``node``: from line ``first_line`` (its decorators) or its own column, to
    its end column; {line number: text}.  Columns are UTF-8 byte offsets, as ``ast`` gives them."""
    raw = [lines[i].encode("utf-8") for i in range(first_line - 1, node.end_lineno)]
    start = 0 if first_line < node.lineno else node.col_offset
    if len(raw) == 1:
        raw[0] = raw[0][start:node.end_col_offset]
    else:
        raw[0], raw[-1] = raw[0][start:], raw[-1][:node.end_col_offset]
    return {first_line + i: text.decode("utf-8") for i, text in enumerate(raw)}


def _same_tree(a, b) -> bool:
    """Whether two lists of statements are the same code (types and values, node by node; no recursion)."""
    if len(a) != len(b):
        return False
    for x, y in zip((n for top in a for n in ast.walk(top)), (n for top in b for n in ast.walk(top))):
        if type(x) is not type(y):
            return False
        for name in x._fields:
            u, v = getattr(x, name, None), getattr(y, name, None)
            if isinstance(u, list):
                if not isinstance(v, list) or len(u) != len(v) or any(
                        type(p) is not type(q) or not isinstance(p, ast.AST) and p != q for p, q in zip(u, v)):
                    return False
            elif not isinstance(u, ast.AST) and (type(u) is not type(v) or u != v):
                return False
    return sum(1 for top in a for _ in ast.walk(top)) == sum(1 for top in b for _ in ast.walk(top))


def extract(cell_source: str) -> Kernels:
    """The ``@cuda.jit`` functions of an answer cell and the constants before them, checked.

    The cell is parsed, never filtered by lines: only whole top-level statements that are a
    constant assignment or a ``@cuda.jit`` function are kept, each as its own exact text at its
    own lines (a statement beside it on a line, ``N = 4; exec(...)``, is left out), and the kept
    source must parse back to exactly the kept statements, or nothing of the cell is kept."""
    from .worker import plain_python

    text = plain_python(cell_source)
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return Kernels()
    except (RecursionError, MemoryError, ValueError):
        return Kernels(error="the cell is nested too deeply for the grader to read its kernels")
    lines = text.splitlines()
    kept, out, constants, refused, found = [], {}, set(), {}, []
    for node in tree.body:
        if isinstance(node, ast.Assign) and all(_target_names(t) for t in node.targets):
            why = _constant_problem(node.value, constants)
            names = [n for t in node.targets for n in _target_names(t)]
            if why is not None:
                refused.update({n: why for n in names})
                constants.difference_update(names)
                continue
            constants.update(names)
            first = node.lineno
        elif isinstance(node, ast.FunctionDef) and any(_is_cuda_jit(d) for d in node.decorator_list):
            found.append(node)
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        else:
            continue
        kept.append(node)
        for number, part in _segment(lines, node, first).items():
            out[number] = f"{out[number]}; {part.strip()}" if out.get(number, "").strip() else part
    source = "\n".join(out.get(i + 1, "") for i in range(len(lines))) + "\n"
    try:
        rebuilt = ast.parse(source).body
    except (SyntaxError, RecursionError, MemoryError, ValueError):
        rebuilt = None
    if rebuilt is None or not _same_tree(kept, rebuilt):
        return Kernels(names=[f.name for f in found], error="the grader could not take this cell's kernels and "
                       "constants apart from its other code: put each constant and kernel on lines of its own")
    kernels = Kernels(source=source, names=[f.name for f in found])
    known = constants | set(kernels.names)
    for fn in found:
        kernels.problems[fn.name] = problems(fn, known, refused)
        if any(isinstance(n, ast.Raise) and isinstance(n.exc, ast.Call) and isinstance(n.exc.func, ast.Name)
               and n.exc.func.id == "NotImplementedError" for n in ast.walk(fn)):
            kernels.unfinished.add(fn.name)
    return kernels


def problems(fn: ast.FunctionDef, known: set, refused=None) -> list:
    """What in ``fn`` is outside the kernel language the grader runs (empty: nothing).

    ``known``: the cell's constants and kernels; ``refused``: {name: why} of the cell's top-level
    assignments that are no kernel constant, for a clearer message when a kernel names one."""
    refused = refused or {}
    found = []

    def say(node, message):
        found.append(f"{fn.name}, line {getattr(node, 'lineno', fn.lineno)}: {message}")

    for d in fn.decorator_list:
        if not _is_cuda_jit(d) or isinstance(d, ast.Call) and not all(
                isinstance(a, ast.Constant) for a in d.args + [k.value for k in d.keywords]):
            say(d, "the only decorator a kernel takes is @cuda.jit (with constant options)")
    if fn.name.startswith("__"):
        say(fn, "names with a double underscore are not for kernels")
    a = fn.args
    if a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg or a.defaults or any(x.annotation for x in a.args):
        say(fn, "a kernel takes plain positional arguments (no defaults, *args, **kwargs or annotations)")
    params = {x.arg for x in a.args}
    local = params | {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    allowed = local | known | set(MODULES) | set(NUMBA_TYPES) | set(BUILTINS)
    body = fn.body[1:] if fn.body and isinstance(fn.body[0], ast.Expr) and \
        isinstance(fn.body[0].value, ast.Constant) and isinstance(fn.body[0].value.value, str) else fn.body
    parents = {id(child): node for node in ast.walk(fn) for child in ast.iter_child_nodes(node)}
    for stmt in body:
        _statement(stmt, allowed, parents, say, refused)
    return found


def _statement(node, allowed, parents, say, refused):
    for child in ast.walk(node):
        kind = type(child)
        if kind in (ast.comprehension, ast.ExceptHandler, ast.alias, ast.withitem):
            continue   # part of a construct already reported
        if kind in _WHAT:
            say(child, f"{_WHAT[kind]} is not part of the Python a kernel is written in")
        elif not isinstance(child, _STATEMENTS + _EXPRESSIONS + (ast.arguments, ast.arg)):
            say(child, f"{kind.__name__} is not part of the Python a kernel is written in")
        elif isinstance(child, ast.Raise):
            if not (isinstance(child.exc, ast.Call) and isinstance(child.exc.func, ast.Name)
                    and child.exc.func.id == "NotImplementedError") or child.cause is not None:
                say(child, "a kernel raises nothing but NotImplementedError(...) (the exercise's stub)")
        elif isinstance(child, ast.For):
            if not (isinstance(child.iter, ast.Call) and isinstance(child.iter.func, ast.Name)
                    and child.iter.func.id == "range") or _target_names(child.target) is None or child.orelse:
                say(child, "a kernel's for loop is `for i in range(...)` (no else)")
        elif isinstance(child, ast.While) and child.orelse:
            say(child, "a kernel's while loop has no else")
        elif isinstance(child, ast.Constant) and type(child.value) not in (int, float, bool, type(None)):
            if not (isinstance(child.value, str) and _is_message(child, node)):
                say(child, f"a {type(child.value).__name__} constant is not something a kernel computes with")
        elif isinstance(child, ast.Name):
            if child.id.startswith("__"):
                say(child, f"`{child.id}`: names with a double underscore are not for kernels")
            elif child.id not in allowed and child.id in refused:
                say(child, f"`{child.id}` is no kernel constant ({refused[child.id]}): a constant is a number, "
                           "a tuple or arithmetic of numbers and earlier constants of the cell")
            elif child.id not in allowed:
                say(child, f"`{child.id}` is not defined for the kernel: {RULE}")
            elif child.id in MODULES and not isinstance(child.ctx, ast.Load):
                say(child, f"`{child.id}` is a module: give the variable another name")
            elif child.id in MODULES and not _is_base(child, parents):
                say(child, f"`{child.id}` is used only as `{child.id}.something` in a kernel")
        elif isinstance(child, ast.Attribute):
            if not _is_base(child, parents):   # the outermost attribute of a chain checks the chain
                _attribute(child, say)
        elif isinstance(child, ast.Call):
            if not isinstance(child.func, (ast.Name, ast.Attribute)) or any(k.arg is None for k in child.keywords):
                say(child, "a kernel calls functions by name, with plain arguments")


def _is_message(constant, root):
    """A string is allowed only as the message of ``raise NotImplementedError`` or in ``print``."""
    for node in ast.walk(root):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("NotImplementedError", "print") and constant in node.args:
            return True
    return False


def _is_base(node, parents):
    """Whether ``node`` is the ``a`` of an ``a.b``."""
    parent = parents.get(id(node))
    return isinstance(parent, ast.Attribute) and parent.value is node


def _attribute(node, say):
    chain, base = [], node
    while isinstance(base, ast.Attribute):
        chain.insert(0, base.attr)
        base = base.value
    path = ".".join(chain)
    if isinstance(base, ast.Name) and base.id in MODULES:
        if path not in MODULES[base.id]:
            say(node, f"`{base.id}.{path}` is not something a kernel can use here"
                      + (f" (cudacheck models {', '.join(MODELLED)})" if base.id == "cuda" else ""))
    elif any(part not in VALUE_ATTRIBUTES for part in chain):
        say(node, f"`.{path}`: a kernel reads only .shape, .size and .ndim of an array and .x / .y / .z")


def require_gradable(kernel) -> None:
    """Fail now, in the learner's notebook, with the grader's words, if the grader could not run ``kernel``.

    The grader defines a kernel from its cell's text alone (``extract``); a kernel that
    uses something else works here but not there.  A kernel the grader already holds
    (or one whose cell text cannot be found) is let through."""
    from course_lib.checks import CheckFailed

    fn = getattr(kernel, "py_func", None)
    code = getattr(fn, "__code__", None)
    if code is None:
        return
    cell = "".join(linecache.getlines(code.co_filename))
    if not cell:
        return
    kernels = extract(cell)
    if fn.__name__ in kernels.unfinished:
        return   # the stub: running it says "not implemented yet"
    mine = kernels.problems.get(fn.__name__)
    if mine is None and fn.__name__ not in kernels.names:
        mine = [f"{fn.__name__} is not a @cuda.jit function defined at the top of its cell, which is "
                "where the grader looks for it"]
    if mine:
        print(f"FAIL {fn.__name__}: the grader could not run this kernel")
        for line in mine[:5]:
            print(f"  {line}")
        raise CheckFailed(mine[0])


# -- the grader's side of a kernel ------------------------------------------------------------

def encode_args(args):
    """The launch's arguments as plain data: arrays and scalars, ``uninitialized`` as its shape."""
    from course_lib import cudacheck

    out = []
    for i, arg in enumerate(args):
        if isinstance(arg, cudacheck.Uninitialized):
            out.append({"cudacheck.uninitialized": [list(arg.shape), arg.dtype.name]})
        elif isinstance(arg, np.ndarray) or isinstance(arg, (int, float, bool, np.number, np.bool_)):
            out.append(arg)
        else:
            raise TypeError(f"argument {i}: in grading, a kernel takes numpy arrays, scalars and "
                            f"cudacheck.uninitialized(...), got {type(arg).__name__}")
    return out


def report_back(reply, name, args):
    """The ``cudacheck.Report`` of a plain-data reply, after copying what the kernel wrote into ``args``."""
    from course_lib import cudacheck

    def ints(value, what):
        if type(value) not in (list, tuple) or len(value) > 32 or not all(type(v) is int for v in value):
            raise wire.WireError(f"the kernel sandbox sent a bad {what}")
        return tuple(value)

    if type(reply) is not dict or type(reply.get("report")) is not dict:
        raise wire.WireError("the kernel sandbox sent a bad report")
    written, reply = reply.get("written"), reply["report"]
    if type(written) is not list:
        raise wire.WireError("the kernel sandbox sent no arrays")
    for item in written:
        if type(item) is not list or len(item) != 2 or type(item[0]) is not int or not 0 <= item[0] < len(args):
            raise wire.WireError("the kernel sandbox sent a bad array")
        index, data = item
        target = args[index]
        if isinstance(target, cudacheck.Uninitialized):
            if not isinstance(data, np.ndarray) or data.shape != target.shape or data.dtype != target.dtype:
                raise wire.WireError("the kernel sandbox sent an array of the wrong shape or dtype")
            target._host = data
        elif isinstance(target, np.ndarray) and target.flags.writeable:
            if not isinstance(data, np.ndarray) or data.shape != target.shape or data.dtype != target.dtype:
                raise wire.WireError("the kernel sandbox sent an array of the wrong shape or dtype")
            target[...] = data
        else:
            raise wire.WireError("the kernel sandbox sent back an argument that is not a writable array")
    findings = []
    for f in reply.get("findings", []) if type(reply.get("findings")) is list else [None]:
        if type(f) is not dict or f.get("kind") not in cudacheck.KINDS or type(f.get("message")) is not str:
            raise wire.WireError("the kernel sandbox sent a bad finding")
        index = f.get("index")
        findings.append(cudacheck.Finding(
            f["kind"], f["message"][:4000], ints(f.get("block"), "block"), ints(f.get("thread"), "thread"),
            str(f["array"])[:200] if f.get("array") is not None else None,
            ints(index, "index") if index is not None else None,
            f.get("line") if type(f.get("line")) is int else None,
            f.get("count") if type(f.get("count")) is int else 1))
    traffic = reply.get("traffic")
    if type(traffic) is not dict or not all(type(k) is str and type(v) is int for k, v in traffic.items()):
        raise wire.WireError("the kernel sandbox sent bad traffic counts")
    intervals, prefetch = reply.get("intervals"), reply.get("prefetch_intervals")
    if type(intervals) is not int or type(prefetch) is not int:
        raise wire.WireError("the kernel sandbox sent a bad interval count")
    return cudacheck.Report(name, ints(reply.get("griddim"), "grid"), ints(reply.get("blockdim"), "block"),
                            findings, intervals, traffic, prefetch_intervals=prefetch)

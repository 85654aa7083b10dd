"""A static scan of answer cells for ways to pass a check without solving the exercise.

The grader runs a learner's answer cells inside the course's own copy of the
notebook, so edited check cells or stored outputs change nothing.  What an
answer cell can still do is change the world the check runs in: patch numpy or
``course_lib.checks``, shadow a name the check reads, call the course's own
kernels instead of computing.  ``scan_answer`` reads the code (it never runs
it) and returns one short reason per thing it finds; an answer with a reason
scores ``tampered``, and the grader does not run it at all.

The rules, kept strict and simple on purpose (an honest answer to these
exercises needs none of this):
- imports only from ``ALLOWED_IMPORTS``; nothing from ``course_lib``;
- no use of a name bound by importing from ``course_lib`` (e.g. ``checks``);
- no assignment to, or deletion of, attributes of imported modules or of
  aliases of them (``np.exp = ...``, ``e = np.linalg; e.norm = ...``);
- no rebinding, at the top level, of an imported name or of a name a check
  cell reads (``q = np.zeros(...)``, ``q[:] = 0``, ``len = ...``);
- no ``global`` statements, and no reading of a name that only check cells
  bind (``cases.clear()`` inside a function);
- nothing that touches an array's flags (``a.flags[...] = True``,
  ``setflags``): check cells hand answers read-only arrays;
- ``getattr`` only with a literal, harmless name (``getattr(x, 'dtype', None)``);
- none of ``FORBIDDEN_NAMES`` (setattr, exec, open, IPython magics, ...) and
  no dunder names, attributes or strings (``x.__dict__``, ``"__builtins__"``)
  but the few harmless ones read in honest code (``type(x).__name__``).
"""
from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass, field

ALLOWED_IMPORTS = frozenset({
    "numpy", "math", "itertools", "functools", "collections", "dataclasses", "typing",
    "ml_dtypes", "numba", "matplotlib",
})
FORBIDDEN_NAMES = frozenset({
    "setattr", "delattr", "exec", "eval", "compile", "__import__", "globals", "locals",
    "vars", "breakpoint", "open", "get_ipython",
})
# Read-only dunders that honest answers use (``type(x).__name__`` in an error
# message, ``super().__init__()``) and that lead nowhere else.
HARMLESS_DUNDERS = frozenset({"__name__", "__qualname__", "__doc__", "__init__"})
_DUNDER = re.compile(r"^__\w+__$")
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef,
           ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def parse(source: str):
    """The AST of a cell, IPython magics turned into Python first; None if it is not Python."""
    try:
        return ast.parse(source)
    except SyntaxError:
        pass
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        return ast.parse(TransformerManager().transform_cell(source))
    except Exception:  # a syntax error: the cell will fail when it runs, as an error
        return None


def _root(node):
    """The name at the root of ``a.b[c].d``, ``getattr(a, ...)``; None otherwise."""
    while True:
        if isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
            node = node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id == "getattr" and node.args):
            node = node.args[0]
        else:
            return node.id if isinstance(node, ast.Name) else None


def _imports(tree) -> dict:
    """{name bound by an import: top-level module it came from}."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound[alias.asname or alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                bound[alias.asname or alias.name] = "." if node.level else (node.module or "").split(".")[0]
    return bound


def _aliases(tree, of: set) -> set:
    """Names assigned (not called) from ``of`` or their attributes: ``e = np.linalg``."""
    found = set(of)
    assigns = [n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.NamedExpr))]
    changed = True
    while changed:
        changed = False
        for node in assigns:
            if node.value is not None and _root(node.value) in found:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name) and name.id not in found:
                            found.add(name.id)
                            changed = True
    return found


def _top_level_names(tree, ctx) -> set:
    """Names bound (ctx=ast.Store) or read (ast.Load) outside any function or class."""
    names, stack = set(), [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, ctx) and depth == 0:
            names.add(node.id)
        if ctx is ast.Store and depth == 0 and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                  ast.ClassDef)):
            names.add(node.name)
        if ctx is ast.Store and depth == 0 and isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(_imports(node))
        inner = depth + (1 if isinstance(node, _SCOPES) else 0)
        stack.extend((child, inner) for child in ast.iter_child_nodes(node))
    return names


@dataclass
class Context:
    """What the rest of the notebook binds and reads, which answers must leave alone."""

    imported: set = field(default_factory=set)     # bound by an import, anywhere
    course: set = field(default_factory=set)       # bound from course_lib, or aliases of those
    protected: set = field(default_factory=set)    # read by check cells, bound elsewhere
    check_only: set = field(default_factory=set)   # bound by check cells and nowhere else

    @classmethod
    def of(cls, other_cells, check_cells, answer_cells):
        """Build it from the sources of the notebook's other, check and answer code cells."""
        trees = {kind: [t for t in map(parse, sources) if t is not None]
                 for kind, sources in (("other", other_cells), ("check", check_cells),
                                       ("answer", answer_cells))}
        imported, course = {}, set()
        for tree in trees["other"] + trees["check"] + trees["answer"]:
            imported.update(_imports(tree))
        for tree in trees["other"] + trees["check"]:
            course |= _aliases(tree, {n for n, mod in _imports(tree).items() if mod == "course_lib"})
        read = set().union(*(_top_level_names(t, ast.Load) for t in trees["check"]))
        written = set().union(*(_top_level_names(t, ast.Store) for t in trees["check"]))
        bound = set().union(*(_top_level_names(t, ast.Store) for t in trees["other"]))
        protected = (read - written) & (bound | set(dir(builtins)))
        check_only = written - bound - set(imported) - set(dir(builtins))
        return cls(set(imported), course | {"course_lib"}, protected, check_only)


def _bound_anywhere(tree) -> set:
    """Every name the cell binds in any scope: assignments, parameters, defs, imports."""
    names = set(_imports(tree))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def scan_answer(source: str, context: Context) -> list:
    """Short reasons why this answer cell tampers with the grading; [] when it is clean."""
    tree = parse(source)
    if tree is None:
        return []
    modules = _aliases(tree, context.imported | set(_imports(tree)))
    declared_global = {n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names}
    own = _bound_anywhere(tree)
    reasons = []

    def flag(reason):
        if reason not in reasons:
            reasons.append(reason)

    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        top = depth == 0
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for name, module in _imports(node).items():
                if module == "course_lib":
                    flag("imports course_lib: answers must compute, not call the course's code")
                elif module not in ALLOWED_IMPORTS:
                    flag(f"imports {module or name} (allowed: {', '.join(sorted(ALLOWED_IMPORTS))})")
        elif isinstance(node, ast.Name):
            if node.id in context.course:
                flag(f"uses {node.id} from course_lib: answers must compute, not call the course's code")
            elif node.id == "get_ipython":
                flag("uses IPython magics or get_ipython: answers must be plain Python")
            elif node.id in FORBIDDEN_NAMES or (_DUNDER.match(node.id) and node.id not in HARMLESS_DUNDERS):
                flag(f"uses {node.id}")
            if isinstance(node.ctx, ast.Load) and node.id in context.check_only and node.id not in own:
                flag(f"reads {node.id}, which only a check cell binds")
            if isinstance(node.ctx, (ast.Store, ast.Del)) and (top or node.id in declared_global):
                if node.id in context.imported:
                    flag(f"rebinds the imported name {node.id}")
                elif node.id in context.protected:
                    flag(f"rebinds {node.id}, which a check cell reads")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and top:
            if node.name in context.imported | context.protected:
                flag(f"redefines {node.name}, which the notebook imports or a check cell reads")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            name = node.args[1] if len(node.args) > 1 else None
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                flag("uses getattr with a computed name")
            elif name.value in ("flags", "setflags"):
                flag("touches an array's flags")
        elif isinstance(node, ast.Global):
            flag(f"declares global {', '.join(node.names)}: answers return what they compute")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and _DUNDER.match(node.value)
              and node.value not in HARMLESS_DUNDERS):
            flag(f"uses the string {node.value!r}")
        if isinstance(node, ast.Attribute):
            if _DUNDER.match(node.attr) and not (node.attr in HARMLESS_DUNDERS and isinstance(node.ctx, ast.Load)):
                flag(f"uses .{node.attr}")
            if node.attr in ("setflags", "flags") or (node.attr == "writeable" and not isinstance(node.ctx, ast.Load)):
                flag("touches an array's flags")
        if isinstance(node, (ast.Attribute, ast.Subscript)) and not isinstance(node.ctx, ast.Load):
            root = _root(node)
            if root in modules:
                flag(f"changes {ast.unparse(node)}, part of an imported module")
            elif root in context.protected and (top or root in declared_global):
                flag(f"modifies {root}, which a check cell reads")
        inner = depth + (1 if isinstance(node, _SCOPES) else 0)
        stack.extend((child, inner) for child in reversed(list(ast.iter_child_nodes(node))))
    return reasons

"""What the course's cells do with names, read from their text: one analysis, four uses.

``cell_names`` reads a cell once and says which names it binds and reads.  From that:

- ``course_names``: every name the course's own cells bind, which an answer never
  replaces in a check;
- ``asked_names``: the names a check takes from the answers: the globals it reads that no course
  cell binds and that are no builtin, which is what its exercise asks the learner to define;
- ``needed_cells``: the course cells the checks depend on (the others, demonstrations
  and timings, are skipped when grading);
- ``sandbox_setup``: what the sandbox runs before the answers (the ``setup`` cells, or
  the course's plain imports).
"""
from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass, field

from .submission import tags
from .worker import plain_python


@dataclass
class Names:
    """The names one cell binds and reads.

    ``bound``, ``free``, ``imported`` and ``defined`` are the cell's top level, in the order
    Python evaluates it (a function body's reads of globals count where it is defined);
    ``bound_anywhere`` counts nested scopes too.  An unreadable cell reads ``*``: everything."""
    bound: set = field(default_factory=set)           # assigned, imported or defined at the top level
    free: set = field(default_factory=set)            # read before the cell binds them
    imported: set = field(default_factory=set)
    defined: set = field(default_factory=set)         # functions and classes
    bound_anywhere: set = field(default_factory=set)  # assignments, defs, imports, loop targets, global


class _Flow(ast.NodeVisitor):
    """Fills a ``Names``'s top-level sets, visiting the cell in the order Python evaluates it."""

    def __init__(self, names: Names):
        self.names = names

    def read(self, name):
        if name not in self.names.bound:
            self.names.free.add(name)

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load):
            self.read(node.id)
        else:
            self.names.bound.add(node.id)

    def visit_Assign(self, node):
        self.visit(node.value)
        for target in node.targets:
            self.visit(target)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self.visit(node.value)
        self.visit(node.target)

    def visit_NamedExpr(self, node):
        self.visit(node.value)
        self.visit(node.target)

    def visit_AugAssign(self, node):
        self.visit(node.value)
        if isinstance(node.target, ast.Name):
            self.read(node.target.id)
        self.visit(node.target)

    def visit_For(self, node):
        self.visit(node.iter)
        self.visit(node.target)
        for child in node.body + node.orelse:
            self.visit(child)

    def visit_Import(self, node):
        for alias in node.names:
            name = (alias.asname or alias.name).split(".")[0]
            self.names.bound.add(name)
            self.names.imported.add(name)

    visit_ImportFrom = visit_Import

    def _scope(self, node, name=None):
        for child in getattr(node, "decorator_list", []) + list(getattr(getattr(node, "args", None), "defaults", []) or []):
            self.visit(child)
        # names local to the scope or to a scope inside it: assigned, a parameter of any function or
        # method in it (a class's methods have theirs too), or a function or class defined in it
        inner = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
        inner |= {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
        inner |= {n.name for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in inner:
                self.read(n.id)
        if name:
            self.names.bound.add(name)
            self.names.defined.add(name)

    def visit_FunctionDef(self, node):
        self._scope(node, node.name)

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef

    def visit_Lambda(self, node):
        self._scope(node)

    def visit_ListComp(self, node):
        self._scope(node)

    visit_SetComp = visit_GeneratorExp = visit_DictComp = visit_ListComp


def cell_names(source) -> Names:
    """What the cell ``source`` (IPython lines allowed) binds and reads."""
    try:
        tree = ast.parse(plain_python(source))
    except SyntaxError:
        return Names(free={"*"})  # unreadable: treat it as reading everything
    names = Names()
    _Flow(names).visit(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.bound_anywhere.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.bound_anywhere.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.bound_anywhere.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.bound_anywhere.update(node.names)
    return names


def course_cells(pristine) -> list:
    """The course's own code cells: all but the answers."""
    return [c for c in pristine.cells if c.cell_type == "code" and "answer" not in tags(c)]


def course_names(pristine) -> set:
    """Every name the course's own cells bind anywhere: an answer never replaces one of them."""
    return set().union(*(cell_names(c.source).bound_anywhere for c in course_cells(pristine)))


def asked_names(check_source, course_bound) -> set:
    """The names the check cell ``check_source`` takes from the answers: the globals it reads
    (not its functions' own arguments and locals) that no course cell binds (``course_bound``),
    no builtin and no ``__dunder__``.  An answer that binds ``range``, ``len`` or ``float`` keeps
    them to itself; the check's are Python's."""
    return {name for name in cell_names(check_source).free - course_bound
            if not hasattr(builtins, name) and not (name.startswith("__") and name.endswith("__"))}


def needed_cells(pristine) -> set:
    """Ids of the course cells the checks depend on: every check cell, and (walking back) each
    cell that binds a name a later needed cell reads, or reads shared state one does (a random
    generator: skipping its draws would change the checks' inputs).  Demonstrations and timings
    that nothing later reads are skipped."""
    cells = course_cells(pristine)
    flows = {c.id: cell_names(c.source) for c in cells}
    # shared state: values assigned by course cells (a generator, arrays), not modules or functions
    state = set().union(*(f.bound - f.imported - f.defined for f in flows.values())) if flows else set()
    needed, wanted = set(), set()
    for cell in reversed(cells):
        flow = flows[cell.id]
        if "check" in tags(cell) or "*" in flow.free or flow.bound & wanted or flow.free & wanted & state:
            needed.add(cell.id)
            wanted |= flow.free
    return needed


def course_constants(pristine) -> str:
    """The number constants the course's cells assign at their top level (``EMPTY, PARTIAL, FULL =
    0, 1, 2``: numbers, tuples and arithmetic of them and of earlier ones), as source; a name a
    course cell later binds to anything else is left out.  A learner's notebook has them, so an
    answer (a compiled kernel of set 08) may use them in the sandbox too."""
    from .kernels import _constant_problem, _target_names

    found = {}   # name -> source of its assignment
    for cell in course_cells(pristine):
        if "check" in tags(cell):
            continue
        text = plain_python(cell.source)
        try:
            tree = ast.parse(text)
        except (SyntaxError, RecursionError, MemoryError, ValueError):
            continue
        for node in ast.walk(tree):
            bound = [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)] \
                if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For, ast.NamedExpr)) else []
            plain = node in tree.body and isinstance(node, ast.Assign) and all(_target_names(t) for t in node.targets)
            if plain and _constant_problem(node.value, set(found)) is None:
                for name in bound:
                    found[name] = ast.get_source_segment(text, node)
            else:
                for name in bound:
                    found.pop(name, None)
    return "\n".join(dict.fromkeys(found.values()))


def sandbox_setup(pristine) -> list:
    """What the sandbox runs before the answers: the ``setup`` cells, or, in a set that has none,
    the top-level imports of the course's cells that do not import course_lib; then the course's
    number constants (``course_constants``)."""
    constants = course_constants(pristine)
    tagged = [c.source for c in pristine.cells if c.cell_type == "code" and "setup" in tags(c)]
    if tagged:
        return tagged + ([constants] if constants else [])
    lines = []
    for cell in pristine.cells:
        if cell.cell_type != "code" or {"answer", "check"} & set(tags(cell)):
            continue
        text = plain_python(cell.source)
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if not any(m.split(".")[0] == "course_lib" for m in modules):
                    lines.append(ast.get_source_segment(text, node))
    return ["\n".join(lines)] + ([constants] if constants else [])

"""The library's layout is a contract: one idea per file, imports running one way.

Layers, bottom to top: the rules and facts every kernel shares (``core``, and
``cudacheck``, which stands alone so the grader's kernel sandbox can hold it
without the rest), the kernels, the public API and checks, the models, the
views, and the tools (benchmarks, grading).  A module may import only from its
own layer or below, and the import graph has no circle, counting the imports
made inside functions.
"""
import ast
from pathlib import Path

import course_lib

PACKAGE = Path(course_lib.__file__).parent
LAYERS = {"core": 0, "cudacheck": 0, "kernels": 1, "api": 2, "checks": 2, "": 2,
          "models": 3, "views": 4, "bench": 5, "grading": 5, "grade": 5, "authoring": 5,
          # one package per later chapter's subject, beside the views (they draw its figures),
          # and the chapters' command-line tools (``tools``) beside the other tools
          "lowp": 4, "backward": 4, "decoder": 4, "parallel": 4, "edge": 4,
          "tools": 5}
# The top level: the public modules and command-line tools, then one package per idea.
MAX_TOP_MODULES = 8
MAX_LINES = 600
MAX_FUNCTION_LINES = 200


def modules():
    """Dotted name -> (path, is_package) of every module of course_lib."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        found[".".join(parts)] = (path, rel.name == "__init__")
    return found


def imports_of(name, path, is_package, known):
    """The course_lib modules ``name`` imports, at module level or inside functions."""
    package = name.split(".") if is_package else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("course_lib")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            if not base.startswith("course_lib"):
                continue
            submodules = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known}
            out |= submodules if len(submodules) == len(node.names) else submodules | {base}
    return {m for m in out if m in known and m != name}


def layer(name):
    parts = name.split(".")
    return LAYERS[parts[1] if len(parts) > 1 else ""]


def graph():
    known = modules()
    return {name: imports_of(name, path, is_package, known) for name, (path, is_package) in known.items()}


def test_every_module_belongs_to_a_layer():
    unplaced = sorted(name for name in modules() if (name.split(".") + [""])[1] not in LAYERS)
    assert not unplaced, f"add these to a layer in LAYERS: {unplaced}"


def test_no_module_imports_from_a_layer_above_its_own():
    upward = sorted(f"{a} -> {b}" for a, deps in graph().items() for b in deps if layer(b) > layer(a))
    assert not upward, "imports running back up:\n" + "\n".join(upward)


def test_the_import_graph_has_no_circle():
    edges, state, circles = graph(), {}, []

    def visit(node, path):
        state[node] = "open"
        for dep in sorted(edges[node]):
            if state.get(dep) == "open":
                circles.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_no_library_file_is_longer_than_a_sitting():
    long = sorted(f"{p.relative_to(PACKAGE)}: {n} lines" for p in PACKAGE.rglob("*.py")
                  if (n := len(p.read_text().splitlines())) > MAX_LINES)
    assert not long, f"files over {MAX_LINES} lines:\n" + "\n".join(long)


def long_functions(root=PACKAGE, limit=MAX_FUNCTION_LINES):
    """"path:line name: n lines" of every function (a nested one counted on its own, its lines also its
    enclosing function's) longer than ``limit`` lines, decorators and docstring included."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                if (n := node.end_lineno - first + 1) > limit:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {n} lines")
    return found


def test_no_function_is_longer_than_a_screenful_or_two():
    """A kernel version is one function a reader can hold; a longer one is two ideas (or a factory of flags)."""
    long = long_functions()
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_a_planted_long_function_is_caught(tmp_path):
    (tmp_path / "m.py").write_text("def outer():\n    def inner():\n" + "        x = 1\n" * 200 + "    return inner\n")
    assert long_functions(tmp_path) == ["m.py:1 outer: 203 lines", "m.py:2 inner: 201 lines"]
    assert long_functions(tmp_path, limit=203) == []


def test_the_top_level_holds_few_modules_and_only_placed_packages():
    modules_ = sorted(p.name for p in PACKAGE.glob("*.py"))
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    assert len(modules_) <= MAX_TOP_MODULES, modules_
    assert set(packages) <= set(LAYERS), f"a package without a layer: {sorted(set(packages) - set(LAYERS))}"


def test_a_planted_upward_import_and_circle_are_caught(tmp_path, monkeypatch):
    """The checks above can fail: a copy of two modules with an upward import and a circle."""
    pkg = tmp_path / "course_lib"
    (pkg / "core").mkdir(parents=True)
    (pkg / "views").mkdir()
    for d in (pkg, pkg / "core", pkg / "views"):
        (d / "__init__.py").write_text("")
    (pkg / "core" / "rules.py").write_text("from ..views import plot\n")
    (pkg / "views" / "plot.py").write_text("from ..core import rules\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", pkg)
    edges = graph()
    assert "course_lib.views.plot" in edges["course_lib.core.rules"]
    assert layer("course_lib.views.plot") > layer("course_lib.core.rules")
    assert "course_lib.core.rules" in edges["course_lib.views.plot"]

"""The import graph of clustertrain/: no cycles, one-way stages, and light CLI start-up.

How the graph is built (static, from the source with ``ast``):

* every ``import`` / ``from ... import`` in a module counts, also inside functions (a function-level
  import is still a dependency: it only hides a cycle until the function runs); imports under
  ``if TYPE_CHECKING:`` do not (they never run);
* relative imports are resolved against the importing module's package;
* ``import a.b.c`` depends on ``a.b.c``; ``from pkg import name`` depends on ``pkg.name`` when that is a
  module, else on ``pkg``;
* importing a submodule also runs its packages' ``__init__``: a module depends on the packages of what
  it imports *outside its own package* (``project`` importing ``cloud.config`` depends on ``cloud``
  too). Inside one package the edge to its own ``__init__`` is left out: a package's ``__init__``
  importing its submodules, which import each other, is the normal shape and not a cycle;
* a lazy package ``__init__`` (a table public name -> ``"clustertrain.x.y"`` module, loaded by its
  ``__getattr__``) imports nothing when it runs; ``from pkg import name`` then depends on the module
  the table names for ``name`` (plus ``pkg`` itself, whose ``__init__`` runs but has no edges).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "clustertrain"
HEAVY = ("torch", "numpy", "boto3", "botocore", "tokenizers", "pcluster")


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _lazy_tables() -> dict[str, dict[str, str]]:
    """package -> {public name: module} for every package ``__init__`` with a lazy table (a dict literal
    whose values are all clustertrain module names)."""
    tables: dict[str, dict[str, str]] = {}
    for name, path in MODULES.items():
        if path.name != "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Dict) and node.keys and all(
                    isinstance(k, ast.Constant) and isinstance(v, ast.Constant) and v.value in MODULES
                    for k, v in zip(node.keys, node.values)):
                tables.setdefault(name, {}).update({k.value: v.value for k, v in zip(node.keys, node.values)})
    return tables


LAZY = _lazy_tables()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every module name ``module`` imports (see the module docstring), internal or not."""
    package = module if is_package else module.rpartition(".")[0]
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                out.add(sub if sub in MODULES else source)
                if alias.name in LAZY.get(source, {}):
                    out.add(LAZY[source][alias.name])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        is_package = path.name == "__init__.py"
        own = name if is_package else name.rpartition(".")[0]
        edges: set[str] = set()
        for target in _imports(ast.parse(path.read_text(), str(path)), name, is_package):
            if target not in MODULES:
                continue
            edges.add(target)
            parts = target.split(".")
            for i in range(2, len(parts)):  # the packages a submodule import runs, outside our own package
                parent = ".".join(parts[:i])
                if not (own == parent or own.startswith(parent + ".")):
                    edges.add(parent)
        edges.discard(name)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def connect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(found)


def _path_in(graph: dict[str, set[str]], component: list[str]) -> str:
    """One concrete cycle through the component's first module, for the failure message."""
    members, start = set(component), component[0]
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                return " -> ".join(paths[v] + [start])
            if w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    return " -> ".join(component)


def test_the_graph_sees_the_shapes_it_must():
    """The parser itself: function-level and relative imports count, TYPE_CHECKING ones do not."""
    code = (
        "from typing import TYPE_CHECKING\n"
        "from . import rundir\n"
        "from .launch import slurmcli\n"
        "if TYPE_CHECKING:\n    from clustertrain.project import Project\n"
        "def f():\n    import clustertrain.plan.plan\n    from clustertrain.core.states import State\n"
    )
    found = _imports(ast.parse(code), "clustertrain.check", is_package=False)
    assert {"clustertrain.core.run_paths", "clustertrain.launch.slurmcli", "clustertrain.plan.plan", "clustertrain.core.states"} <= found
    assert "clustertrain.project" not in found
    lazy = _imports(ast.parse("from clustertrain.storage import sync"), "clustertrain.x", is_package=False)
    assert lazy == {"clustertrain.storage", "clustertrain.storage.syncing"}  # through the lazy table
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _path_in(graph, ["a", "b", "c"]) == "a -> b -> c -> a"


def test_no_import_cycles_inside_clustertrain():
    graph = _graph()
    cycles = _cycles(graph)
    assert not cycles, "import cycles inside clustertrain/ (break each by moving the shared piece to its own module):\n" + \
        "\n".join(f"  {_path_in(graph, c)}   [{', '.join(c)}]" for c in cycles)


def test_lazy_public_names_are_not_shadowed_by_submodules():
    """A lazy package's public ``sync`` next to a submodule ``sync.py``: once anything imports the
    submodule, ``from pkg import sync`` returns the module instead of the function."""
    assert LAZY, "no lazy package tables found: the parser lost them"
    clashes = sorted(f"{pkg}.{name}" for pkg, table in LAZY.items() for name in table if f"{pkg}.{name}" in MODULES)
    assert not clashes, "public names that are also submodules (rename the module): " + ", ".join(clashes)


def test_train_imports_nothing_from_cloud_launch_or_cli():
    graph = _graph()
    banned = ("clustertrain.cloud", "clustertrain.launch", "clustertrain.cli")
    bad = sorted(f"{m} -> {t}" for m, targets in graph.items() if m.startswith("clustertrain.train")
                 for t in targets if t.startswith(banned))
    assert not bad, "train/ runs on compute nodes and must not import cloud/, launch/ or cli:\n  " + "\n  ".join(bad)


def _heavy_after(code: str) -> dict[str, bool]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_cli_and_plan_modules_do_not_import_torch():
    loaded = _heavy_after("import clustertrain.cli\nimport clustertrain.plan.plan")
    assert not loaded["torch"], "importing clustertrain.cli or clustertrain.plan.plan pulled in torch"
    heavy = sorted(m for m, present in loaded.items() if present)
    assert not heavy, f"importing clustertrain.cli pulled in {heavy}: import them inside the command that needs them"


def test_plan_command_does_not_import_torch():
    code = (
        "import contextlib, io, sys\n"
        "from clustertrain.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    try:\n        main(['plan', 'examples/quickstart.yaml'])\n"
        "    except SystemExit as e:\n        code = e.code\n"
        "assert code in (0, None), (code, out.getvalue()[-500:])\n"
        "assert out.getvalue().strip(), 'plan printed nothing'\n"
    )
    loaded = _heavy_after(code)
    assert not loaded["torch"], "`clustertrain plan examples/quickstart.yaml` imported torch"
    heavy = sorted(m for m, present in loaded.items() if present)
    assert not heavy, f"`clustertrain plan examples/quickstart.yaml` imported {heavy}, which planning never uses"

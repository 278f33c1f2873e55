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


def _imports(tree: ast.AST, module: str, is_package: bool, type_only: bool = False) -> set[str]:
    """Every module name ``module`` imports (see the module docstring), internal or not; with ``type_only`` the
    imports under ``if TYPE_CHECKING:`` count too."""
    package = module if is_package else module.rpartition(".")[0]
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test) and not type_only:
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


def _graph(type_only: bool = False) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        is_package = path.name == "__init__.py"
        own = name if is_package else name.rpartition(".")[0]
        edges: set[str] = set()
        for target in _imports(ast.parse(path.read_text(), str(path)), name, is_package, type_only):
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
        "from .core import run_paths\n"
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


def test_no_import_cycles_even_counting_type_only_imports():
    """A type-only import is still a tie: ``project.py`` naming a stage's type while the stage names ``Project``
    is a loop a reader must hold in mind, and one runtime import away from a real cycle."""
    graph = _graph(type_only=True)
    cycles = _cycles(graph)
    assert not cycles, "import cycles counting TYPE_CHECKING imports (move the shared type down to core/ or a section):\n" + \
        "\n".join(f"  {_path_in(graph, c)}   [{', '.join(c)}]" for c in cycles)


# ---------------------------------------------------------------------------------------------
# The direction table: which room may import which

#: The floors of clustertrain/, lowest first. A module may import its own room and every room on a lower floor;
#: rooms on one floor do not import each other. A room is a top-level package or module, except that each stage's
#: project-file section (``<stage>/config.py``) is the "sections" room: the project composes them, and any stage
#: may read another's section. Importing ``<stage>/config.py`` runs ``<stage>/__init__``, which imports nothing but
#: core (a lazy table or a docstring): such an edge to a package ``__init__`` is not an arrow.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("core",),       # formats and vocabulary several stages read: torch-free, imports nothing above
    ("sections",),   # each stage's project-file section, and the AWS limits the aws: section validates against
    ("project",),    # the project file: composes the sections, describes only
    ("storage",),    # object stores, manifests, sync
    ("data",),       # tokenizers, MMIDIDX, preprocessing, staging (stages data through storage)
    ("plan",),       # capacity, memory, time, cost: reads the data's tokenizer for the vocabulary
    ("cloud",),      # ParallelCluster config, CloudFormation (sizes queues from the plan's catalog)
    ("image",),      # the container recipe, build, import
    ("megatron",),   # the Megatron-LM adapter (reads the image's pins, the plan's catalog)
    ("monitor",),    # what watches a run and reads it back (status reads Megatron's logs)
    ("train",),      # the per-rank trainer (starts the node sampler, reads data)
    ("hf",),         # Hugging Face directories out of runs: reads checkpoints, the trainer's model, publishes via storage
    ("launch",),     # backends that start the trainer (or Megatron) under the run's records
    ("validate",),   # the validation suite: jobs through the launch backends
    ("resolve", "check", "docs"),  # above every stage: the resolver, the whole-project check, the reference docs
    ("rehearsal",),  # the 80-node rehearsal: check, cluster config, submit on an emulated cluster
    ("cli",),
    ("__main__",),
)

#: Modules whose room is not their package's (see FLOORS).
ROOM_OF = {"clustertrain": "core", "clustertrain.cloud.limits": "sections"}

#: The arrows that run up, each with its reason: (importing module, room it imports) -> why.
UPWARD: dict[tuple[str, str], str] = {
    ("clustertrain.cloud.lifecycle", "check"):
        "cluster create/update refuse a project that `clustertrain check` finds errors in (require_clean): the one "
        "stage action gated on the whole-project check, so a library caller cannot skip it",
    ("clustertrain.image.check", "launch"):
        "`image check` is a client of the validation suite: it submits the suite's smoke jobs inside the image",
    ("clustertrain.image.check", "validate"):
        "`image check` is a client of the validation suite: it runs the suite's scan and smoke checks in the image",
}


def _room(module: str) -> str:
    if module in ROOM_OF:
        return ROOM_OF[module]
    parts = module.split(".")
    if len(parts) == 3 and parts[2] == "config" and parts[1] != "cli":
        return "sections"
    return parts[1]


def _floor_of() -> dict[str, int]:
    return {room: i for i, rooms in enumerate(FLOORS) for room in rooms}


def _arrows(graph: dict[str, set[str]]) -> list[tuple[str, str, str, str]]:
    """(module, target, room, target room) for every import between rooms; edges to an ``__init__`` that imports
    nothing are left out (see FLOORS)."""
    silent = {m for m, targets in graph.items() if MODULES[m].name == "__init__.py" and all(_room(t) == "core" for t in targets)}
    return sorted((m, t, _room(m), _room(t)) for m, targets in graph.items() for t in targets
                  if t not in silent and _room(m) != _room(t))


def test_every_room_is_on_a_floor():
    floor = _floor_of()
    rooms = {_room(m) for m in MODULES}
    assert rooms <= set(floor), f"rooms without a floor in FLOORS (add each where it belongs): {sorted(rooms - set(floor))}"
    assert not set(floor) - rooms, f"FLOORS names rooms that do not exist: {sorted(set(floor) - rooms)}"


def test_imports_follow_the_direction_table():
    """Every import between rooms runs down the floors, or is one of the justified UPWARD arrows; and every UPWARD
    arrow still exists (a stale excuse hides the next real one)."""
    floor = _floor_of()
    arrows = _arrows(_graph())
    up = [(m, t, a, b) for m, t, a, b in arrows if floor[b] >= floor[a]]
    unexcused = sorted(f"{m} -> {t}   ({a} -> {b})" for m, t, a, b in up if (m, b) not in UPWARD)
    assert not unexcused, ("imports against the direction table (tests/unit/test_import_graph.py FLOORS): move the "
                           "shared piece down (core/ for a format), or justify the arrow in UPWARD:\n  " + "\n  ".join(unexcused))
    used = {(m, b) for m, _, _, b in up}
    stale = sorted(f"{m} -> {room}" for m, room in UPWARD if (m, room) not in used)
    assert not stale, f"UPWARD arrows that no longer exist (remove them): {stale}"
    assert len(UPWARD) <= 5, "more than a handful of upward arrows: the floors no longer describe the house"


def test_the_direction_table_fails_on_a_new_upward_arrow():
    """The check itself: a plan module importing the launcher, or core importing a stage, is caught."""
    graph = {m: set(t) for m, t in _graph().items()}
    graph["clustertrain.plan.plan"].add("clustertrain.launch.sbatch")
    graph["clustertrain.core.run_paths"].add("clustertrain.train.checkpoint")
    floor = _floor_of()
    up = {(m, t) for m, t, a, b in _arrows(graph) if floor[b] >= floor[a] and (m, b) not in UPWARD}
    assert up == {("clustertrain.plan.plan", "clustertrain.launch.sbatch"),
                  ("clustertrain.core.run_paths", "clustertrain.train.checkpoint")}


def test_core_imports_no_heavy_library():
    """core/ is what every stage reads, the launcher and the CLI included: importing all of it loads no torch,
    numpy or boto3."""
    names = sorted(m for m in MODULES if m.startswith("clustertrain.core."))
    loaded = _heavy_after("\n".join(f"import {m}" for m in names))
    heavy = sorted(m for m, present in loaded.items() if present)
    assert not heavy, f"importing clustertrain.core pulled in {heavy}"


def test_project_imports_no_stage_module_but_sections():
    """project.py only describes: it composes the sections and reads core; cross-stage rules are the resolver's."""
    graph = _graph(type_only=True)
    runtime = _graph()
    lazy = {m for m in MODULES if MODULES[m].name == "__init__.py" and all(_room(t) == "core" for t in runtime[m])}
    bad = sorted(t for t in graph["clustertrain.project"] if _room(t) not in ("core", "sections") and t not in lazy)
    assert not bad, f"clustertrain/project.py imports stage modules (move the rule to clustertrain/resolve.py): {bad}"


def test_no_stage_imports_the_resolver():
    graph = _graph(type_only=True)
    floor = _floor_of()
    bad = sorted(m for m, targets in graph.items() if "clustertrain.resolve" in targets and floor[_room(m)] < floor["resolve"])
    assert not bad, f"stages must receive a resolved project from their caller, not import clustertrain.resolve: {bad}"


# ---------------------------------------------------------------------------------------------
# One name per concept

#: Stems that more than one module carries on purpose, because the modules name one concept: stem -> why.
SHARED_STEMS = {
    "__init__": "every package has one",
    "config": "each stage's project-file section is its <stage>/config.py (cli/config.py is the `config` command group)",
    "preflight": "each stage's findings for `clustertrain check`, one per stage",
    "catalog": "plan/catalog.py is the one instance catalog; cloud/catalog.py is the cloud stage's view of it, no copy",
    "collectives": "validate/collectives.py runs the collective benchmarks; suite_checks/collectives.py is the suite's "
                   "job of that same check",
    "storage": "suite_checks/storage.py is the suite's job of validate storage; cli/storage.py the storage commands",
    "jobs": "cli/jobs.py (submit/status/logs/cancel) and rehearsal/jobs.py (the rehearsal's jobs) are both about Slurm "
            "jobs of a project",
    "validate": "cli/validate.py is the command group of the validate stage; cloud/validate.py validates a "
                "ParallelCluster file (`cluster validate`)",
    "check": "check.py is the whole-project check; cli/check.py its command; image/check.py the image's check",
    "plan": "plan/plan.py is the plan; cli/plan.py its command",
    "export": "hf/export.py writes a run's checkpoint as a Hugging Face directory; cli/export.py its command",
    "run": "launch/run.py runs a project locally; cli/run.py is its command; rehearsal/run.py runs the rehearsal",
    "report": "monitor/report.py is the run report; cli/report.py its command; rehearsal/report.py the rehearsal's",
    "rules": "cloud/rules.py and megatron/rules.py: each the rules of the thing it names (a ParallelCluster file, Megatron)",
    "cluster": "cli/cluster.py is the `cluster` command group; rehearsal/cluster.py the emulated cluster",
}


def test_no_two_modules_share_a_stem_that_names_different_concepts():
    by_stem: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        by_stem.setdefault(path.stem, []).append(name)
    shared = {stem: sorted(names) for stem, names in by_stem.items() if len(names) > 1}
    unexplained = {stem: names for stem, names in shared.items() if stem not in SHARED_STEMS}
    assert not unexplained, ("module names shared by different modules (rename one so the name says which, or "
                             "justify the stem in SHARED_STEMS): " + "; ".join(f"{s}: {', '.join(n)}" for s, n in sorted(unexplained.items())))
    stale = sorted(set(SHARED_STEMS) - set(shared))
    assert not stale, f"SHARED_STEMS that no two modules share any more (remove them): {stale}"


def test_the_architecture_page_shows_the_direction_table():
    """docs/architecture.md draws FLOORS for people: the same rooms on the same floors, so the two cannot drift."""
    import re

    doc = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| (\d+) \| (.+?) \| .+ \|$", doc, flags=re.M)
    shown = [tuple(sorted(re.sub(r"[`/]|\.py", "", name).strip() for name in rooms.split(","))) for _, rooms in rows]
    expected = [tuple(sorted(rooms)) for rooms in FLOORS if rooms != ("__main__",)]
    assert shown == expected, f"docs/architecture.md's floors {shown} differ from FLOORS {expected}"

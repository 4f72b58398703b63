"""The import rules of ``docs/architecture.md``, checked on the source text (``ast``; nothing is imported).

Layers, lowest first; a module may import its own layer and the layers below, never one above:

    progpo_base (base) <- webshop_server (shop) <- progpo_envs (envs) <- agents (harness) <- training
    <- benchmarks, scripts, progpo_verl <- progpo (the dispatcher)

Both ends are checked as such: the base imports nothing else from the project (every layer may import it),
and nothing imports the dispatcher, which names each subcommand's module as a string.

``training.advantages`` is a leaf: it imports nothing from the project outside itself. On top of the layers:
no import cycles between modules (imports inside functions count: a lazy import hides a cycle, it does not
remove it; imports under ``if TYPE_CHECKING:`` do not run and are left out of the cycle check only), and no
module uses another module's private (underscore) names: ``from x import _y``, ``import x._y`` from outside
``x``'s package, ``x._y`` on an imported module, or ``obj._y`` where ``_y`` is a private function, method,
class or attribute that only another module of the project defines.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.paths import REPO_ROOT as ROOT

#: Import layers, lowest first (docs/architecture.md "Layers").
LAYERS: tuple[tuple[str, ...], ...] = (
    ("progpo_base",),
    ("webshop_server",),
    ("progpo_envs",),
    ("agents",),
    ("training",),
    ("benchmarks", "scripts", "progpo_verl"),
    ("progpo",),
)
#: The lowest layer, which every layer may import, and the dispatcher at the top, which nothing imports.
BASE, DISPATCHER = "progpo_base", "progpo.cli"
#: Subpackages that may import nothing from the project outside themselves.
LEAVES = ("training.advantages",)
#: Third-party top-level packages that only the modules named for them may import: verl-agent installs
#: itself as ``verl`` (with ``agent_system``), and the project never depends on it (docs/architecture.md,
#: rule 3).
RESTRICTED_IMPORTS = {
    "verl": ("progpo_verl.upstream", "progpo_verl.verl_agent.__main__"),
    "agent_system": ("progpo_verl.upstream", "progpo_verl.verl_agent.__main__"),
}
#: The benchmarks' shared code: the only modules of ``benchmarks`` a benchmark may import (rule 5). Every
#: other module of ``benchmarks`` is a benchmark, except the ones that run or show them all.
BENCHMARK_LIBRARY = ("benchmarks.common", "benchmarks.one_thread", "benchmarks.harness", "benchmarks.lib")
#: The results page and ``progpo bench``: they read every benchmark's spec, so they may import benchmarks.
BENCHMARK_RUNNERS = ("benchmarks.report", "benchmarks.cli")
#: Test packages that name no source package (rule 6), each with why.
TEST_PACKAGES_OF_THEIR_OWN = {
    "progpo_envs.new_env": "an env added as docs/adding_an_environment.md says: it has no source package",
}


@dataclasses.dataclass(frozen=True)
class Import:
    """One import statement's effect: ``importer`` needs ``target`` (a module of the project)."""

    importer: str
    target: str
    line: int
    type_checking: bool
    names: tuple[str, ...] = ()  # names taken with ``from target import ...`` (attributes, not submodules)


@dataclasses.dataclass
class Module:
    """One parsed source file."""

    name: str
    rel: str  # path relative to the analysed root, for reports
    tree: ast.Module
    is_package: bool


def module_name(root: Path, path: Path) -> tuple[str, bool]:
    """Dotted module name of ``path`` and whether it is a package's ``__init__``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def collect_modules(root: Path, tops: Iterable[str]) -> dict[str, Module]:
    """Parse every ``.py`` file under ``root/<top>`` for each top-level package or script folder."""
    modules: dict[str, Module] = {}
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            name, is_package = module_name(root, path)
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            modules[name] = Module(name, path.relative_to(root).as_posix(), tree, is_package)
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk_imports(nodes: Iterable[ast.AST], type_checking: bool = False):
    """Yield ``(import node, under TYPE_CHECKING)`` for each import in ``nodes`` and below (functions too)."""
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, type_checking
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _walk_imports(node.body, True)
            yield from _walk_imports(node.orelse, type_checking)
        else:
            yield from _walk_imports(ast.iter_child_nodes(node), type_checking)


def _resolve_relative(module: Module, level: int, name: str | None) -> str:
    base = module.name.split(".")
    if not module.is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, name] if name else base)


def collect_imports(modules: dict[str, Module]) -> list[Import]:
    """Every edge importer -> project module, with the names a ``from`` import takes."""
    edges: list[Import] = []
    for mod in modules.values():
        for node, type_checking in _walk_imports(mod.tree.body):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules:  # third-party modules are outside the rules
                        edges.append(Import(mod.name, alias.name, node.lineno, type_checking))
                continue
            source = _resolve_relative(mod, node.level, node.module) if node.level else node.module
            if source is None:
                continue
            attributes = []
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in modules:  # ``from pkg import submodule``
                    edges.append(Import(mod.name, submodule, node.lineno, type_checking))
                else:
                    attributes.append(alias.name)
            if attributes and source in modules:
                edges.append(Import(mod.name, source, node.lineno, type_checking, tuple(attributes)))
    return edges


def restricted_imports(modules: dict[str, Module]) -> list[str]:
    """Imports of a :data:`RESTRICTED_IMPORTS` package (inside functions too) by a module not named for it."""
    found = []
    for mod in modules.values():
        for node, _ in _walk_imports(mod.tree.body):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif node.level == 0 and node.module:
                targets = [node.module]
            else:
                continue
            for target in targets:
                allowed = RESTRICTED_IMPORTS.get(target.split(".")[0])
                if allowed is not None and mod.name not in allowed:
                    found.append(f"{mod.rel}:{node.lineno}: {mod.name} imports {target}")
    return found


def layer_of(module: str) -> int:
    top = module.split(".")[0]
    for rank, tops in enumerate(LAYERS):
        if top in tops:
            return rank
    raise ValueError(f"{module} is in no layer")


def _in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def upward_imports(edges: list[Import], modules: dict[str, Module]) -> list[str]:
    """Imports of a higher layer, and imports leaving a leaf package; one report line each."""
    found = []
    for edge in edges:
        where = f"{modules[edge.importer].rel}:{edge.line}: {edge.importer} imports {edge.target}"
        for leaf in LEAVES:
            if _in_package(edge.importer, leaf) and not _in_package(edge.target, leaf):
                found.append(f"{where} (the leaf {leaf} imports nothing from the project)")
        if layer_of(edge.target) > layer_of(edge.importer):
            found.append(f"{where} (a higher layer)")
    return found


def benchmark_imports(edges: list[Import], modules: dict[str, Module]) -> list[str]:
    """Imports of a benchmark by another benchmark or by the benchmarks' library; one report line each."""
    found = []
    for edge in edges:
        importer, target = edge.importer, edge.target
        if not _in_package(target, "benchmarks") or target == "benchmarks":
            continue
        if any(_in_package(target, lib) for lib in BENCHMARK_LIBRARY):
            continue
        if not _in_package(importer, "benchmarks") or importer in BENCHMARK_RUNNERS:
            continue
        found.append(f"{modules[importer].rel}:{edge.line}: {importer} imports the benchmark {target}")
    return found


def find_cycles(edges: list[Import]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan), as a closed path."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        if not edge.type_checking and edge.importer != edge.target:
            graph.setdefault(edge.importer, set()).add(edge.target)
            graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def strongconnect(node: str) -> None:  # recursion depth <= number of modules (~150)
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                strongconnect(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            strongconnect(node)

    cycles = []
    for component in components:
        members = set(component)
        start = component[0]
        # shortest path back to start inside the component (BFS), to report a readable cycle
        parent: dict[str, str] = {}
        frontier = [start]
        seen = {start}
        closing = None
        while frontier and closing is None:
            nxt = []
            for node in frontier:
                for succ in sorted(graph[node] & members):
                    if succ == start:
                        closing = node
                        break
                    if succ not in seen:
                        seen.add(succ)
                        parent[succ] = node
                        nxt.append(succ)
                if closing is not None:
                    break
            frontier = nxt
        path = [closing]
        while path[-1] != start:
            path.append(parent[path[-1]])
        cycles.append([*reversed(path), start])
    return cycles


def _defined_private_names(mod: Module) -> set[str]:
    """Private names a module defines: functions, classes, methods, module globals, ``self._x`` attributes."""
    names = set()
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {n for n in names if _is_private(n)}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_aliases(mod: Module, modules: dict[str, Module]) -> dict[str, str]:
    """Local names bound to project modules: ``import a.b as x``, ``from a import b`` (b a module)."""
    aliases = {}
    for node, _ in _walk_imports(mod.tree.body):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in modules:
                    aliases[alias.asname] = alias.name
                elif not alias.asname and alias.name.split(".")[0] in modules:
                    aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]
        else:
            source = _resolve_relative(mod, node.level, node.module) if node.level else node.module
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
    return aliases


def private_uses(edges: list[Import], modules: dict[str, Module]) -> list[str]:
    """Private names used outside the module (or, for a private module, the package) that defines them."""
    found = []
    for edge in edges:
        where = f"{modules[edge.importer].rel}:{edge.line}"
        for name in edge.names:
            if _is_private(name):
                found.append(f"{where}: {edge.importer} imports {name} from {edge.target}")
        parts = edge.target.split(".")
        private = [i for i, part in enumerate(parts) if _is_private(part)]
        if private and not _in_package(edge.importer, ".".join(parts[: private[0]])):
            found.append(f"{where}: {edge.importer} imports the private module {edge.target}")

    defined = {name: _defined_private_names(mod) for name, mod in modules.items()}
    owners: dict[str, set[str]] = {}
    for name, privates in defined.items():
        for private in privates:
            owners.setdefault(private, set()).add(name)
    for mod in modules.values():
        aliases = _module_aliases(mod, modules)
        for node in ast.walk(mod.tree):
            if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
                continue
            value = node.value
            if isinstance(value, ast.Name) and value.id in aliases:
                found.append(f"{mod.rel}:{node.lineno}: {mod.name} uses {aliases[value.id]}.{node.attr}")
                continue
            if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                continue
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super":
                continue
            if node.attr in defined[mod.name]:
                continue
            others = owners.get(node.attr, set()) - {mod.name}
            if others:
                what = ast.unparse(value)
                found.append(
                    f"{mod.rel}:{node.lineno}: {mod.name} uses {what}.{node.attr}, "
                    f"private to {', '.join(sorted(others))}"
                )
    return found


@functools.cache
def analyse(root: Path) -> tuple[dict[str, Module], list[Import]]:
    """Parse the layered packages under ``root``; return the modules and the import edges between them."""
    tops = [top for layer in LAYERS for top in layer if (root / top).is_dir()]
    modules = collect_modules(root, tops)
    return modules, collect_imports(modules)


def _report(title: str, lines: list[str]) -> str:
    return f"{len(lines)} {title}:\n  " + "\n  ".join(lines)


def describe_cycle(cycle: list[str], edges: list[Import], modules: dict[str, Module]) -> str:
    """``a (a.py:12) -> b (b.py:40) -> a``: each module with the line of its import of the next."""
    line = {(e.importer, e.target): e.line for e in reversed(edges) if not e.type_checking}
    hops = [f"{a} ({modules[a].rel}:{line[a, b]})" for a, b in zip(cycle, cycle[1:], strict=False)]
    return " -> ".join([*hops, cycle[0]])


def test_layers_are_those_of_the_docs():
    """``LAYERS`` is the order that ``docs/architecture.md`` states (rule 1, "Layers")."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rule = next(line for line in text.splitlines() if line.startswith("1. **Layers.**"))
    stated = tuple(tuple(re.findall(r"`([a-z_]+)`", part)) for part in rule.split("←"))
    assert stated == LAYERS


def import_cycles(edges: list[Import], modules: dict[str, Module]) -> list[str]:
    """The import cycles (:func:`find_cycles`); one report line each (:func:`describe_cycle`)."""
    return [describe_cycle(cycle, edges, modules) for cycle in find_cycles(edges)]


#: The import rules by name: what a breach of each is, and the check that lists its breaches.
IMPORT_RULES = {
    "cycles": ("import cycle(s) between modules", import_cycles),
    "upward": ("import(s) against the layers of docs/architecture.md", upward_imports),
    "verl": (
        "import(s) of verl outside the modules that run inside it",
        lambda edges, modules: restricted_imports(modules),
    ),
    "private-names": ("use(s) of another module's private names", private_uses),
    "benchmarks": ("import(s) of a benchmark outside the results page and progpo bench", benchmark_imports),
}


@pytest.mark.parametrize("rule", IMPORT_RULES)
def test_the_import_rules_hold(rule):
    title, check = IMPORT_RULES[rule]
    modules, edges = analyse(ROOT)
    found = check(edges, modules)
    assert not found, _report(title, found)


def test_the_base_is_imported_by_every_layer_and_imports_nothing():
    """Both ends of the layers: the base package stands on nothing of the project, and every layer under the
    dispatcher uses it (its command line, at least)."""
    modules, edges = analyse(ROOT)
    assert not [e for e in edges if _in_package(e.importer, BASE) and not _in_package(e.target, BASE)]
    users = {layer_of(e.importer) for e in edges if _in_package(e.target, BASE)}
    assert users >= {layer_of(top) for top in ("webshop_server", "progpo_envs", "agents", "training")}


def test_nothing_imports_the_dispatcher_and_it_names_each_command_by_its_module():
    """The dispatcher is the top: no module imports it; the subcommands it names by string are modules of the
    layers below it, each with a ``main``."""
    modules, edges = analyse(ROOT)
    assert not [f"{e.importer} imports {e.target}" for e in edges if _in_package(e.target, "progpo")]
    tree = modules[DISPATCHER].tree
    table = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "SUBCOMMANDS"
    )
    named = [ast.literal_eval(value)[0] for value in table.values]
    assert named and all(layer_of(name) < layer_of(DISPATCHER) for name in named)
    for name in named:
        functions = {n.name for n in modules[name].tree.body if isinstance(n, ast.FunctionDef)}
        assert "main" in functions, f"{name} has no main(argv)"


def test_the_tests_mirror_the_source_tree():
    """Rule 6: every folder of tests is the package ``tests.<name>`` of the source package ``<name>`` (so
    pytest's importlib mode imports each test module by that name); the repo-wide tests are the files of
    ``tests/`` itself. A folder without ``__init__.py`` under a test package holds data (fixtures, a stand-in
    of a third-party package) and no tests."""
    tests = ROOT / "tests"
    packages, wrong = [], []
    for folder in sorted(p for p in tests.rglob("*") if p.is_dir() and "__pycache__" not in p.parts):
        rel = folder.relative_to(tests)
        if not all((tests.joinpath(*rel.parts[:i]) / "__init__.py").is_file() for i in range(len(rel.parts))):
            continue  # inside a data folder
        if (folder / "__init__.py").is_file():
            packages.append(".".join(rel.parts))
        elif any(folder.rglob("test_*.py")) or any(folder.rglob("conftest.py")):
            wrong.append(f"tests/{rel.as_posix()} holds tests but is no package (add an __init__.py)")
    for name in packages:
        source = ROOT / name.replace(".", "/") / "__init__.py"
        if name not in TEST_PACKAGES_OF_THEIR_OWN and not source.is_file():
            wrong.append(f"tests/{name.replace('.', '/')} names no source package {name}")
    assert (tests / "__init__.py").is_file() and packages
    assert not wrong, _report("test folder(s) that do not mirror the source tree", wrong)


def test_checker_finds_each_kind_of_violation(tmp_path):
    """The checker itself: a small tree with one violation of each rule, and legal code beside them."""
    files = {
        "progpo_base/__init__.py": "",
        "progpo_base/usage.py": "from webshop_server import shop  # the base reaches up\n",
        "progpo/__init__.py": "",
        "progpo/cli.py": "from progpo_base import usage\n",
        "webshop_server/__init__.py": "",
        "webshop_server/shop.py": "def page():\n    from agents.runner import run  # upward, in a function\n",
        "progpo_envs/__init__.py": "",
        "progpo_envs/a.py": "from progpo_envs import b\n_HIDDEN = 1\n",
        "progpo_envs/b.py": "def f():\n    from progpo_envs.a import _HIDDEN  # cycle + private name\n",
        "progpo_envs/_impl.py": "X = 1\n",
        "progpo_envs/ok.py": "from progpo_envs._impl import X  # a private module inside its package\n",
        "agents/__init__.py": "",
        "agents/runner.py": (
            "import progpo_envs.a as pa\n\n"
            "class Runner:\n    def _step(self):\n        return self._step\n\n"
            "def run(trainer):\n    trainer._update()\n    return pa._HIDDEN\n"
        ),
        "training/__init__.py": "",
        "training/trainer.py": "class Trainer:\n    def _update(self):\n        pass\n",
        "training/advantages/__init__.py": "from training import trainer  # the leaf reaches out\n",
        "benchmarks/__init__.py": "",
        "benchmarks/bench.py": (
            "from progpo_envs._impl import X\nfrom training.trainer import Trainer\nimport progpo.cli\n"
        ),
        "benchmarks/common.py": "",
        "benchmarks/other.py": "from benchmarks import bench, common  # a benchmark and the library\n",
        "benchmarks/report.py": "from benchmarks import bench, other  # the page reads every benchmark\n",
        "progpo_verl/__init__.py": "",
        "progpo_verl/rows.py": "def f():\n    from verl import DataProto  # verl outside its modules\n",
        "progpo_verl/upstream.py": "from verl.trainer.ppo import core_algos  # allowed here\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    modules, edges = analyse(tmp_path)
    cycles = find_cycles(edges)
    upward = upward_imports(edges, modules)
    private = private_uses(edges, modules)
    assert cycles == [["progpo_envs.a", "progpo_envs.b", "progpo_envs.a"]]
    assert len(upward) == 4
    assert "webshop_server/shop.py:2: webshop_server.shop imports agents.runner" in " ".join(upward)
    assert "progpo_base/usage.py:1: progpo_base.usage imports webshop_server.shop" in " ".join(upward)
    assert "benchmarks/bench.py:3: benchmarks.bench imports progpo.cli" in " ".join(upward)
    assert any("leaf training.advantages" in line for line in upward)
    assert restricted_imports(modules) == ["progpo_verl/rows.py:2: progpo_verl.rows imports verl"]
    assert benchmark_imports(edges, modules) == [
        "benchmarks/other.py:1: benchmarks.other imports the benchmark benchmarks.bench"
    ]
    assert sorted(line.split(": ", 1)[0] for line in private) == [
        "agents/runner.py:8",
        "agents/runner.py:9",
        "benchmarks/bench.py:1",
        "progpo_envs/b.py:2",
    ]

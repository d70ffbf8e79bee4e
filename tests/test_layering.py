"""The layering of ``serving_bench`` (docs/ARCHITECTURE.md), checked on the import graph: every module is parsed with
``ast``, nothing is imported or run.

* a unit (a top-level module or package of ``serving_bench``) imports only the units :data:`ALLOWED` lists for it
  (an entry ``"pkg.mod"`` allows that one module of a package); the rules between units have no cycle (an entry
  ``"pkg.mod"`` counts as a dependency on the unit ``pkg``), nor do the imports between units, and the modules' own
  imports have none either (``import x as _x``, a registration for its side effect, aside);
* project modules are imported at the top of a module: inside a function only where :data:`LAZY_PROJECT` says why;
  third-party modules inside a function only when heavy or optional (:data:`LAZY_THIRD_PARTY`), with a comment on
  the line saying so;
* every name a module-level import of a project module binds is used in that module (or listed in ``__all__``;
  ``import x as _x`` marks an import for its side effect), and no module defines ``__getattr__`` (no hidden
  re-exports).
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "serving_bench"

FOUNDATIONS = {"errors", "files", "units", "interrupts"}
# unit -> the units it may import (besides itself). Read bottom-up: the spine, then the stages around it.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "units": set(),
    "files": {"errors"},
    "interrupts": set(),
    "run": {"errors", "files"},
    "models": {"errors"},
    "export": {"errors", "files", "models"},
    "serving_config": {"errors", "export"},
    "telemetry": {"errors", "files"},
    "serve": {"errors", "files", "interrupts", "export", "serving_config"},
    "peers": {"errors", "files", "telemetry"},  # a result's machine facts: the hypervisor's steal
    "load": FOUNDATIONS | {"run", "export", "serving_config", "serve", "telemetry"},
    # what a profile is: its schema, entries, sharing laws, distributions, importers; nothing that measures or simulates
    "profiles": FOUNDATIONS,
    # the simulator knows the spine, what a profile's figures mean and the serving knobs; never a real server or the
    # driver, nor how a profile is measured
    "sim": FOUNDATIONS | {"run", "export", "serving_config", "profiles.schema", "profiles.entries", "profiles.law",
                          "profiles.distributions", "load.profile"},
    # measuring a profile on Triton; the devices' sharing law is fitted through the simulator (sim.interference)
    "calibrate": FOUNDATIONS | {"run", "export", "serving_config", "serve", "load", "telemetry", "profiles", "sim"},
    "validate": FOUNDATIONS | {"run", "load", "serve", "profiles", "serving_config", "sim"},
    "report": FOUNDATIONS | {"run"},
    "tune": FOUNDATIONS | {"run", "export", "serving_config", "serve", "load", "profiles", "calibrate", "sim",
                           "validate", "report"},
    "demo": FOUNDATIONS | {"run", "export", "serving_config", "serve", "telemetry", "tune", "report"},
    "cli": {"errors", "interrupts"},  # subcommands by name from its COMMANDS table (importlib), not statically
}
# (importing module, imported module) pairs allowed inside functions, with the reason
LAZY_PROJECT = {
    **{("serving_bench.models", f"serving_bench.models.{m}"): "torch model definitions (heavy: torch)"
       for m in ("tiny", "resnet", "mobilenet", "bert")},
}
LAZY_THIRD_PARTY = {"torch", "tvm", "tensorrt", "onnx", "onnxruntime", "ray", "optuna", "pynvml", "nvidia",
                    "triton_python_backend_utils"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@lru_cache(maxsize=None)
def modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "serving_bench"


def _targets(node: ast.Import | ast.ImportFrom, importer: str) -> list[str]:
    """The project modules an import statement loads (``from pkg import mod`` names the submodule)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.startswith("serving_bench")]
    base = node.module or ""
    if node.level:  # relative import
        package = importer.split(".")[: len(importer.split(".")) - node.level + (importer in _packages())]
        base = ".".join(package + ([base] if base else []))
    if not base.startswith("serving_bench"):
        return []
    known = modules()
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


@lru_cache(maxsize=None)
def _packages() -> frozenset[str]:
    return frozenset(m for m, p in modules().items() if p.name == "__init__.py")


def imports(module: str) -> list[tuple[ast.AST, bool]]:
    """Every import statement of ``module`` with whether it is inside a function or class."""
    tree = ast.parse(modules()[module].read_text())
    out: list[tuple[ast.AST, bool]] = []

    def walk(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append((child, nested))
            walk(child, nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                                     ast.Lambda)))

    walk(tree, False)
    return out


def _allowed(importer: str, target: str) -> bool:
    src, dst = unit(importer), unit(target)
    if src == dst:
        return True
    rules = ALLOWED.get(src, set())
    rest = target.split(".")[1:]
    return dst in rules or ".".join(rest[:2]) in rules


def unit_graph(allowed: dict[str, set[str]]) -> dict[str, set[str]]:
    """The rules as a graph between units: an entry ``"pkg.mod"`` is an edge to the unit ``pkg``."""
    return {u: {d.split(".")[0] for d in deps} - {u} for u, deps in allowed.items()}


def imported_units() -> dict[str, set[str]]:
    """The units each unit's modules import, inside functions too (``cli``'s subcommands are named, not imported)."""
    graph: dict[str, set[str]] = {}
    for module in modules():
        for node, _nested in imports(module):
            graph.setdefault(unit(module), set()).update(unit(t) for t in _targets(node, module))
    return {u: deps - {u, "serving_bench"} for u, deps in graph.items()}


def _assert_acyclic(graph: dict[str, set[str]], what: str) -> None:
    state: dict[str, int] = {}

    def visit(u: str, path: list[str]) -> None:
        if state.get(u) == 1:
            raise AssertionError(f"cycle in {what}: {' -> '.join(path + [u])}")
        if state.get(u) == 2:
            return
        state[u] = 1
        for d in sorted(graph.get(u, ())):
            visit(d, path + [u])
        state[u] = 2

    for u in sorted(graph):
        visit(u, [])


def test_every_unit_has_a_rule_and_there_is_no_cycle():
    units = {unit(m) for m in modules()} - {"serving_bench"}
    assert units <= set(ALLOWED), f"no layering rule for {sorted(units - set(ALLOWED))}"
    _assert_acyclic(unit_graph(ALLOWED), "ALLOWED")
    _assert_acyclic(imported_units(), "the imports between units")
    graph: dict[str, set[str]] = {}
    for module in modules():
        for node, nested in imports(module):
            if nested or any((a.asname or "").startswith("_") for a in node.names):
                continue
            graph.setdefault(module, set()).update(t for t in _targets(node, module) if t != module)
    _assert_acyclic(graph, "the module-level imports")


def test_the_cycle_check_fails_on_a_planted_cycle():
    """A cycle through a rule that allows one module (profiles -> sim.device, sim -> profiles.schema) is a cycle
    between the units, as is one planted in a module graph; an acyclic graph passes."""
    planted = {**ALLOWED, "profiles": ALLOWED["profiles"] | {"sim.device"}}
    with pytest.raises(AssertionError, match=r"^cycle in planted: .*\bprofiles -> sim -> profiles$"):
        _assert_acyclic(unit_graph(planted), "planted")
    modules_graph = {"serving_bench.a": {"serving_bench.b.x"}, "serving_bench.b.x": {"serving_bench.c"},
                     "serving_bench.c": {"serving_bench.a"}}
    with pytest.raises(AssertionError, match=r"cycle in modules: serving_bench\.a -> serving_bench\.b\.x -> "
                                             r"serving_bench\.c -> serving_bench\.a"):
        _assert_acyclic(modules_graph, "modules")
    _assert_acyclic({**modules_graph, "serving_bench.c": set()}, "modules")
    _assert_acyclic(unit_graph(ALLOWED), "ALLOWED")


def test_imports_follow_the_layering():
    wrong = []
    for module in modules():
        for node, _nested in imports(module):
            for target in _targets(node, module):
                if target != "serving_bench" and not _allowed(module, target):
                    wrong.append(f"{modules()[module].relative_to(PACKAGE.parent)}:{node.lineno}: {module} imports "
                                 f"{target}")
    assert not wrong, "imports against the layering (docs/ARCHITECTURE.md):\n" + "\n".join(wrong)


def test_imports_are_at_module_level_unless_heavy_or_optional():
    wrong = []
    for module, path in modules().items():
        lines = path.read_text().splitlines()
        for node, nested in imports(module):
            if not nested:
                continue
            where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            project = _targets(node, module)
            if project:
                wrong += [f"{where}: {t} inside a function" for t in project if (module, t) not in LAZY_PROJECT]
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names:
                if name.split(".")[0] not in LAZY_THIRD_PARTY:
                    wrong.append(f"{where}: {name} inside a function (import it at the top)")
                elif "#" not in lines[node.lineno - 1]:
                    wrong.append(f"{where}: {name} inside a function without a comment saying why (heavy/optional)")
    assert not wrong, "\n".join(wrong)


def _used_names(tree: ast.Module) -> set[str]:
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    for node in ast.walk(tree):  # names used only in string annotations count as used
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            used.add(node.value)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            used |= {e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)}
    return used


def test_module_level_project_imports_are_used_and_nothing_is_re_exported_lazily():
    wrong = []
    for module, path in modules().items():
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body):
            wrong.append(f"{path.relative_to(PACKAGE.parent)}: module-level __getattr__ (import names directly)")
        annotations = " ".join(ast.unparse(n) for n in ast.walk(tree) if isinstance(n, (ast.arg, ast.AnnAssign))
                               and getattr(n, "annotation", None) is not None)
        used = _used_names(tree)
        for node, nested in imports(module):
            if nested or not _targets(node, module):
                continue
            for alias in node.names:
                name = (alias.asname or alias.name).split(".")[0]
                if name.startswith("_") or name in used or name in annotations:
                    continue
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {name} is imported but not used")
    assert not wrong, "\n".join(wrong)

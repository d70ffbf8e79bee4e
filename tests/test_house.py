"""The house limits on ``serving_bench/`` (docs/ARCHITECTURE.md, "Conventions"), checked on the source with ``ast``:
no module over :data:`MODULE_LINES` lines, no function over :data:`FUNCTION_LINES` lines, none taking more than
:data:`PARAMETERS` parameters (``self`` and ``cls`` not counted; ``*args`` and ``**kwargs`` count one each). Beyond
that, a frozen dataclass parameter object.

:data:`ALLOWED` names what is over a limit today with the reason; every entry must still be over it (a stale entry
fails too, so the list only shrinks).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "serving_bench"

MODULE_LINES = 450
FUNCTION_LINES = 80
PARAMETERS = 8

# "path" (a module's lines) or "path::Qual.name lines|parameters" -> why it is over the limit for now
ALLOWED: dict[str, str] = {
}


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    named = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
    return len(named) + (a.vararg is not None) + (a.kwarg is not None)


def over_limits(root: Path) -> dict[str, str]:
    """Everything under ``root`` over a limit: key (as in :data:`ALLOWED`, paths relative to ``root``'s parent) ->
    what it measures."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        name = path.relative_to(root.parent).as_posix()
        lines = len(source.splitlines())
        if lines > MODULE_LINES:
            found[name] = f"{lines} lines > {MODULE_LINES}"

        def visit(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef):
                    visit(child, f"{prefix}{child.name}.")
                elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    qualname = f"{prefix}{child.name}"
                    length = child.end_lineno - child.lineno + 1
                    if length > FUNCTION_LINES:
                        found[f"{name}::{qualname} lines"] = f"{length} lines > {FUNCTION_LINES}"
                    count = _parameters(child)
                    if count > PARAMETERS:
                        found[f"{name}::{qualname} parameters"] = f"{count} parameters > {PARAMETERS}"
                    visit(child, f"{qualname}.")
                else:
                    visit(child, prefix)

        visit(ast.parse(source), "")
    return found


def test_serving_bench_keeps_the_house_limits():
    found = over_limits(PACKAGE)
    new = {k: v for k, v in found.items() if k not in ALLOWED}
    assert not new, ("over the house limits (a frozen dataclass parameter object beyond 8 parameters; split long "
                     "functions and modules by concern):\n" + "\n".join(f"{k}: {v}" for k, v in sorted(new.items())))
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, "within the limits now: remove from ALLOWED in tests/test_house.py:\n" + "\n".join(stale)


def test_the_limits_check_finds_a_planted_breach(tmp_path):
    """A module of 451 lines, a method taking 9 parameters besides ``self`` and a function of 81 lines are found,
    each once; at the limits exactly, nothing is."""
    package = tmp_path / "pkg"
    package.mkdir()

    def module(parameters: str, body_lines: int) -> str:
        body = "\n".join(f"    x{i} = {i}" for i in range(body_lines))
        return f"class A:\n    class B:\n        def wide(self, {parameters}):\n            pass\n\n\ndef long():\n{body}\n"

    fine = module("a, b, c, d, e, f, g, *h", FUNCTION_LINES - 1)
    (package / "m.py").write_text(fine + "\n" * (MODULE_LINES - len(fine.splitlines())))
    assert over_limits(package) == {}
    breach = module("a, b, c, d, e, f, g, h, *i", FUNCTION_LINES)
    (package / "m.py").write_text(breach + "\n" * (MODULE_LINES + 1 - len(breach.splitlines())))
    assert over_limits(package) == {"pkg/m.py": f"{MODULE_LINES + 1} lines > {MODULE_LINES}",
                                    "pkg/m.py::A.B.wide parameters": f"9 parameters > {PARAMETERS}",
                                    "pkg/m.py::long lines": f"{FUNCTION_LINES + 1} lines > {FUNCTION_LINES}"}

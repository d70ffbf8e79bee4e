"""The simulator's compiled engine: which modules are compiled, the check that the compiled ones are what runs, and
the switch that runs the pure Python source instead.

The engine modules are those of this package with a ``.pxd`` beside them (``heap``, ``device``, ``serial``,
``state``, ``machine``, ``batcher``, ``core``, ``fast``, ``workload``). Installing the package (``setup.py``, run by ``make venv`` / ``pip
install -e .``) compiles them with Cython in pure Python mode: the ``.py`` file is the one definition of the
semantics, the ``.pxd`` only adds C types, and the compiled module gives records identical to the source's
(``tests/test_sim_compiled.py``). A compile error fails the install.

At import (:func:`use`): with ``SERVING_BENCH_SIM_PURE=1`` the engine modules are loaded from their ``.py`` files —
the reference for the compiled ones, for debugging, or where nothing can be built (10-50 times slower). Otherwise
each must be compiled from the very source beside it (the build records a digest of each module's ``.py`` and ``.pxd``
in ``_built.json``), else :class:`ImportError` says how to build it: a missing or stale build is never run silently.

Only the standard library is imported here: ``setup.py`` loads this file by path in its build environment.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path

PURE_ENV = "SERVING_BENCH_SIM_PURE"
PACKAGE = "serving_bench.sim"
HERE = Path(__file__).resolve().parent
DIGESTS = "_built.json"  # written beside the compiled modules by setup.py's build_ext
BUILD = "make venv (pip install -e .)"
REBUILD = "make build (python setup.py build_ext --inplace)"


def modules(directory: Path = HERE) -> list[str]:
    """Names of the compiled engine modules (each has a ``.pxd`` beside its ``.py``), sorted."""
    return sorted(p.stem for p in directory.glob("*.pxd") if p.with_suffix(".py").exists())


def digest(directory: Path, name: str) -> str:
    """SHA-256 of module ``name``'s ``.py`` and ``.pxd`` (what a build of it was compiled from)."""
    h = hashlib.sha256()
    for suffix in (".py", ".pxd"):
        h.update((directory / (name + suffix)).read_bytes())
    return h.hexdigest()


def pure() -> bool:
    """Is the pure Python source asked for (``SERVING_BENCH_SIM_PURE`` set to anything but '' or '0')?"""
    return os.environ.get(PURE_ENV, "") not in ("", "0")


def extension(name: str, directory: Path = HERE) -> Path | None:
    """The compiled module ``name`` beside its source (what ``import`` loads before the ``.py``), or None."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = directory / (name + suffix)
        if path.exists():
            return path
    return None


class _Source(importlib.abc.MetaPathFinder):
    """Finds the engine modules' ``.py`` files ahead of their compiled builds."""

    def __init__(self, names: list[str]):
        self.names = {f"{PACKAGE}.{name}": name for name in names}

    def find_spec(self, fullname, path=None, target=None):
        name = self.names.get(fullname)
        if name is None:
            return None
        return importlib.util.spec_from_file_location(fullname, HERE / f"{name}.py")


def check(directory: Path = HERE) -> None:
    """Raise :class:`ImportError` unless every engine module in ``directory`` is compiled from the source beside it."""
    built_path = directory / DIGESTS
    built = json.loads(built_path.read_text()) if built_path.exists() else {}
    for name in modules(directory):
        if extension(name, directory) is None:
            raise ImportError(f"{PACKAGE}.{name} is not compiled: build it with {BUILD}, or set {PURE_ENV}=1 to "
                              "run the pure Python source")
        if built.get(name) != digest(directory, name):
            raise ImportError(f"{PACKAGE}.{name} was compiled from other source than the {name}.py and {name}.pxd "
                              f"beside it: rebuild it with {REBUILD}, or set {PURE_ENV}=1 to run the source")


def use() -> str:
    """Make the engine modules import as compiled (checked current) or, with ``SERVING_BENCH_SIM_PURE``, as source;
    returns ``"compiled"`` or ``"pure"``. Call before any engine module is imported (``serving_bench.sim`` does)."""
    if pure():
        if not any(isinstance(finder, _Source) for finder in sys.meta_path):
            sys.meta_path.insert(0, _Source(modules()))
        return "pure"
    check()
    return "compiled"

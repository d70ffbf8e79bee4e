"""serving-bench's build: metadata and dependencies are in setup.cfg; this file adds the compiled simulator engine.

The engine modules (``serving_bench/sim/*.py`` with a ``.pxd`` beside them) are compiled by Cython in pure Python
mode; see ``serving_bench/sim/compiled.py``. A compile error fails the install: there is no silent fallback to the
pure Python engine. After each build the digest of every compiled module's source is written beside the modules, so
that an import can tell a stale build from a current one. ``make build`` (``python setup.py build_ext --inplace``)
rebuilds in place after the engine's source changed.
"""

import importlib.util
import json
from pathlib import Path

from Cython.Build import cythonize
from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
SIM = ROOT / "serving_bench" / "sim"


def _compiled_module():
    """serving_bench/sim/compiled.py, loaded by path (the package's dependencies are not in the build environment)."""
    spec = importlib.util.spec_from_file_location("_serving_bench_sim_compiled", SIM / "compiled.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


COMPILED = _compiled_module()
NAMES = COMPILED.modules(SIM)

# Bit-identical floats to CPython's: IEEE double operations in source order, no fused multiply-add contraction.
CFLAGS = ["-ffp-contract=off", "-fno-fast-math"]
DIRECTIVES = {
    "language_level": 3,
    "annotation_typing": False,  # the .pxd files are the one source of C types; annotations stay documentation
}


class BuildExt(build_ext):
    """build_ext that records, beside the built modules, the digest of the source each was compiled from."""

    def run(self):
        super().run()
        out_dir = Path(self.get_ext_fullpath(f"{COMPILED.PACKAGE}.{NAMES[0]}")).parent
        digests = {name: COMPILED.digest(SIM, name) for name in NAMES}
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / COMPILED.DIGESTS).write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")


extensions = cythonize([str(SIM.relative_to(ROOT) / f"{name}.py") for name in NAMES], compiler_directives=DIRECTIVES,
                       quiet=True)
for ext in extensions:
    ext.extra_compile_args = CFLAGS
setup(ext_modules=extensions, cmdclass={"build_ext": BuildExt})

"""Where the bundled ``tritonserver`` is and how to launch it with this Python (see :mod:`serving_bench.serve.server`).

What the bundled server needs (DESIGN.md): a backend directory whose ``python`` folder holds the python backend *and*
the ``triton_python_backend_stub`` built for the running Python (assembled once in the cache folder), the pytriton
libraries and the running interpreter's ``libpython`` on ``LD_LIBRARY_PATH``, and this environment's ``bin`` first on
``PATH`` so runners import the same torch / onnxruntime / tvm.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from serving_bench.errors import ServerError
from serving_bench.files import cache_dir, publish_folder


@dataclass(frozen=True)
class TritonInstall:
    """Paths and environment to run the bundled tritonserver with this Python."""

    server_bin: Path
    backend_dir: Path
    env: Mapping[str, str]


def find_tritonserver() -> TritonInstall:
    """Locate pytriton's tritonserver and assemble a backend folder with the stub for the running Python."""
    spec = importlib.util.find_spec("pytriton")  # its folder only: importing pytriton pulls in zmq, gevent, ...
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - install problem
        raise ServerError("nvidia-pytriton is not installed: run `make test` or `pip install nvidia-pytriton==0.7.0`")
    root = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    server_bin = root / "bin" / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not server_bin.is_file() or not stub.is_file():
        raise ServerError(f"tritonserver or its python {version} stub is missing under {root}")

    backend_dir = cache_dir() / "backends" / f"py{version}-{hashlib.sha256(str(root).encode()).hexdigest()[:10]}"
    python_dir = backend_dir / "python"
    if not (python_dir / "triton_python_backend_stub").is_file():
        tmp = Path(tempfile.mkdtemp(dir=mkdir(backend_dir.parent), prefix=".backend-"))
        (tmp / "python").mkdir()
        for item in (root / "backends" / "python").iterdir():
            if item.is_file():
                shutil.copy2(item, tmp / "python" / item.name)
        shutil.copy2(stub, tmp / "python" / "triton_python_backend_stub")
        publish_folder(tmp, backend_dir, replace=False)  # another process may have assembled it first

    site = root.parent.parent
    lib_dirs = [str(site / "nvidia_pytriton.libs"), sysconfig.get_config_var("LIBDIR") or ""]
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join([d for d in lib_dirs if d] + [env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    _check_libraries(python_dir / "triton_python_backend_stub", env)
    return TritonInstall(server_bin, backend_dir, env)


_CHECKED_LIBRARIES: set[str] = set()


def _check_libraries(binary: Path, env: Mapping[str, str]) -> None:
    """Fail before launch, naming the libraries, if the stub cannot be loaded (typically a Python built without
    ``libpython3.X.so``, which the stub links): otherwise every model fails to load with a less direct message."""
    ldd = shutil.which("ldd")
    if ldd is None or str(binary) in _CHECKED_LIBRARIES:
        return
    out = subprocess.run([ldd, str(binary)], env=dict(env), capture_output=True, text=True, timeout=30).stdout
    missing = sorted({line.split("=>")[0].strip() for line in out.splitlines() if "not found" in line})
    if missing:
        raise ServerError(f"the python backend stub for Python {sys.version_info.major}.{sys.version_info.minor} "
                          f"cannot load {', '.join(missing)} ({binary}); install the shared library of this Python "
                          f"(e.g. Debian/Ubuntu libpython{sys.version_info.major}.{sys.version_info.minor}) or use a "
                          f"Python built with --enable-shared")
    _CHECKED_LIBRARIES.add(str(binary))


def mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def die_with_parent_prefix() -> list[str]:
    """``setpriv --pdeathsig KILL --`` in front of the server command, so Linux kills the server when this process
    dies without cleaning up (SIGKILL, ``timeout``'s SIGTERM); its stubs then exit on their own. (``setpriv`` from
    util-linux, rather than a ``preexec_fn``, which is unsafe in a process with threads.) Linux ties the signal to the
    *thread* that started the child, so it is used only from the main thread: a worker thread that ends would
    otherwise take the server with it. Empty where ``setpriv`` is missing."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or threading.current_thread() is not threading.main_thread():
        return []
    return [setpriv, "--pdeathsig", "KILL", "--"]

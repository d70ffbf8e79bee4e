"""Files: reading the user's YAML and JSON (every failure one :class:`InputError` line: file, line, reason), writing
outputs atomically, and the cache folder.

One place for each, so a load profile, a forecast, a serving config and a profile all report a missing file or a
syntax error the same way, and no reader ever sees half a file: every output goes to a temporary name in the same
folder and is renamed (:func:`atomic_write`, :func:`atomic_write_text`, :func:`atomic_write_json`; folders:
:func:`publish_folder`). Validation of the content stays with each format's owner.
"""

from __future__ import annotations

import contextlib
import json
import lzma
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import yaml

from serving_bench.errors import InputError


def cache_dir() -> Path:
    """Where serving-bench keeps derived files (backend folder, tuning records): ``$SERVING_BENCH_CACHE`` or
    ``~/.cache/serving-bench``."""
    return Path(os.environ.get("SERVING_BENCH_CACHE", Path.home() / ".cache" / "serving-bench"))


def atomic_write(path: str | Path, write: Callable[[Path], Any]) -> Path:
    """Call ``write(tmp)`` for a fresh temporary path beside ``path`` (same suffix, so writers that look at it keep
    working), then rename it to ``path``; on failure the temporary file is removed and ``path`` is untouched. The
    folder is created. Returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp{path.suffix}")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; a path ending ``.xz`` is written xz-compressed (a large saved
    measurement: :func:`read_text` reads it back)."""
    if Path(path).suffix == ".xz":
        return atomic_write(path, lambda tmp: tmp.write_bytes(lzma.compress(text.encode("utf-8"), preset=9)))
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def atomic_write_json(path: str | Path, data: Any, *, indent: int = 2, sort_keys: bool = True,
                      default: Callable[[Any], Any] | None = str) -> Path:
    """Write ``data`` as JSON (one trailing newline) to ``path`` atomically."""
    return atomic_write_text(path, json.dumps(data, indent=indent, sort_keys=sort_keys, default=default) + "\n")


def publish_folder(staging: str | Path, dest: str | Path, *, replace: bool) -> bool:
    """Move the finished folder ``staging`` to ``dest`` by renames (``staging`` must be on the same file system,
    e.g. made with ``tempfile.mkdtemp(dir=dest.parent)``). An existing ``dest`` is replaced when ``replace``, else
    kept (another process finished first: ``staging`` is removed). True when ``staging`` became ``dest``."""
    staging, dest = Path(staging), Path(dest)
    if dest.exists():
        if not replace:
            shutil.rmtree(staging, ignore_errors=True)
            return False
        trash = Path(tempfile.mkdtemp(dir=staging.parent, prefix=f".{dest.name}-old-"))
        os.replace(dest, trash / dest.name)
        os.replace(staging, dest)
        shutil.rmtree(trash, ignore_errors=True)
        return True
    try:
        os.replace(staging, dest)
    except OSError:  # another process published it between the check and the rename
        shutil.rmtree(staging, ignore_errors=True)
        if replace:
            raise
        return False
    return True


def read_text(path: str | Path, what: str = "file") -> str:
    """The file's text (a path ending ``.xz``: decompressed); a missing or unreadable file is ``<path>: cannot read
    the <what>: <reason>``."""
    try:
        if Path(path).suffix == ".xz":
            return lzma.decompress(Path(path).read_bytes()).decode("utf-8")
        return Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise InputError(path, None, f"cannot read the {what}: {err.strerror or err}") from None
    except (lzma.LZMAError, UnicodeDecodeError) as err:
        raise InputError(path, None, f"cannot read the {what}: not xz-compressed UTF-8 text ({err})") from None


def read_yaml(path: str | Path, what: str = "file") -> Any:
    """Parse a YAML file (safe loader: plain data only); syntax errors name the line."""
    text = read_text(path, what)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else None
        raise InputError(path, where, f"not valid YAML: {getattr(err, 'problem', None) or err}") from None


def read_json(path: str | Path, what: str = "file") -> Any:
    """Parse a JSON file; syntax errors name the line."""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(path, f"line {err.lineno}", f"not JSON: {err.msg}") from None

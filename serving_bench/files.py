"""Files: reading the user's YAML and JSON (every failure one :class:`InputError` line: file, line, reason), writing
outputs atomically, the output folders of runs, and the cache folder.

One place for each, so a load profile, a forecast, a serving config and a profile all report a missing file or a
syntax error the same way, and no reader ever sees half a file: every output goes to a temporary name in the same
folder and is renamed (:func:`atomic_write`, :func:`atomic_write_text`, :func:`atomic_write_json`; folders:
:func:`publish_folder`). Validation of the content stays with each format's owner. A run's output folder is
checked and held before the run (:func:`hold_folder`), written through a staging folder inside it
(:func:`stage_folder`), and what a failed write would lose is saved elsewhere, named in an :class:`OutputError`
(:func:`rescue_folder`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import lzma
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

import yaml

from serving_bench.errors import InputError, OutputError

T = TypeVar("T")
LOCK_SUFFIX = ".serving-bench-lock"  # beside the held folder: .<name>.serving-bench-lock
STAGING_PREFIX = ".staging-"  # inside it: .staging-<pid>/


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


# -- output folders of runs -------------------------------------------------------------------------------------------

def size_text(n_bytes: float) -> str:
    """``n_bytes`` for a person: ``1.5 GB``, ``320 MB``, ``12 kB`` (powers of 1000)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.3g} {unit}"
    return f"{int(n_bytes)} bytes"


@dataclass
class HeldFolder:
    """An output folder this process holds for a run (:func:`hold_folder`). ``release()`` (or leaving the ``with``
    block) frees it and removes the folders the hold created that stayed empty, so a run refused after the hold
    leaves nothing behind."""

    path: Path
    lock: Path
    fd: int
    created: tuple[Path, ...] = ()

    def __enter__(self) -> "HeldFolder":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        if self.fd < 0:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.lock)  # while still locked: a waiting opener then sees another inode and retries
        os.close(self.fd)
        self.fd = -1
        _remove_empty(self.created)


def hold_folder(path: str | Path, *, need_bytes: int = 0, basis: str = "", option: str = "--out",
                empty: bool = False) -> HeldFolder:
    """Check the output folder ``path`` and hold it for this run, before the run does any work.

    Refused, each as one :class:`InputError` line naming ``option``: a file in its place; a folder with entries
    when ``empty`` (``replay`` without ``--overwrite``); a file system with less free space than ``need_bytes`` (the
    run's expected output; ``basis`` says how it was estimated); a folder that cannot be created or written; a
    folder another live run holds. The hold is an exclusive ``flock`` on ``.<name>.serving-bench-lock`` beside the
    folder, which names the holder (pid, command, start); the kernel frees it when the holder exits, however it
    ends, so a lock left by a killed run is never mistaken for a live one. Stale staging folders inside (a run
    killed while writing) are removed."""
    shown = Path(path)
    real = Path(os.path.abspath(shown))
    expected = "a results folder (new, empty, or --overwrite)" if empty else "a results folder"
    if real.exists() and not real.is_dir():
        raise InputError(option, None, f"{shown} is a file; expected {expected}")
    if empty and real.is_dir() and any(p.name != f"{STAGING_PREFIX}{os.getpid()}" for p in real.iterdir()):
        raise InputError(option, None, f"{shown} exists and is not empty; choose another folder or pass --overwrite")
    existing = next(p for p in (real, *real.parents) if p.exists())
    if not existing.is_dir():
        raise InputError(option, None, f"{existing} is a file; expected {expected} at {shown}")
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        raise InputError(option, None, f"{shown}: cannot write there: {os.strerror(errno.EROFS)}")
    free = shutil.disk_usage(existing).free
    if need_bytes > free:
        raise InputError(option, None, f"{shown}: {size_text(free)} free on its file system, the run needs about "
                                       f"{size_text(need_bytes)} ({basis}); free some space or choose another folder")
    created = _make_folders(real, shown, option)
    try:
        fd = _take_lock(real.parent / f".{real.name}{LOCK_SUFFIX}", shown, option)
    except BaseException:
        _remove_empty(created)
        raise
    held = _probed(HeldFolder(real, real.parent / f".{real.name}{LOCK_SUFFIX}", fd, tuple(created)), real, shown,
                   option)
    for stale in real.glob(f"{STAGING_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)
    return held


def hold_file(path: str | Path, *, option: str = "--out") -> HeldFolder:
    """Check the output file ``path`` (written later, atomically) and hold it for this run, before the run does any
    work: refused, as one :class:`InputError` line naming ``option``, when a folder is in its place, its folder
    cannot be created or written, or another live run holds it. The hold is :func:`hold_folder`'s lock, beside the
    file; releasing it removes the folders it created that stayed empty."""
    shown = Path(path)
    real = Path(os.path.abspath(shown))
    if real.is_dir():
        raise InputError(option, None, f"{shown} is a folder; expected a file to write")
    existing = next(p for p in real.parents if p.exists())
    if not existing.is_dir():
        raise InputError(option, None, f"{existing} is a file; expected a folder to hold {shown}")
    created = _make_folders(real.parent, shown, option)
    lock = real.parent / f".{real.name}{LOCK_SUFFIX}"
    try:
        fd = _take_lock(lock, shown, option)
    except BaseException:
        _remove_empty(created)
        raise
    return _probed(HeldFolder(real, lock, fd, tuple(created)), real.parent, shown, option)


def _probed(held: HeldFolder, folder: Path, shown: Path, option: str) -> HeldFolder:
    """``held``, once a file could be created in ``folder``; else released, and an :class:`InputError`."""
    try:
        probe, name = tempfile.mkstemp(dir=folder, prefix=".serving-bench-probe-")
        os.close(probe)
        os.unlink(name)
    except OSError as err:
        held.release()
        raise InputError(option, None, f"{shown}: cannot write there: {err.strerror or err}") from None
    return held


def _make_folders(real: Path, shown: Path, option: str) -> list[Path]:
    """Create ``real`` and its missing parents; the ones created, outermost first."""
    created: list[Path] = []
    for folder in reversed([p for p in (real, *real.parents) if not p.exists()]):
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        except OSError as err:
            _remove_empty(created)
            raise InputError(option, None, f"{shown}: cannot create {folder}: {err.strerror or err}") from None
        created.append(folder)
    return created


def _remove_empty(folders) -> None:
    """Remove ``folders`` (outermost first) that are empty, deepest first: what a refused run created."""
    for folder in reversed(tuple(folders)):
        with contextlib.suppress(OSError):
            folder.rmdir()


def _take_lock(lock: Path, shown: Path, option: str) -> int:
    """An open descriptor holding an exclusive ``flock`` on ``lock`` (created), with this process's facts in it."""
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise InputError(option, None, f"{shown}: cannot write there: {err.strerror or err}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode(errors="replace")
            os.close(fd)
            raise InputError(option, None, f"{shown} is in use by another run ({_holder_text(holder)}); wait for it "
                                           "to end or choose another folder") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:  # its last holder removed it after we opened it: take the new one
            same = False
        if same:
            break
        os.close(fd)
    facts = {"pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(sys.argv)[:300]}
    try:
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(facts).encode())
    except OSError as err:  # a full disk
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)
        raise InputError(option, None, f"{shown}: cannot write there: {err.strerror or err}") from None
    return fd


def _holder_text(text: str) -> str:
    try:
        facts = json.loads(text)
        return f"pid {facts['pid']} since {facts['since']}: {facts['command']}"
    except (ValueError, KeyError, TypeError):
        return "starting"


def stage_folder(dest: str | Path, write: Callable[[Path], T], *, clear: bool = False) -> T:
    """Write a folder's files through ``dest/.staging-<pid>/`` and move them into ``dest`` (created, with its
    parents) only once ``write(staging)`` has finished: a failure leaves ``dest`` as it was and raises. ``clear``:
    ``dest``'s other entries are removed first (``--overwrite``). Returns what ``write`` returned."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    staging = dest / f"{STAGING_PREFIX}{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        result = write(staging)
        if clear:
            for entry in dest.iterdir():
                if entry != staging:
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        for entry in staging.iterdir():
            target = dest / entry.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(entry, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return result


def rescue_folder(dest: str | Path, err: OSError, write: Callable[[Path], Any], note: str = "") -> OutputError:
    """After writing into ``dest`` failed with ``err``, write the same (``write(folder)``) into a new folder under
    the cache folder (``rescued/``), or under the system's temporary folder where that fails too. Returns the
    :class:`OutputError` to raise: ``dest``, the reason, and where it went (``note`` after it, e.g. "marked
    partial"), or that it could be saved nowhere."""
    reason = err.strerror or str(err)
    name = f"{Path(os.path.abspath(dest)).name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    failed = []
    for base in (cache_dir() / "rescued", Path(tempfile.gettempdir()) / "serving-bench-rescued"):
        folder = base / name
        try:
            folder.mkdir(parents=True)
            write(folder)
        except OSError as again:
            shutil.rmtree(folder, ignore_errors=True)
            failed.append(f"{base}: {again.strerror or again}")
            continue
        return OutputError(f"{dest}: the results could not be written ({reason}); what was measured is saved in "
                           f"{folder}{', ' + note if note else ''}")
    return OutputError(f"{dest}: the results could not be written ({reason}), nor saved elsewhere "
                       f"({'; '.join(failed)})")

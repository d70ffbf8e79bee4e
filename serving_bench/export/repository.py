"""The Triton model repository on disk: safe entry names, config.pbtxt I/O, atomic entry writes, the manifest.

Every command that touches a repository goes through here, so the rules live in one place:
- an entry name is a plain directory name (no path separators, no ``..``), so it cannot escape the repository;
- ``config.pbtxt`` is a ``ModelConfig`` protobuf in text format (``tritonclient``'s ``model_config_pb2``); parse errors
  become one-line :class:`InputError` naming file, line and field;
- an entry is written into a staging folder beside the repository and renamed into place, so a failed export leaves no
  half-written model directory;
- ``manifest.json`` records what each export produced (artifact hash, parity error, skipped-with-reason).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from serving_bench.errors import InputError
from serving_bench.files import atomic_write_text, publish_folder, read_json

ModelConfig = mc.ModelConfig
CONFIG_NAME = "config.pbtxt"
MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")

# numpy dtype name <-> Triton config data type, for the types the zoo uses.
NUMPY_TO_TRITON = {
    "float32": mc.TYPE_FP32, "float16": mc.TYPE_FP16, "float64": mc.TYPE_FP64,
    "int64": mc.TYPE_INT64, "int32": mc.TYPE_INT32, "int8": mc.TYPE_INT8, "uint8": mc.TYPE_UINT8, "bool": mc.TYPE_BOOL,
}
TRITON_TO_NUMPY = {v: k for k, v in NUMPY_TO_TRITON.items()}


def check_entry_name(name: str, source: str | Path | None = None, field: str = "name") -> str:
    """Return ``name`` if it is a safe repository entry name, else raise :class:`InputError`."""
    if not isinstance(name, str) or not _SAFE_NAME.match(name) or name in (".", ".."):
        raise InputError(source, field, f"{name!r} is not a safe model name: expected letters, digits, '_', '-', '.',"
                                        " starting with a letter or digit, at most 128 characters")
    return name


def entry_dir(repo: str | Path, name: str) -> Path:
    """The folder of entry ``name`` inside ``repo``; refuses names that would resolve outside it."""
    check_entry_name(name)
    repo = Path(repo).resolve()
    path = (repo / name).resolve()
    if path.parent != repo:
        raise InputError(repo, "name", f"{name!r} resolves outside the repository")
    return path


def list_entries(repo: str | Path) -> list[str]:
    """Names of the entries (folders holding a config.pbtxt) in ``repo``, sorted."""
    repo = Path(repo)
    if not repo.is_dir():
        raise InputError(repo, None, "model repository folder does not exist")
    return sorted(p.name for p in repo.iterdir() if p.is_dir() and (p / CONFIG_NAME).is_file())


def parse_config(text: str, source: str | Path = CONFIG_NAME) -> ModelConfig:
    """Parse ``config.pbtxt`` text; a syntax error or unknown field becomes ``file: line N: field: reason``."""
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as err:
        line = getattr(err, "GetLine", lambda: None)()
        msg = str(err)
        # protobuf puts "line:col : " in front of its message; keep only the reason.
        reason = re.sub(r"^\d+:\d+\s*:\s*", "", msg)
        field_match = re.search(r'named "?(\w+)"?', reason) or re.search(r'field "?([\w.]+)"?', reason)
        field = field_match.group(1) if field_match else None
        where = f"line {line}" if line else None
        parts = ": ".join(p for p in (where, f"field {field}" if field else None) if p)
        raise InputError(source, parts or None, f"malformed config.pbtxt ({reason}); expected a Triton ModelConfig "
                                                f"in protobuf text format") from None
    return config


def read_config(path: str | Path) -> ModelConfig:
    """Read and parse a ``config.pbtxt`` file (see :func:`parse_config`)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(path, None, "config.pbtxt not found")
    return parse_config(path.read_text(), source=path)


def config_text(config: ModelConfig) -> str:
    """The canonical text form of a config (what :func:`write_config` writes)."""
    return text_format.MessageToString(config)


def write_config(config: ModelConfig, path: str | Path) -> None:
    """Write ``config`` as ``config.pbtxt`` text (atomically: a reader never sees half a file)."""
    atomic_write_text(Path(path), config_text(config))


@contextlib.contextmanager
def staged_entry(repo: str | Path, name: str, overwrite: bool = False) -> Iterator[Path]:
    """Yield an empty staging folder for entry ``name``; on success it replaces ``<repo>/<name>`` in one rename.

    The staging folder lives beside the repository (not inside it, where a polling Triton would see it). On any
    exception it is removed and the repository is untouched. Without ``overwrite`` an existing entry is an error,
    raised before anything is written.
    """
    final = entry_dir(repo, name)
    if final.exists() and not overwrite:
        raise InputError(final, None, "entry already exists; pass --overwrite to replace it")
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=final.parent.parent, prefix=f".{final.parent.name}-{name}-"))
    try:
        yield staging
        publish_folder(staging, final, replace=True)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_manifest(repo: str | Path) -> dict:
    """The repository manifest ``{"version": 1, "entries": {name: {...}}}``; empty when there is none yet."""
    path = Path(repo) / MANIFEST_NAME
    if not path.is_file():
        return {"version": MANIFEST_VERSION, "entries": {}}
    manifest = read_json(path, "manifest")
    if not isinstance(manifest, dict) or not isinstance(manifest.get("entries"), dict):
        raise InputError(path, "entries", "expected an object mapping entry names to records")
    return manifest


def update_manifest(repo: str | Path, records: dict[str, dict]) -> dict:
    """Merge ``records`` (entry name -> record) into the manifest and write it atomically; returns the manifest."""
    manifest = load_manifest(repo)
    manifest["version"] = MANIFEST_VERSION
    manifest["entries"].update(records)
    manifest["entries"] = dict(sorted(manifest["entries"].items()))
    atomic_write_text(Path(repo) / MANIFEST_NAME, json.dumps(manifest, indent=2, sort_keys=False) + "\n")
    return manifest


def ensemble_members(config: ModelConfig) -> list[str]:
    """Model names an ensemble's steps call, in step order (empty for a non-ensemble)."""
    return [step.model_name for step in config.ensemble_scheduling.step]


def ensemble_deps(config: ModelConfig) -> tuple[tuple[int, ...], ...]:
    """Per step of an ensemble (in step order), the steps it needs: step i needs step j when it reads a tensor j
    writes. Steps that need none start together when the request arrives."""
    steps = config.ensemble_scheduling.step
    writers = {tensor: j for j, step in enumerate(steps) for tensor in step.output_map.values()}
    return tuple(tuple(sorted({writers[t] for t in step.input_map.values() if t in writers} - {i}))
                 for i, step in enumerate(steps))


def resolve_models(repo: Path, models: Sequence[str] | None) -> list[str]:
    """The entries to serve: ``models`` (all entries when None) plus, transitively, every ensemble member."""
    available = list_entries(repo)
    wanted = list(models) if models else list(available)
    resolved: list[str] = []
    while wanted:
        name = wanted.pop(0)
        if name in resolved:
            continue
        if name not in available:
            raise InputError(repo, name, f"no such model in the repository; available: {', '.join(available) or 'none'}")
        resolved.append(name)
        wanted += ensemble_members(read_config(entry_dir(repo, name) / CONFIG_NAME))
    return resolved

"""Reading the user's YAML and JSON files, with every failure as one :class:`InputError` line (file, line, reason).

One place for it, so a load profile, a forecast, a serving config and a profile all report a missing file or a syntax
error the same way. Validation of the content stays with each format's owner.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from serving_bench.errors import InputError


def read_text(path: str | Path, what: str = "file") -> str:
    """The file's text; a missing or unreadable file is ``<path>: cannot read the <what>: <reason>``."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise InputError(path, None, f"cannot read the {what}: {err.strerror or err}") from None


def read_yaml(path: str | Path, what: str = "file") -> Any:
    """Parse a YAML file (safe loader: plain data only); syntax errors name the line."""
    import yaml

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

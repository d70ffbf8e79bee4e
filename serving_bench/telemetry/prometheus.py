"""Reading a Prometheus text endpoint (Triton's ``/metrics``) into plain tuples.

Only the parts of the text exposition format Triton emits are handled: ``# HELP``/``# TYPE`` comments (skipped) and
sample lines ``name{label="value",...} number [timestamp]``.
"""

from __future__ import annotations

import math
import re
import urllib.request
from typing import NamedTuple

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?\s*$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


class Sample(NamedTuple):
    """One sample line: metric ``name``, its ``labels`` and the ``value``."""

    name: str
    labels: dict[str, str]
    value: float


def parse_prometheus(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition; lines that are not samples are ignored."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        name, labels_text, value_text = match.groups()
        try:
            value = float(value_text)
        except ValueError:
            continue
        if math.isnan(value):
            continue
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(labels_text or "")}
        out.append(Sample(name, labels, value))
    return out


def metrics_http_url(metrics_url: str) -> str:
    """``host:port`` (as in :class:`~serving_bench.serve.server.Endpoints`) or a full URL -> the ``/metrics`` URL."""
    url = metrics_url.strip()
    if "://" not in url:
        url = f"http://{url}"
    if not url.rstrip("/").endswith("/metrics"):
        url = url.rstrip("/") + "/metrics"
    return url


def scrape(metrics_url: str, timeout_s: float = 2.0) -> list[Sample]:
    """Fetch and parse ``/metrics``; network errors propagate (``OSError`` family)."""
    with urllib.request.urlopen(metrics_http_url(metrics_url), timeout=timeout_s) as reply:
        return parse_prometheus(reply.read().decode("utf-8", errors="replace"))

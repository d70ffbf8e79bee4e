"""Reading a Prometheus text endpoint (Triton's ``/metrics``) into plain tuples, with ``prometheus_client``'s parser.

Every sample of the text exposition format (``name{label="value",...} number [timestamp]``) becomes a
:class:`Sample`; comments, NaN values and lines that are not samples are skipped (a malformed line costs only itself).
Samples keep the names Triton exposes: the ``# TYPE`` lines are dropped before parsing, because for a counter the
parser renames the samples to OpenMetrics' ``<name>_total`` (``nv_inference_exec_count`` would become
``nv_inference_exec_count_total``), and the types are not used here.
"""

from __future__ import annotations

import math
import urllib.request
from typing import Iterable, NamedTuple

from prometheus_client.parser import text_string_to_metric_families


class Sample(NamedTuple):
    """One sample line: metric ``name``, its ``labels`` and the ``value``."""

    name: str
    labels: dict[str, str]
    value: float


def _samples(text: str) -> Iterable[Sample]:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not math.isnan(s.value):
                yield Sample(s.name, dict(s.labels), float(s.value))


def parse_prometheus(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition; lines that are not samples are ignored."""
    text = "\n".join(line for line in text.splitlines() if not line.startswith("# TYPE")) + "\n"
    try:
        return list(_samples(text))
    except ValueError:  # a line the parser rejects: parse line by line and skip the bad ones
        out: list[Sample] = []
        for line in text.splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                try:
                    out += _samples(line + "\n")
                except ValueError:
                    continue
        return out


def metrics_http_url(metrics_url: str) -> str:
    """``host:port`` (as in :class:`~serving_bench.serve.endpoints.Endpoints`) or a full URL -> the ``/metrics`` URL."""
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

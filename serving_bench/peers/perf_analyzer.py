"""Triton's perf_analyzer 2.50 (the C++ binary from the ``tritonclient==2.50.0`` wheel), located, run and parsed.

Install with ``scripts/install_perf_analyzer.sh`` (it needs Debian's ``libb64-0d`` and ``libcudart.so.12`` from the
``nvidia-cuda-runtime-cu12`` wheel, put on ``LD_LIBRARY_PATH`` here; no GPU is needed). Newer wheels need glibc 2.38.

    pa = find_perf_analyzer()                       # PeerMissing with the install command if it cannot run
    m = pa.measure("sleep_zero", url, Level(concurrency=4), Windows(measurement_s=3))
    m.throughput_ips, m.p99_s, m.delayed_pct        # delayed_pct None: at most 1 % of requests > 1 ms late
    # Unstable (a RuntimeError) when it found no stable window within max_trials: a benchmark records the point
    # as unstable, with the message, and goes on

How perf_analyzer measures (why our figures can differ): latency from the *actual* send, not the intended time;
request-rate mode is synchronous (a few threads) unless ``async_mode`` (``-a``); a request picked up more than 1 ms
after its scheduled time counts as "delayed", and it prints the delayed share only when it exceeds 1 % (its source:
``delay_tolerance_`` 1 ms, ``DELAY_PCT_THRESHOLD`` 1.0). So "no warning" means at most 1 % of requests were more than
1 ms late — the same criterion as our lateness p99 <= 1 ms. In time-window mode each window lasts 1.2 x
``--measurement-interval`` (its source sleeps that long), a request counts in the window it *ends* in, and the
figures reported are the last three windows merged (counts over their summed duration): with ``--max-trials 3``
exactly the first three windows, :func:`span_s`. ``python -m serving_bench.peers.perf_analyzer --check`` prints
where the binary is and exits non-zero (with the reason) if it cannot run.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Mapping, Sequence


class PeerMissing(RuntimeError):
    """perf_analyzer is not installed or cannot run here; the message says why and how to install it."""


class Unstable(RuntimeError):
    """perf_analyzer found no stable measurement within ``--max-trials`` windows (its own criterion: the last three
    windows' throughput, and latency unless ``-a``, within ``-s`` percent); the message is perf_analyzer's. Not a
    broken peer: a point to record as unstable before going on to the next one."""


DELAY_TOLERANCE_S = 1e-3  # a request picked up later than this after its scheduled time is "delayed"
DELAY_PCT_THRESHOLD = 1.0  # ... and perf_analyzer warns (prints the share) when more than this percent were
WINDOW_FACTOR = 1.2  # a time window lasts 1.2 x --measurement-interval (inference_profiler.cc, Measure)
STABILITY_WINDOWS = 3  # the windows compared for stability and merged into the reported figures


def span_s(measurement_s: float) -> float:
    """Seconds the reported figures cover when perf_analyzer stops at the first stable chance (always, with
    ``max_trials=3``): three windows of 1.2 x ``measurement_s``."""
    return STABILITY_WINDOWS * WINDOW_FACTOR * measurement_s


STABLE_FAILURE = "Failed to obtain stable measurement"  # perf_analyzer's message (inference_profiler.cc)
INSTALL_HINT = "run scripts/install_perf_analyzer.sh (tritonclient==2.50.0 wheel + libb64-0d + nvidia-cuda-runtime-cu12)"


@dataclass(frozen=True)
class Measurement:
    """One perf_analyzer measurement (seconds; rates per second)."""

    mode: str                 # "concurrency" | "request_rate"
    level: float              # concurrency or requests per second
    throughput_ips: float
    p50_s: float
    p90_s: float
    p95_s: float
    p99_s: float
    avg_s: float | None
    delayed_pct: float | None  # percent of requests > 1 ms late; None: not printed, i.e. at most 1 %
    request_count: int | None = None  # requests that ended inside the reported windows (its console's "Request count")
    server_queue_s: float | None = None
    server_compute_infer_s: float | None = None
    raw: dict = field(default_factory=dict)
    command: tuple[str, ...] = ()


@dataclass(frozen=True)
class Level:
    """The load of one measurement: exactly one of ``concurrency`` (requests in flight) or ``request_rate``
    (requests per second, arriving by ``distribution``: ``poisson`` or ``constant``); ``async_mode`` (``-a``: without
    it the request-rate mode is synchronous, a few threads); ``batch`` rows per request; ``shapes`` the input shapes
    (name -> dims without the batch axis) of a model with variable dims."""

    concurrency: int | None = None
    request_rate: float | None = None
    async_mode: bool = True
    distribution: str = "poisson"
    batch: int = 1
    shapes: Mapping[str, Sequence[int]] = field(default_factory=dict)

    def __post_init__(self):
        if (self.concurrency is None) == (self.request_rate is None):
            raise ValueError("give exactly one of concurrency and request_rate")

    @property
    def mode(self) -> str:
        return "concurrency" if self.concurrency is not None else "request_rate"

    @property
    def value(self) -> float:
        return float(self.concurrency if self.concurrency is not None else self.request_rate)

    def args(self) -> list[str]:
        """perf_analyzer's arguments for the load (the batch size aside)."""
        args = []
        if self.concurrency is not None:
            args += ["--concurrency-range", str(int(self.concurrency))]
        else:
            args += ["--request-rate-range", f"{self.request_rate:g}", "--request-distribution", self.distribution]
        if self.async_mode:
            args.append("-a")
        for name, dims in self.shapes.items():
            args += ["--shape", f"{name}:{','.join(str(d) for d in dims)}"]
        return args


@dataclass(frozen=True)
class Windows:
    """How perf_analyzer measures: time windows of ``measurement_s`` seconds (each lasts 1.2 x that), stable when
    the last three windows agree within ``stability_pct`` percent, at most ``max_trials`` windows.
    ``stabilize_on_p99``: the stability check compares the windows' p99 (``--percentile 99``); False compares their
    average latency instead (its default; far less noisy over short windows). The percentiles are reported either
    way."""

    measurement_s: float = 5.0
    stability_pct: float = 10.0
    max_trials: int = 10
    stabilize_on_p99: bool = True

    def args(self) -> list[str]:
        """perf_analyzer's arguments for the windows and the stability rule (the percentile aside)."""
        return ["--measurement-mode", "time_windows", "--measurement-interval", str(int(self.measurement_s * 1000)),
                "-s", str(self.stability_pct), "--max-trials", str(self.max_trials)]

    def percentile_args(self) -> list[str]:
        return ["--percentile", "99"] if self.stabilize_on_p99 else []


@dataclass(frozen=True)
class PerfAnalyzer:
    binary: Path
    env: dict

    def version(self) -> str:
        out = subprocess.run([str(self.binary), "--version"], env=self.env, capture_output=True, text=True, timeout=30)
        text = (out.stdout + out.stderr).strip()
        if out.returncode != 0:
            raise PeerMissing(f"{self.binary} does not run: {text.splitlines()[-1] if text else out.returncode}; "
                              f"{INSTALL_HINT}")
        try:
            wheel = f"tritonclient {metadata.version('tritonclient')} wheel"
        except metadata.PackageNotFoundError:
            wheel = "no tritonclient wheel"
        return f"{text.splitlines()[0] if text else 'perf_analyzer'}; {wheel}"

    def measure(self, model: str, url: str, level: Level, windows: Windows = Windows(), *,
                extra: tuple[str, ...] = (), timeout_s: float = 300.0) -> Measurement:
        """Run one ``level`` against ``url`` (gRPC host:port) measured in ``windows`` and parse it; ``extra``:
        more perf_analyzer arguments; ``timeout_s``: how long the whole run may take."""
        with tempfile.TemporaryDirectory(prefix="serving-bench-pa-") as tmp:
            csv_path = Path(tmp) / "pa.csv"
            args = [str(self.binary), "-m", model, "-u", url, "-i", "grpc", "-b", str(level.batch),
                    *windows.args(), "-f", str(csv_path), *windows.percentile_args(), *level.args(), *extra]
            out = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=timeout_s)
            text = out.stdout + out.stderr
            if out.returncode != 0 or not csv_path.is_file():
                unstable = next((line.strip() for line in text.splitlines() if STABLE_FAILURE in line), None)
                if unstable:
                    raise Unstable(f"perf_analyzer at {level.mode} {level.value:g}: {unstable}")
                tail = " | ".join(line.strip() for line in text.splitlines()[-4:] if line.strip())
                raise RuntimeError(f"perf_analyzer failed (exit {out.returncode}): {tail}")
            rows = list(csv.DictReader(io.StringIO(csv_path.read_text())))
        return parse_measurement(rows[-1], text, level.mode, level.value, tuple(args))


def parse_measurement(row: dict, text: str, mode: str, level: float, command: tuple[str, ...] = ()) -> Measurement:
    """A :class:`Measurement` from one row of perf_analyzer's ``-f`` CSV (µs) and its console output."""
    def us(key):
        value = row.get(key)
        return float(value) / 1e6 if value not in (None, "") else None

    delayed = re.search(r"([0-9.]+)% of the requests were delayed", text)
    avg = re.search(r"Avg (?:gRPC|HTTP) time: (\d+) usec", text) or re.search(r"Avg latency: (\d+) usec", text)
    count = re.search(r"^\s*Request count: (\d+)", text, flags=re.M)  # the client's (the server's says "Successful")
    return Measurement(mode, level, float(row["Inferences/Second"]), us("p50 latency"), us("p90 latency"),
                       us("p95 latency"), us("p99 latency"), float(avg.group(1)) / 1e6 if avg else None,
                       float(delayed.group(1)) if delayed else None, int(count.group(1)) if count else None,
                       us("Server Queue"), us("Server Compute Infer"), dict(row), command)


def _cuda_runtime_dir() -> str | None:
    try:
        import nvidia.cuda_runtime as rt  # the nvidia-cuda-runtime-cu12 wheel
    except ImportError:
        return None
    for base in getattr(rt, "__path__", []):
        lib = Path(base) / "lib"
        if (lib / "libcudart.so.12").exists():
            return str(lib)
    return None


def find_perf_analyzer() -> PerfAnalyzer:
    """The installed perf_analyzer with the environment it needs; :class:`PeerMissing` (with the reason) if none
    runs here."""
    candidates = [Path(sys.executable).parent / "perf_analyzer"]
    found = shutil.which("perf_analyzer")
    if found:
        candidates.append(Path(found))
    binary = next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)
    if binary is None:
        raise PeerMissing(f"perf_analyzer not found next to {sys.executable} or on PATH; {INSTALL_HINT}")
    env = dict(os.environ)
    cudart = _cuda_runtime_dir()
    if cudart:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (cudart, env.get("LD_LIBRARY_PATH", "")) if p)
    pa = PerfAnalyzer(binary, env)
    out = subprocess.run([str(binary), "--help"], env=env, capture_output=True, text=True, timeout=30)
    text = out.stdout + out.stderr
    if "error while loading shared libraries" in text:
        missing = re.search(r"loading shared libraries: ([^:]+)", text)
        raise PeerMissing(f"{binary} cannot start: {missing.group(1) if missing else 'a library'} is missing; "
                          f"{INSTALL_HINT}")
    if "perf_analyzer" not in text and "Usage" not in text:  # the PyPI placeholder package prints something else
        raise PeerMissing(f"{binary} is not the perf_analyzer 2.50 binary; {INSTALL_HINT}")
    return pa


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv != ["--check"]:
        print("usage: python -m serving_bench.peers.perf_analyzer --check")
        return 2
    try:
        pa = find_perf_analyzer()
        print(f"{pa.binary} ({pa.version()})")
        return 0
    except PeerMissing as err:
        print(f"perf_analyzer unavailable: {err}")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Energy over a stretch of work, where the host exposes it, and CPU-seconds always (the proxy where it does not).

    with EnergyMeter(pids=[server.pid]) as meter:
        ...                                   # the requests
    meter.reading.per_request(n)              # {"energy_j": ..., "cpu_s": ..., "measure": "rapl+nvml" | ...}

Sources, read at the start and the end:

- **RAPL** (``/sys/class/powercap/intel-rapl:N/energy_uj``, the CPU packages' counters in microjoules, wrapping at
  ``max_energy_range_uj``): the whole host's CPU packages, every process on them. Often readable only by root.
- **NVML** (``nvmlDeviceGetTotalEnergyConsumption``, millijoules since the driver loaded): every GPU, whole devices.
- **CPU-seconds** of the given processes and all their descendants (user + system), or of the whole host when no
  process is given. Where neither counter exists (a VM, these development machines) this is the figure, named
  ``cpu_seconds_proxy``: it is not energy, but on one host it orders variants by the work they cost the cores.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import psutil

from serving_bench.telemetry.gpu import GpuSampler

RAPL_ROOT = Path("/sys/class/powercap")
PROXY = "cpu_seconds_proxy"


@dataclass(frozen=True)
class EnergyReading:
    """What one stretch of work cost: ``elapsed_s``; ``cpu_s`` (CPU-seconds of the measured processes, or the host);
    ``host_j`` (RAPL, the CPU packages) and ``gpu_j`` (NVML, all GPUs), each None where not readable, with
    ``host_source``/``gpu_source`` saying what was read or why not."""

    elapsed_s: float
    cpu_s: float
    host_j: float | None
    gpu_j: float | None
    host_source: str
    gpu_source: str

    @property
    def measure(self) -> str:
        """``rapl``, ``nvml``, ``rapl+nvml``, or :data:`PROXY` where no energy counter was read."""
        names = [n for n, j in (("rapl", self.host_j), ("nvml", self.gpu_j)) if j is not None]
        return "+".join(names) or PROXY

    @property
    def energy_j(self) -> float | None:
        """Joules from the counters that were read, None where none was (then use ``cpu_s``, the proxy)."""
        values = [j for j in (self.host_j, self.gpu_j) if j is not None]
        return sum(values) if values else None

    def per_request(self, requests: int) -> dict:
        """Energy (J) and CPU-seconds per request, and what ``measure`` they rest on."""
        n = max(1, int(requests))
        return {"measure": self.measure, "energy_j": None if self.energy_j is None else self.energy_j / n,
                "cpu_s": self.cpu_s / n, "host_source": self.host_source, "gpu_source": self.gpu_source}


def rapl_domains(root: Path = RAPL_ROOT) -> list[Path]:
    """The top-level RAPL zones (one per CPU package; their sub-zones are parts of them)."""
    return sorted(p for p in Path(root).glob("intel-rapl:*") if p.name.count(":") == 1)


def read_rapl(root: Path = RAPL_ROOT) -> tuple[dict[str, tuple[int, int]], str]:
    """Per zone ``(energy_uj, max_energy_range_uj)``, and a line: the zones read, or why none was."""
    zones = rapl_domains(root)
    if not zones:
        return {}, f"no RAPL counters ({root}/intel-rapl:* absent: a VM or a CPU without them)"
    out = {}
    try:
        for zone in zones:
            out[zone.name] = (int((zone / "energy_uj").read_text()), int((zone / "max_energy_range_uj").read_text()))
    except PermissionError:
        return {}, f"RAPL counters not readable by this user ({zones[0]}/energy_uj is root-only here)"
    except (OSError, ValueError) as err:
        return {}, f"RAPL counters unreadable ({type(err).__name__}: {err})"
    names = ", ".join(" ".join((z / "name").read_text().split()) if (z / "name").is_file() else z.name for z in zones)
    return out, f"rapl: {names}"


def rapl_joules(start: dict[str, tuple[int, int]], end: dict[str, tuple[int, int]]) -> float:
    """Joules between two :func:`read_rapl` readings, each zone's wrap-around undone."""
    total_uj = 0
    for zone, (before, span) in start.items():
        after = end[zone][0]
        total_uj += after - before if after >= before else after + span - before
    return total_uj / 1e6


def cpu_seconds(pids: Sequence[int]) -> dict[int, float]:
    """pid -> CPU-seconds (user + system) so far, over ``pids`` and all their descendants alive now; the whole host
    (key 0: busy time over all cores) when ``pids`` is empty."""
    if not pids:
        times = psutil.cpu_times()
        return {0: times.user + times.system + getattr(times, "irq", 0.0) + getattr(times, "softirq", 0.0)}
    out: dict[int, float] = {}
    for pid in pids:
        try:
            root = psutil.Process(pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in tree:
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            out[proc.pid] = times.user + times.system
    return out


class EnergyMeter:
    """``with EnergyMeter(pids) as meter: ...`` then ``meter.reading`` (:class:`EnergyReading`). ``pids``: the
    processes whose CPU-seconds count (with their descendants: a server and its instances); none: the host."""

    def __init__(self, pids: Sequence[int] = (), *, gpu: bool = True, rapl_root: Path = RAPL_ROOT):
        self.pids, self.gpu, self.rapl_root = list(pids), gpu, Path(rapl_root)
        self.reading: EnergyReading | None = None

    def __enter__(self) -> "EnergyMeter":
        self._sampler = GpuSampler() if self.gpu else None
        self._gpu_start = self._sampler.energy_j() if self._sampler is not None else None
        self._rapl_start, self._host_source = read_rapl(self.rapl_root)
        self._cpu_start = cpu_seconds(self.pids)
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        elapsed = time.monotonic() - self._t0
        cpu_end = cpu_seconds(self.pids)
        cpu_s = sum(v - self._cpu_start.get(pid, 0.0) for pid, v in cpu_end.items())
        rapl_end, _ = read_rapl(self.rapl_root)
        host_j = rapl_joules(self._rapl_start, rapl_end) if self._rapl_start and rapl_end else None
        gpu_j, gpu_source = None, "not asked for"
        if self._sampler is not None:
            end = self._sampler.energy_j()
            if self._gpu_start is not None and end is not None:
                gpu_j, gpu_source = end - self._gpu_start, "nvml: total energy of every GPU"
            else:
                gpu_source = self._sampler.reason or "NVML has no energy counter for these GPUs"
            self._sampler.close()
        self.reading = EnergyReading(elapsed_s=elapsed, cpu_s=max(0.0, cpu_s), host_j=host_j, gpu_j=gpu_j,
                                     host_source=self._host_source, gpu_source=gpu_source)

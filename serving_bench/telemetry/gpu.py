"""GPU telemetry through NVML (``nvidia-ml-py``): per device utilisation, memory and power, and per-process memory.

Where there is no NVIDIA driver or GPU, ``nvmlInit()`` raises (``NVMLError_LibraryNotFound`` on these CPU machines):
the sampler then reports ``available = False`` with the reason, logs it once per process, and samples nothing.

``util_pct`` is NVML's ``utilization.gpu``: the percentage of time one or more kernels ran during the driver's last
sample period (1/6 s to 1 s). It is not SM occupancy; DCGM's profiling counters would be needed for that.
"""

from __future__ import annotations

import logging
import threading

import pandas as pd

from serving_bench.telemetry.rows import Row

log = logging.getLogger(__name__)
_reported: set[str] = set()


def _report_once(reason: str) -> None:
    if reason not in _reported:
        _reported.add(reason)
        log.warning("GPU telemetry off: %s; sampling CPU only", reason)


class GpuSampler:
    """One NVML session; call :meth:`close` when done. Rows have source ``gpu<index>``."""

    def __init__(self) -> None:
        self.available = False
        self.reason: str | None = None
        self._nvml = None
        self._handles: list = []
        try:
            import pynvml  # optional: only where a GPU is
        except ImportError:
            self.reason = "nvidia-ml-py (pynvml) is not installed"
        else:
            try:
                pynvml.nvmlInit()
                self._nvml = pynvml
                self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            except pynvml.NVMLError as err:
                self.reason = f"NVML unavailable ({type(err).__name__}: {err}): no NVIDIA driver or GPU here"
            else:
                if self._handles:
                    self.available = True
                else:
                    self.reason = "NVML found no GPU"
        if self.reason:
            _report_once(self.reason)

    def sample(self, server_procs=()) -> list[Row]:
        if not self.available:
            return []
        nvml = self._nvml
        server_pids = {p.pid for p in server_procs}
        rows: list[Row] = []
        for index, handle in enumerate(self._handles):
            source = f"gpu{index}"
            util = nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            rows += [Row(source, "util_pct", "", float(util.gpu)), Row(source, "mem_util_pct", "", float(util.memory)),
                     Row(source, "mem_used_bytes", "", float(memory.used)),
                     Row(source, "mem_total_bytes", "", float(memory.total))]
            try:
                rows.append(Row(source, "power_w", "", nvml.nvmlDeviceGetPowerUsage(handle) / 1e3))
            except nvml.NVMLError:  # not supported on every board
                pass
            server_mem = 0.0
            try:
                procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except nvml.NVMLError:
                procs = []
            for proc in procs:
                used = float(proc.usedGpuMemory or 0)  # None when the driver cannot tell (e.g. in containers)
                rows.append(Row(source, "process_mem_bytes", f"pid:{proc.pid}", used))
                if proc.pid in server_pids:
                    server_mem += used
            if server_pids:
                rows.append(Row(source, "server_mem_bytes", "", server_mem))
        return rows

    def process_memory_bytes(self) -> dict[int, float]:
        """Device memory each process holds now, summed over the devices (pid -> bytes); empty where NVML is off.
        A process whose use the driver cannot tell (inside some containers) is left out."""
        if not self.available:
            return {}
        out: dict[int, float] = {}
        for handle in self._handles:
            try:
                procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except self._nvml.NVMLError:
                continue
            for proc in procs:
                if proc.usedGpuMemory is not None:
                    out[proc.pid] = out.get(proc.pid, 0.0) + float(proc.usedGpuMemory)
        return out

    def energy_j(self) -> float | None:
        """Energy all devices used since the driver loaded (joules; NVML's counter, Volta and later), or None where
        a device cannot report it."""
        if not self.available:
            return None
        try:
            return sum(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self._handles) / 1e3
        except self._nvml.NVMLError:
            return None

    def busy_pct(self, index: int) -> float | None:
        """NVML's ``utilization.gpu`` of device ``index`` now (%), or None where it cannot be read."""
        if not self.available or index >= len(self._handles):
            return None
        try:
            return float(self._nvml.nvmlDeviceGetUtilizationRates(self._handles[index]).gpu)
        except self._nvml.NVMLError:
            return None

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
            self._nvml = None


class GpuBusy:
    """``with GpuBusy(index) as busy: ...``: the mean share of time (0..1) device ``index`` ran a kernel while the
    block ran, NVML's ``utilization.gpu`` polled every ``interval_s`` in a thread (``busy.share`` after the block;
    None where NVML is unavailable or read nothing). NVML averages over its own sample period (1/6 s to 1 s), so a
    block should last a few seconds."""

    def __init__(self, index: int, interval_s: float = 0.05):
        self.index, self.interval_s = index, interval_s
        self.share: float | None = None
        self._values: list[float] = []
        self._stop = threading.Event()
        self._sampler: GpuSampler | None = None
        self._thread: threading.Thread | None = None

    def _poll(self) -> None:
        while not self._stop.wait(self.interval_s):
            value = self._sampler.busy_pct(self.index)
            if value is not None:
                self._values.append(value)

    def __enter__(self) -> "GpuBusy":
        self._sampler = GpuSampler()
        if self._sampler.available:
            self._thread = threading.Thread(target=self._poll, name="gpu-busy", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sampler.close()
        self.share = sum(self._values) / len(self._values) / 100.0 if self._values else None


def summarize_gpu(frame: pd.DataFrame, available: bool, reason: str | None) -> dict:
    """Utilisation mean/peak (mean over devices of per-device means; peak over all), memory and power peaks."""
    out: dict = {"available": available, "reason": reason, "devices": {}}
    rows = frame[frame["source"].str.startswith("gpu")]
    for device, group in rows.groupby("source", sort=True):
        values = {m: g["value"] for m, g in group.groupby("metric")}
        get = lambda m, f: float(getattr(values[m], f)()) if m in values else None  # noqa: E731
        out["devices"][str(device)] = {
            "util_mean_pct": get("util_pct", "mean"), "util_peak_pct": get("util_pct", "max"),
            "mem_used_peak_bytes": get("mem_used_bytes", "max"), "mem_total_bytes": get("mem_total_bytes", "max"),
            "power_mean_w": get("power_w", "mean"), "power_peak_w": get("power_w", "max"),
            "server_mem_peak_bytes": get("server_mem_bytes", "max"),
        }
    devices = list(out["devices"].values())

    def pick(key, how):
        vals = [d[key] for d in devices if d[key] is not None]
        return float(how(vals)) if vals else None

    out["util_mean_pct"] = pick("util_mean_pct", lambda v: sum(v) / len(v))
    out["util_peak_pct"] = pick("util_peak_pct", max)
    out["mem_used_peak_bytes"] = pick("mem_used_peak_bytes", max)
    out["power_peak_w"] = pick("power_peak_w", max)
    return out

"""What the GPU was doing during a run, sampled through NVML (``scripts/gpu_campaign.py``'s runs, docs/gpu.md "The
GPU campaign"): its busy share and, where the driver's GPU performance monitoring (GPM, Hopper and later) answers, the
share of SMs active and the other DCGM-style activities.

* ``busy_pct``: NVML's ``utilization.gpu``, the share of time one or more kernels ran (over the driver's sample
  period, 1/6 s to 1 s);
* from GPM, between consecutive samples (``interval_s`` apart): ``sm_active_pct`` (``SM_UTIL``: the share of SMs
  with a warp resident, DCGM's SM_ACTIVE), ``sm_occupancy_pct`` (warps resident over the most possible),
  ``graphics_active_pct`` (``GRAPHICS_UTIL``: the share of time the compute engine was busy, DCGM's
  GR_ENGINE_ACTIVE), ``dram_bw_pct``, ``tensor_pct`` and ``ctxsw_pct`` (the share of time the engine was switching
  contexts: the cost of several processes sharing the GPU by time slices).

Where NVML or GPM cannot be read (no GPU, an old driver, a device or VM that refuses the profiling counters), the
summary says so in ``reason`` / ``gpm_reason`` and gives None for those figures: nothing is invented.
"""

from __future__ import annotations

import threading
import time

GPM_METRICS = {"graphics_active_pct": "NVML_GPM_METRIC_GRAPHICS_UTIL", "sm_active_pct": "NVML_GPM_METRIC_SM_UTIL",
               "sm_occupancy_pct": "NVML_GPM_METRIC_SM_OCCUPANCY", "tensor_pct": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
               "dram_bw_pct": "NVML_GPM_METRIC_DRAM_BW_UTIL", "ctxsw_pct": "NVML_GPM_METRIC_GR0_CTXSW_ACTIVE_PCT"}
FIELDS = ("busy_pct", *GPM_METRICS)


class Activity:
    """``with Activity() as gpu: ...`` samples device 0 every ``interval_s`` in a thread; :meth:`summary` gives the
    mean of each figure over a ``perf_counter`` window."""

    def __init__(self, interval_s: float = 0.1):
        self.interval_s = interval_s
        self.reason: str | None = None
        self.gpm_reason: str | None = None
        self.rows: list[tuple[float, dict]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = self._handle = None
        self._samples: list = []

    def __enter__(self) -> "Activity":
        try:
            import pynvml  # optional: only where a GPU is

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as err:  # noqa: BLE001 - no driver, no GPU, no package: said, not raised
            self.reason = f"NVML unavailable ({type(err).__name__}: {err})"
            return self
        self._open_gpm()
        self._thread = threading.Thread(target=self._poll, name="gpu-activity", daemon=True)
        self._thread.start()
        return self

    def _open_gpm(self) -> None:
        nvml = self._nvml
        missing = [name for name in ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmMetricsGet")
                   if not hasattr(nvml, name)]
        if missing:
            self.gpm_reason = f"this nvidia-ml-py has no {missing[0]}"
            return
        try:
            if not nvml.nvmlGpmQueryDeviceSupport(self._handle).isSupportedDevice:
                self.gpm_reason = "GPM: the device says it is not supported"
                return
            self._samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
            nvml.nvmlGpmSampleGet(self._handle, self._samples[0])
        except Exception as err:  # noqa: BLE001 - counters refused: said, not raised
            self.gpm_reason = f"GPM unavailable ({type(err).__name__}: {err})"
            self._samples = []

    def _gpm(self, first, second) -> dict:
        nvml = self._nvml
        names = [k for k, v in GPM_METRICS.items() if hasattr(nvml, v)]
        query = nvml.c_nvmlGpmMetricsGet_t()
        query.version = nvml.NVML_GPM_METRICS_GET_VERSION
        query.numMetrics = len(names)
        query.sample1, query.sample2 = first, second
        for i, name in enumerate(names):
            query.metrics[i].metricId = getattr(nvml, GPM_METRICS[name])
        nvml.nvmlGpmMetricsGet(query)
        return {name: float(query.metrics[i].value) for i, name in enumerate(names)
                if query.metrics[i].nvmlReturn == 0}

    def _poll(self) -> None:
        nvml, turn = self._nvml, 1
        while not self._stop.wait(self.interval_s):
            t = time.perf_counter()
            row: dict = {}
            try:
                row["busy_pct"] = float(nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
            except Exception:  # noqa: BLE001 - a missed sample
                pass
            if self._samples:
                try:
                    nvml.nvmlGpmSampleGet(self._handle, self._samples[turn])
                    row.update(self._gpm(self._samples[1 - turn], self._samples[turn]))
                    turn = 1 - turn
                except Exception as err:  # noqa: BLE001 - counters refused mid-run: said once, then off
                    self.gpm_reason = f"GPM failed while sampling ({type(err).__name__}: {err})"
                    self._samples = []
            self.rows.append((t, row))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._nvml is not None:
            for sample in self._samples:
                try:
                    self._nvml.nvmlGpmSampleFree(sample)
                except Exception:  # noqa: BLE001 - freeing at the end: nothing to do about it
                    pass
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass

    def summary(self, start_s: float, end_s: float) -> dict:
        """Per figure of :data:`FIELDS` its mean over the samples taken in ``[start_s, end_s]`` (``perf_counter``
        seconds; None where none was read), the number of samples and the reasons for what is missing."""
        rows = [row for t, row in list(self.rows) if start_s <= t <= end_s]
        out: dict = {"available": self.reason is None, "reason": self.reason, "gpm_reason": self.gpm_reason,
                     "samples": len(rows)}
        for name in FIELDS:
            values = [row[name] for row in rows if name in row]
            out[name] = round(sum(values) / len(values), 2) if values else None
        return out

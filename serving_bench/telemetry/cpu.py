"""CPU utilisation and memory with psutil: the whole machine, and the server's process tree when its pid is known.

``system_util_pct`` is the mean over all cores (0-100); ``server_cpu_pct`` is the sum over the server process and
its descendants (the python-backend stubs) in percent of one core, as ``top`` shows it (up to 100 x cores).
"""

from __future__ import annotations

import os
import time

import pandas as pd
import psutil

from serving_bench.telemetry.rows import Row

SOURCE = "cpu"
DISTURBED_SHARE = 0.01  # hypervisor steal above this share of the machine's CPU time: timings in it are suspect
JUDGED_AFTER_S = 10.0  # shorter spans are not judged: the kernel counts steal in ticks (10 ms each)


def steal_s() -> float:
    """CPU seconds the hypervisor gave to other guests instead of this machine, over all cores since boot (0 where
    the system does not report it): what makes a VM slower than its own load explains."""
    return float(getattr(psutil.cpu_times(), "steal", 0.0))


class StealClock:
    """The hypervisor's steal since this clock was made: :meth:`seconds` (CPU seconds) and :meth:`share` (of the
    machine's CPU time over the span, 0..1); :attr:`disturbed` above :data:`DISTURBED_SHARE` (over
    :data:`JUDGED_AFTER_S` at least)."""

    def __init__(self):
        self.started = time.monotonic()
        self.stolen = steal_s()

    def seconds(self) -> float:
        return steal_s() - self.stolen

    def share(self) -> float:
        return self.seconds() / (max(time.monotonic() - self.started, 1e-9) * (os.cpu_count() or 1))

    @property
    def disturbed(self) -> bool:
        return time.monotonic() - self.started >= JUDGED_AFTER_S and self.share() > DISTURBED_SHARE

    def sentence(self) -> str:
        """One line for a script's end: the share the hypervisor took so far, and whether that makes the run's
        figures incomparable."""
        return (f"the hypervisor took {self.share():.1%} of the machine's CPU time meanwhile"
                + (" (disturbed: these figures are not comparable)" if self.disturbed else ""))


def process_tree(pid: int | None) -> list[psutil.Process]:
    """``pid`` and all its descendants that exist now (empty when ``pid`` is None or gone)."""
    if pid is None:
        return []
    try:
        root = psutil.Process(pid)
        return [root] + root.children(recursive=True)
    except psutil.Error:
        return []


class CpuSampler:
    """Samples on each :meth:`sample`. psutil's percentages cover the time since the previous call, so the first call
    only primes them and reports memory; a process first seen at a tick counts from the next one."""

    def __init__(self) -> None:
        self._known: dict[int, psutil.Process] = {}  # keep Process objects: cpu_percent is relative to their last call
        self._primed = False

    def sample(self, server_procs: list[psutil.Process] = ()) -> list[Row]:
        memory = psutil.virtual_memory()
        util = psutil.cpu_percent(None)
        rows = [Row(SOURCE, "system_mem_used_bytes", "", float(memory.total - memory.available))]
        if self._primed:
            rows.append(Row(SOURCE, "system_util_pct", "", util))
        if server_procs:
            cpu = rss = 0.0
            alive = {}
            for proc in server_procs:
                known = self._known.get(proc.pid, proc)
                try:
                    cpu += known.cpu_percent(None)
                    rss += known.memory_info().rss
                except psutil.Error:
                    continue
                alive[proc.pid] = known
            self._known = alive
            rows += [Row(SOURCE, "server_rss_bytes", "", rss), Row(SOURCE, "server_processes", "", float(len(alive)))]
            if self._primed:
                rows.append(Row(SOURCE, "server_cpu_pct", "", cpu))
        self._primed = True
        return rows


def summarize_cpu(frame: pd.DataFrame) -> dict:
    """Mean and peak utilisation (percent), peak memory (bytes); None where nothing was sampled."""
    rows = frame[frame["source"] == SOURCE]
    out: dict = {}
    for metric, stats in (("system_util_pct", ("mean", "peak")), ("server_cpu_pct", ("mean", "peak")),
                          ("system_mem_used_bytes", ("peak",)), ("server_rss_bytes", ("peak",))):
        values = rows.loc[rows["metric"] == metric, "value"]
        stem = metric.rsplit("_", 1)
        for stat in stats:
            key = f"{stem[0]}_{stat}_{stem[1]}"
            if len(values) == 0:
                out[key] = None
            else:
                out[key] = float(values.mean() if stat == "mean" else values.max())
    return out

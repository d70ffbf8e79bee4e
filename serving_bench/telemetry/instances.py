"""Memory of each served model instance: the python-backend stub process Triton starts per instance.

The embedded tritonserver runs every model instance in a process of its own, ``triton_python_backend_stub``, a
descendant of the server whose command line names the runner file (``<repo>/<model>/<version>/<runner>.py``) and
Triton's instance name (``<model>_<group>_<index>``). :func:`instance_processes` finds them from the server's pid;
:func:`instance_memory` reads, per instance:

- ``rss_bytes``: resident memory now; ``peak_rss_bytes``: the most it held at any time since it started (the
  kernel's ``VmHWM``, so a peak between two readings is not missed);
- ``uss_bytes``: the memory only it holds (what stopping it frees: the RSS less the pages it shares with the other
  stubs, such as the libraries), None where ``/proc/PID/smaps`` cannot be read;
- ``device_bytes``: its memory on a GPU (NVML's per-process figure), None where there is no GPU, NVML, or the driver
  cannot tell.

RSS counts the runtime's libraries in every instance (torch alone is ~170 MB per stub); USS does not. Which one to
add up over instances depends on the question: RSS bounds one more instance from above, USS from below.
:func:`footprint_bytes` measures what several processes hold together (each resident page once, from the page
frames in ``/proc/PID/pagemap``; root only): the truth a prediction of k instances' memory is checked against.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import psutil

from serving_bench.telemetry.gpu import GpuSampler

STUB_NAME = "triton_python_backend_stub"
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
_INSTANCE = re.compile(r"_\d+_\d+$")


@dataclass(frozen=True)
class InstanceProcess:
    """One served instance: the entry ``model``, Triton's ``instance`` name and its stub's ``pid``."""

    model: str
    instance: str
    pid: int


@dataclass(frozen=True)
class InstanceMemory:
    """One instance's memory in bytes (see the module's docstring)."""

    model: str
    instance: str
    pid: int
    rss_bytes: int
    peak_rss_bytes: int
    uss_bytes: int | None
    device_bytes: float | None


@dataclass(frozen=True)
class MemoryReading:
    """Every served instance's memory, and ``device``: ``"nvml"`` where device memory was read, else why not."""

    instances: tuple[InstanceMemory, ...]
    device: str

    def by_model(self) -> dict[str, dict]:
        """Per model: ``instances``, ``rss_bytes``/``uss_bytes`` (mean over its instances), ``peak_rss_bytes``
        (the largest) and ``device_bytes`` (mean; None where not read)."""
        out: dict[str, dict] = {}
        for model in sorted({m.model for m in self.instances}):
            mine = [m for m in self.instances if m.model == model]
            mean = lambda values: sum(values) / len(values) if values and None not in values else None  # noqa: E731
            out[model] = {"instances": len(mine), "rss_bytes": mean([m.rss_bytes for m in mine]),
                          "peak_rss_bytes": max(m.peak_rss_bytes for m in mine),
                          "uss_bytes": mean([m.uss_bytes for m in mine]),
                          "device_bytes": mean([m.device_bytes for m in mine])}
        return out


def _identify(argv: list[str]) -> tuple[str, str] | None:
    """(model, instance) from a stub's command line, None if it is not one."""
    runner = next((Path(a) for a in argv[1:] if a.endswith(".py")), None)
    if runner is None or len(runner.parts) < 3:
        return None
    model = runner.parts[-3]
    instance = next((a for a in argv[2:] if a.startswith(model + "_") and _INSTANCE.search(a)),
                    argv[8] if len(argv) > 8 else "")
    return model, instance


def instance_processes(server_pid: int) -> list[InstanceProcess]:
    """The stub process of every instance the server ``server_pid`` runs now, by model and instance name."""
    try:
        children = psutil.Process(server_pid).children(recursive=True)
    except psutil.Error:
        return []
    out = []
    for proc in children:
        try:
            argv = proc.cmdline()
            if proc.name() != STUB_NAME and not (argv and Path(argv[0]).name == STUB_NAME):
                continue
        except psutil.Error:  # it ended meanwhile
            continue
        found = _identify(argv)
        if found:
            out.append(InstanceProcess(found[0], found[1], proc.pid))
    return sorted(out, key=lambda p: (p.model, p.instance))


def peak_rss_bytes(pid: int) -> int:
    """The process's resident-set high-water mark (``VmHWM`` in ``/proc/PID/status``), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise OSError(f"/proc/{pid}/status has no VmHWM line")


def instance_memory(server_pid: int, *, gpu: bool = True) -> MemoryReading:
    """The memory of every instance the server ``server_pid`` runs (``gpu``: read NVML too, where it works)."""
    sampler = GpuSampler() if gpu else None
    try:
        device = sampler.process_memory_bytes() if sampler is not None else {}
        reason = "nvml" if sampler is not None and sampler.available else \
            (sampler.reason if sampler is not None else "not asked for")
    finally:
        if sampler is not None:
            sampler.close()
    out = []
    for found in instance_processes(server_pid):
        try:
            proc = psutil.Process(found.pid)
            rss = proc.memory_info().rss
            peak = peak_rss_bytes(found.pid)
            try:
                uss = proc.memory_full_info().uss
            except psutil.AccessDenied:
                uss = None
        except (psutil.Error, OSError):  # it ended meanwhile
            continue
        out.append(InstanceMemory(found.model, found.instance, found.pid, rss, peak, uss,
                                  device.get(found.pid) if reason == "nvml" else None))
    return MemoryReading(tuple(out), reason or "unknown")


PAGEMAP_PRESENT = 1 << 63
PAGEMAP_PFN = (1 << 55) - 1


def resident_frames(pid: int) -> np.ndarray | None:
    """The physical page frames process ``pid`` holds resident (``/proc/PID/pagemap``), None where the kernel hides
    them (frame numbers need ``CAP_SYS_ADMIN``: they read as 0 for others)."""
    frames = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/pagemap", "rb") as pagemap:
        for line in maps:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            if line.rstrip().endswith("[vsyscall]"):
                continue
            pagemap.seek(start // PAGE_BYTES * 8)
            entries = np.frombuffer(pagemap.read((end - start) // PAGE_BYTES * 8), dtype=np.uint64)
            frames.append(entries[(entries & np.uint64(PAGEMAP_PRESENT)) != 0] & np.uint64(PAGEMAP_PFN))
    found = np.concatenate(frames) if frames else np.zeros(0, np.uint64)
    if len(found) and not found.any():
        return None
    return found


def footprint_bytes(pids: Sequence[int]) -> tuple[int | None, str]:
    """The memory ``pids`` hold together: every resident page counted once however many of them map it (the union
    of their page frames), and how it was read. What k instances of a model take from the host, shared libraries
    once; None, with the reason, where the frames cannot be read (not root, or a process ended)."""
    union = np.zeros(0, np.uint64)
    try:
        for pid in pids:
            frames = resident_frames(pid)
            if frames is None:
                return None, "page frame numbers hidden (/proc/PID/pagemap needs CAP_SYS_ADMIN)"
            union = np.union1d(union, frames)
    except OSError as err:
        return None, f"/proc/PID/pagemap unreadable ({type(err).__name__}: {err})"
    return int(len(union)) * PAGE_BYTES, "union of resident page frames (/proc/PID/pagemap)"

"""What each measured entry costs besides time: memory per instance and energy (or CPU-seconds, the proxy) per request.

A phase of its own (:func:`measure_resources`), on the embedded server with one instance per model, after the
solo runs. Per model and measured batch size ``b``: requests of ``b`` rows one at a time for half the profile's
``seconds`` (at least :data:`MIN_REQUESTS` requests' time, from the solo run of that size) inside an
:class:`~serving_bench.telemetry.energy.EnergyMeter` over the server and its instances:

- **energy per request**: joules from RAPL (the host's CPU packages) and NVML (its GPUs) where the host exposes them,
  over the requests answered; where it exposes neither (a VM), CPU-seconds of the server and its instances per
  request, named ``cpu_seconds_proxy``: not energy, but on one host it orders variants by the work they cost. The
  CPU-seconds are kept beside joules too. RAPL counts the whole package, other processes' work included: on a shared
  host the joules are an upper bound. Measured at the profile's threads per instance.
- **memory per instance**, read after the run at each size, the sizes in increasing order on a fresh instance (so
  the reading after ``b`` rows is an instance that has served batches of up to ``b``: its arenas hold that batch's
  activations): the instance's process RSS, its USS (the pages only it holds) and, after the largest, its resident
  peak (``VmHWM``, :func:`~serving_bench.telemetry.instances.instance_memory`); on a GPU its device memory instead
  of the RSS. The largest size's figures are the entry's ``memory_bytes`` / ``memory_unique_bytes``; every size's
  are its ``memory_by_batch``, from which a configuration's ``max_batch_size`` takes its own.

k instances of an entry are predicted to hold ``k * USS + (RSS - USS)`` bytes on the host
(:meth:`~serving_bench.profiles.entries.ModelOnDevice.memory_for`): each instance is a process of its own (Triton's
python-backend stub, started fresh, nothing inherited), so its private pages (weights, activations, the runtime's
arenas) are its own, and the pages it shares — the runtime's libraries — are mapped once for all. The tuner sums it
over a configuration's models (their shared parts per framework once). ``benchmarks/frameworks.py`` checks it against
a real k-instance server (the union of the instances' resident page frames,
:func:`~serving_bench.telemetry.instances.footprint_bytes`).

Against an external server (``url``) or with Triton's request trace (``trace``) the instances' processes are not
this tool's to read: the phase is skipped with a note.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial

import numpy as np

from serving_bench.calibrate.lab import Lab
from serving_bench.calibrate.plan import HOST_DEVICE
from serving_bench.calibrate.session import Session, Step
from serving_bench.profiles.entries import EnergyTable
from serving_bench.profiles.schema import Profile
from serving_bench.telemetry.energy import EnergyMeter
from serving_bench.telemetry.instances import instance_memory

MIN_REQUESTS = 8  # a resources run lasts at least this many solo requests' time


@dataclass(frozen=True)
class Resources:
    """One entry's resources: memory of one instance (bytes; ``memory_bytes`` the RSS, on a GPU its device
    memory), its USS and resident peak, the energy table, and per batch size (RSS, USS)."""

    memory_bytes: int | None
    memory_unique_bytes: int | None
    memory_peak_bytes: int | None
    energy: EnergyTable | None
    memory_by_batch: dict = dataclasses.field(default_factory=dict)


def skip_reason(lab: Lab) -> str | None:
    """Why the phase does not run (None: it does)."""
    config = lab.plan.config
    if not config.resources:
        return "memory and energy not measured (asked not to)"
    if config.url:
        return "memory and energy not measured: an external server's instances are not this tool's processes to read"
    if config.trace:
        return "memory and energy not measured with --trace (the traced server's processes are not read)"
    return None


def resource_run(lab: Lab, m: str, b: int, session: Session) -> dict:
    """Requests of ``b`` rows to ``m`` one at a time inside an energy meter; after the largest size, the memory of
    ``m``'s instance (module doc). A dict: ``requests``, ``per_request`` (:meth:`EnergyReading.per_request`),
    ``memory``."""
    plan = lab.plan
    solo = lab.runs.get((m, "solo", b))
    latency = float(np.mean(solo.latency[m])) if solo is not None else 0.0
    seconds = max(plan.config.seconds / 2, MIN_REQUESTS * latency)
    pid = session.server.pid
    on_gpu = plan.devices[m] != HOST_DEVICE
    with EnergyMeter([pid], gpu=on_gpu) as meter:
        run = session.run({m: (b, 1)}, seconds)
    requests = len(run.latency[m])
    reading = instance_memory(pid, gpu=on_gpu)
    out = {"requests": requests, "per_request": meter.reading.per_request(requests),
           "memory": reading.by_model().get(m)}
    cost = out["per_request"]
    lab.log(f"{m}: batch {b}: {requests} requests, {cost['cpu_s'] * 1e3:.1f} CPU-ms a request"
            + (f", {cost['energy_j']:.3f} J ({cost['measure']})" if cost["energy_j"] is not None else "")
            + (f"; instance memory RSS {out['memory']['rss_bytes'] / 1e6:.0f} MB, USS "
               f"{(out['memory']['uss_bytes'] or 0) / 1e6:.0f} MB" if out["memory"] else ""))
    return out


def measure_resources(lab: Lab) -> dict[str, Resources]:
    """Run the phase (module doc) and return each model's :class:`Resources`; nothing (and a note) where it is
    skipped."""
    reason = skip_reason(lab)
    if reason is not None:
        lab.notes.append(reason)
        lab.log(f"note: {reason}")
        return {}
    plan = lab.plan
    steps: list[Step] = [((m, "resources", b), partial(resource_run, lab, m, b)) for m in plan.models
                         for b in plan.sizes[m]]
    runs: dict = {}
    lab.run_phase(steps, runs, lab.sessions(1), "resources")
    out = {m: resources_of(m, plan.sizes[m], runs, plan.devices[m] != HOST_DEVICE) for m in plan.models}
    measures = sorted({r.energy.measure for r in out.values() if r.energy is not None})
    lab.notes.append("memory per instance read after requests of each batch size; energy per request "
                     f"measured as {', '.join(measures) or 'nothing'}" +
                     (" (CPU-seconds of the server and its instances: no energy counter on this host)"
                      if measures == ["cpu_seconds_proxy"] else ""))
    return out


def resources_of(m: str, sizes: list[int], runs: dict, on_gpu: bool) -> Resources:
    """One model's :class:`Resources` from its runs (``runs[(m, "resources", b)]``)."""
    per = {b: runs[(m, "resources", b)]["per_request"] for b in sizes}
    measure = per[sizes[0]]["measure"]
    energy = EnergyTable(measure, {b: (p["energy_j"] if p["energy_j"] is not None else p["cpu_s"]) for b, p in
                                   per.items()}, {b: p["cpu_s"] for b, p in per.items()})
    by_batch = {b: _reading(runs[(m, "resources", b)]["memory"], on_gpu) for b in sizes}
    by_batch = {b: pair for b, pair in by_batch.items() if pair[0] is not None}
    memory = runs[(m, "resources", sizes[-1])]["memory"]
    if memory is None or sizes[-1] not in by_batch:
        return Resources(None, None, None, energy)
    rss, uss = by_batch[sizes[-1]]
    return Resources(rss, uss, int(memory["peak_rss_bytes"]), energy, by_batch)


def _reading(memory: dict | None, on_gpu: bool) -> tuple[int | None, int | None]:
    """(RSS or device bytes, USS or None) of one instance's memory reading (None, None where there is none)."""
    if memory is None:
        return None, None
    if on_gpu:
        return (None if memory["device_bytes"] is None else int(memory["device_bytes"])), None
    uss = memory["uss_bytes"]
    return int(memory["rss_bytes"]), None if uss is None else int(uss)


def with_resources(profile: Profile, resources: dict[str, Resources]) -> Profile:
    """``profile`` with each measured entry's resources on the device it was measured on."""
    models = dict(profile.models)
    for name, found in resources.items():
        mp = models[name]
        devices = {d: dataclasses.replace(md, memory_bytes=found.memory_bytes,
                                          memory_unique_bytes=found.memory_unique_bytes,
                                          memory_peak_bytes=found.memory_peak_bytes, energy=found.energy,
                                          memory_by_batch=found.memory_by_batch)
                   for d, md in mp.devices.items()}
        models[name] = dataclasses.replace(mp, devices=devices)
    return dataclasses.replace(profile, models=models)

"""Measure a profile on real Triton: service time per batch size, client/network overhead, co-location curve.

For each model and batch size ``b`` one closed-loop run (concurrency 1, every request of ``b`` rows, one instance)
gives client latencies ``L_i`` (send to done, from the load driver) and Triton's own statistics for the run
(``get_inference_statistics``: mean ``compute_input + compute_infer + compute_output`` per request, i.e. the time an
instance is busy with the batch). The **overhead** is ``mean(L) - mean(compute)`` (network, gRPC, batcher hand-off:
per-request latency that does not occupy the instance), measured at ``b = 1`` and stored per model; the
**service-time samples** are ``L_i - overhead`` (so their mean is Triton's compute time and their spread the
observed one).

The **co-location curve**: for k in ``colocation`` (k > 1) the server is restarted with k instances of the model and
driven closed-loop at concurrency k with batch 1; with ``t_k`` Triton's mean compute time per batch, ``S(k) =
k * t_1 / t_k`` (k batches each ``t_k / t_1`` slower). Everything uses the team's driver (``load.driver``) and
server (``serve.server``); nothing here times requests itself.
"""

from __future__ import annotations

import os
import platform
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from serving_bench.errors import InputError
from serving_bench.load.schedule import Schedule
from serving_bench.profiles.schema import Curve, DeviceInfo, Dist, ModelOnDevice, ModelProfile, Profile

DEFAULT_SECONDS = 2.0
MAX_SAMPLES = 2000


def default_batch_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, ... up to and including ``max_batch_size`` (just 1 without batching)."""
    if max_batch_size <= 1:
        return [1]
    sizes = [1]
    while sizes[-1] * 2 < max_batch_size:
        sizes.append(sizes[-1] * 2)
    return sizes + [max_batch_size]


def _closed_loop(endpoints, model: str, batch: int, concurrency: int, seconds: float):
    from serving_bench.load.driver import ClosedLoop, TritonTarget

    n = 200_000
    schedule = Schedule(np.zeros(n), np.zeros(n, dtype=np.int32), (model,), np.zeros(n, dtype=np.int32),
                        np.full(n, batch, dtype=np.int32), {"duration_s": seconds})
    target = TritonTarget(endpoints, mode=ClosedLoop(concurrency=concurrency, duration_s=seconds),
                          source="profile measurement")
    records = target.run(schedule)
    ok = records[records["status"].astype(str) == "ok"]
    if len(ok) < 5:
        raise InputError("profile measurement", model, f"only {len(ok)} requests succeeded at batch {batch}: "
                         f"{records['error'].astype(str).iloc[0] if len(records) else 'no requests'}")
    stats = records.attrs.get("server_stats", {}).get(model, {})
    compute = sum(stats.get(f"compute_{p}_mean_s") or 0.0 for p in ("input", "infer", "output"))
    latency = (ok["done_s"] - ok["sent_s"]).to_numpy()
    return latency, compute, stats


def _mode_of(config) -> str:
    params = {k: v.string_value for k, v in config.parameters.items()}
    if params.get("cuda_graphs", "").lower() in ("1", "true", "yes"):
        return "cuda_graphs"
    if config.platform == "tensorrt_plan":
        return "tensorrt"
    if config.platform in ("pytorch_libtorch",) or config.backend == "pytorch":
        return "eager"
    return "n/a"


def measure_profile(repo: str | Path, models: Sequence[str], out_path: str | Path | None = None, *,
                    batch_sizes: Sequence[int] | None = None, colocation: Sequence[int] = (1, 2, 4),
                    seconds: float = DEFAULT_SECONDS, url: str | None = None,
                    log: Callable[[str], None] | None = None) -> Profile:
    """Measure ``models`` of ``repo`` (embedded server, or the external one at ``url``); save to ``out_path``."""
    from serving_bench.export.repository import CONFIG_NAME, entry_dir, read_config
    from serving_bench.serve.server import Endpoints, TritonServer

    log = log or (lambda _msg: None)
    repo = Path(repo)
    configs = {m: read_config(entry_dir(repo, m) / CONFIG_NAME) for m in models}
    for m, config in configs.items():
        if config.platform == "ensemble":
            raise InputError("--models", m, "an ensemble is simulated from its members; profile the members")
    cores = os.cpu_count() or 1
    device = "cpu"
    results: dict[str, ModelProfile] = {}

    def run_all(endpoints):
        out = {}
        for m in models:
            config = configs[m]
            sizes = list(batch_sizes) if batch_sizes else default_batch_sizes(config.max_batch_size)
            sizes = [b for b in sizes if b <= max(config.max_batch_size, 1)]
            batches, overhead, solo_compute = {}, None, None
            for b in sizes:
                latency, compute, _ = _closed_loop(endpoints, m, b, 1, seconds)
                if b == 1:
                    solo_compute = compute
                if overhead is None:
                    overhead = max(float(latency.mean()) - compute, 0.0) if compute > 0 else 0.0
                service = np.clip(latency - overhead, 1e-7, None)
                if len(service) > MAX_SAMPLES:
                    service = np.quantile(service, np.linspace(0, 1, MAX_SAMPLES))
                batches[b] = Dist.from_samples(service)
                log(f"{m}: batch {b}: {len(latency)} requests, service p50 {np.median(service) * 1e3:.3f} ms "
                    f"(server compute {compute * 1e3:.3f} ms), overhead {overhead * 1e3:.3f} ms")
            out[m] = (batches, overhead or 0.0, solo_compute)
        return out

    if url:
        endpoints = Endpoints.from_url(url)
        solo = run_all(endpoints)
    else:
        with TritonServer(repo, models=list(models), instances={m: 1 for m in models}) as server:
            solo = run_all(server.endpoints)

    curves: dict[str, Curve] = {}
    ks = sorted(k for k in colocation if k > 1)
    for m in models:
        t1 = solo[m][2]
        if not ks or not t1 or url:
            continue
        points = []
        for k in ks:
            with TritonServer(repo, models=[m], instances={m: k}) as server:
                _, tk, _ = _closed_loop(server.endpoints, m, 1, k, seconds)
            speedup = k * t1 / tk if tk > 0 else float(k)
            points.append((float(k), max(min(speedup, float(k)), 1e-3)))
            log(f"{m}: {k} instances: compute {tk * 1e3:.3f} ms per batch vs {t1 * 1e3:.3f} solo: S({k}) = {speedup:.2f}")
        curves[m] = Curve(1, (1.0,) + tuple(k for k, _ in points), (1.0,) + tuple(s for _, s in points))

    for m in models:
        config = configs[m]
        batches, overhead, _ = solo[m]
        md = ModelOnDevice(_mode_of(config), batches, (curves[m],) if m in curves else (), 1)
        framework = config.platform or config.backend
        results[m] = ModelProfile(m, framework, "fp32", {device: md}, Dist.constant(overhead))
    overall = Dist.constant(float(np.mean([results[m].overhead.mean for m in models])))
    profile = Profile({device: DeviceInfo(device, "cpu", platform.processor() or platform.machine(), cores=cores)},
                      results, overall,
                      host={"hostname": socket.gethostname(), "cpu": platform.processor() or platform.machine(),
                            "cores": cores, "os": platform.platform(), "server": url or "embedded tritonserver"},
                      source=f"measured on {url or 'embedded tritonserver'} from {repo}",
                      created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      notes=(f"closed loop, {seconds:g} s per point; service = client latency - overhead; "
                             "co-location at batch 1",))
    if out_path is not None:
        profile.save(out_path)
    return profile

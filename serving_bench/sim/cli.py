"""``serving-bench simulate LOAD.yaml --profile P.json [--config serving.yaml | --repo model_repo/] --out DIR
[--concurrency N] [--client-cpu-us X] [--threads-per-instance N] [--replications R] [--confidence C]
[--host-spread S] [--same-schedule]``.

Builds the schedule from the load profile exactly as ``replay`` does (``load.profile.build_schedule``), runs it
through :class:`SimTarget`, and writes what a replay writes, with the same writer (:mod:`serving_bench.run.results`):
``schedule.npz``, ``records.parquet/.csv/.json``, ``summary.json`` (its ``sim`` section: utilisation, busy time,
executions, items per execution, time inside the server, device busy time) and ``perf_analyzer.csv``. Everything is
checked before anything is written: the inputs, the schedule's size (``--max-requests``), the output folder (held
for the run: :func:`serving_bench.run.results.hold_results`), and requests larger than their model takes (refused
as ``replay`` refuses them). ``--concurrency N`` runs a closed loop instead (``N`` clients per model or
ensemble, each sending its next request when the previous one is answered, for the load's duration: what
``replay --concurrency N`` does on Triton, and what a perf_analyzer or Model Analyzer concurrency sweep reads).
``--client-cpu-us X`` simulates a client that costs ``X`` µs more host CPU per request than the sender the profile
was measured through (:func:`serving_bench.sim.client.through_client`; perf_analyzer over serving-bench's native
sender: about +60 on a 2-core host, docs/notes/tune-history.md#model-analyzer-comparison), so the figures are what
that client would measure.
``--threads-per-instance N`` simulates a server whose every instance runs ``N`` runtime threads (``serve
--threads-per-instance N``); by default what the embedded server gives them, cores // all served instances
(the profile's table for that count: docs/sim.md, "Threads per instance").

Each model's p50, p90, p99 and throughput carry a ``C`` interval (default 90 %) over ``R`` replications (default 40;
0: none) — :mod:`serving_bench.sim.intervals`: each on its own simulator seed and its own draw of the host's speed
(the profile's ``host_spread``, or ``--host-spread S``), and its own realisation of the load (a forecast of future
traffic; ``--same-schedule``: the one schedule written, as a replay of it would send). The point figures stay the
``--seed`` run's, on the profile's own host speed; ``summary.json`` gains per model ``intervals`` (``[low, high]``
per figure) and ``replications`` (what they were drawn from).

The serving knobs come from a repository (``--repo``: each entry's ``config.pbtxt``), from a YAML file (``--config``)
or, with neither, from the profile (:func:`serving_bench.sim.profile_config.config_from_profile`, ``tune``'s default
too: each model as exported and served by Triton, one instance on its first device, dynamic batching up to its
largest measured batch size). The YAML is checked as strictly as a load profile: unknown fields anywhere are refused,
and every knob as Triton takes it (:func:`serving_bench.serving_config.check_serving`: dynamic-batching knobs only
with ``dynamic_batching: true``, preferred sizes up to ``max_batch_size``, 1 to ``MAX_INSTANCES`` instances of a model
per device).

``--config`` YAML::

    models:
      resnet50_onnxruntime: {max_batch_size: 8, dynamic_batching: true, max_queue_delay_us: 100,
                             preferred_batch_sizes: [4, 8], max_queue_size: 0, queue_timeout_us: 0,
                             instances: [[gpu0, 2]]}
    ensembles:
      pipeline: [preprocess_python, resnet50_onnxruntime]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from pathlib import Path

from serving_bench.errors import InputError, require_count
from serving_bench.files import read_yaml
from serving_bench.load.profile import MAX_REQUESTS, LoadProfile, build_schedule, check_schedule_size
from serving_bench.profiles.schema import Profile
from serving_bench.run.results import hold_results, write_results
from serving_bench.run.target import ClosedLoop
from serving_bench.export.repository import check_entry_name
from serving_bench.serving_config import ModelServing, ServingConfig, add_threads_option, check_serving
from serving_bench.sim.client import client_cpu_s, through_client
from serving_bench.sim.profile_config import config_from_profile
from serving_bench.sim.intervals import (IntervalOptions, add_interval_options, described, interval_text, replicate,
                                         summary_intervals, with_intervals)
from serving_bench.sim.target import SimTarget, check_batches

TOP_FIELDS = ("models", "ensembles")
CONFIG_FIELDS = ("max_batch_size", "dynamic_batching", "max_queue_delay_us", "preferred_batch_sizes",
                 "max_queue_size", "queue_timeout_us", "instances")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("load_profile", help="load profile YAML (load_profiles/*.yaml)")
    parser.add_argument("--profile", required=True, help="simulator profile JSON (serving-bench profile)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--config", help="serving config YAML (batching and instances per model)")
    source.add_argument("--repo", help="model repository whose config.pbtxt files give the serving config")
    parser.add_argument("--out", required=True, help="results folder to write")
    parser.add_argument("--seed", type=int, default=0, help="simulator seed (service times, overheads)")
    parser.add_argument("--concurrency", type=int, help="closed loop: requests in flight per model or ensemble")
    parser.add_argument("--engine", choices=("fast", "simpy"), default="fast",
                        help="fast (default) or the SimPy reference (same records, slower)")
    parser.add_argument("--client-cpu-us", type=float, default=0.0,
                        help="host CPU per request of the client to simulate beyond the profile's sender's, in µs "
                             "(e.g. perf_analyzer's: docs/sim.md#another-client)")
    add_threads_option(parser)
    parser.add_argument("--max-requests", type=int, default=MAX_REQUESTS,
                        help=f"refuse a schedule of more requests (default {MAX_REQUESTS:,})")
    add_interval_options(parser)
    parser.add_argument("--same-schedule", action="store_true",
                        help="replications run the one schedule written (default: each its own realisation of the "
                             "load, as future traffic would be)")


def load_serving_yaml(path: str | Path) -> ServingConfig:
    """A :class:`ServingConfig` from the YAML layout in the module docstring, checked as strictly as a load profile:
    unknown fields refused at every level, every knob as Triton takes it (:func:`check_serving`), ensembles of
    listed models."""
    path = Path(path)
    data = read_yaml(path, "serving config")
    if not isinstance(data, dict):
        raise InputError(path, "(top level)", f"expected a mapping with {' and '.join(TOP_FIELDS)}")
    unknown = sorted(str(k) for k in set(data) - set(TOP_FIELDS))
    if unknown:
        raise InputError(path, unknown[0], f"unknown field; expected {', '.join(TOP_FIELDS)}")
    if not isinstance(data.get("models"), dict) or not data["models"]:
        raise InputError(path, "models", "expected a mapping model name -> serving settings")
    models = tuple(_model_serving(path, name, spec) for name, spec in data["models"].items())
    ensembles = data.get("ensembles") or {}
    if not isinstance(ensembles, dict):
        raise InputError(path, "ensembles", "expected a mapping ensemble name -> list of member names")
    for name, members in ensembles.items():
        check_entry_name(name, path, f"ensembles.{name}")
        if not isinstance(members, list) or not members:
            raise InputError(path, f"ensembles.{name}", "expected a list of member names")
        for i, member in enumerate(members):
            if member not in data["models"]:
                raise InputError(path, f"ensembles.{name}[{i}]", f"{member!r}: expected a model listed under models")
    return ServingConfig(models, tuple((k, tuple(v)) for k, v in ensembles.items()))


def _model_serving(path: Path, name, spec) -> ModelServing:
    """One model's settings of the serving YAML, checked."""
    check_entry_name(name, path, f"models.{name}")
    spec = {} if spec is None else spec
    if not isinstance(spec, dict):
        raise InputError(path, f"models.{name}", "expected a mapping of serving settings")
    unknown = sorted(str(k) for k in set(spec) - set(CONFIG_FIELDS))
    if unknown:
        raise InputError(path, f"models.{name}.{unknown[0]}", f"unknown field; expected {', '.join(CONFIG_FIELDS)}")
    kwargs = {}
    for key, value in spec.items():
        where = f"models.{name}.{key}"
        if key == "dynamic_batching" and not isinstance(value, bool):
            raise InputError(path, where, f"expected true or false, got {value!r}")
        if key == "preferred_batch_sizes":
            if not isinstance(value, list) or not all(_count(v) and v >= 1 for v in value):
                raise InputError(path, where, f"expected a list of batch sizes >= 1, got {value!r}")
            value = tuple(value)
        elif key == "instances":
            if not isinstance(value, list) or not all(
                    isinstance(i, list) and len(i) == 2 and isinstance(i[0], str) and _count(i[1]) for i in value):
                raise InputError(path, where, f"expected a list of [device, count] pairs, got {value!r}")
            value = tuple((d, c) for d, c in value)
        elif key != "dynamic_batching" and not (_count(value) and value >= 0):
            raise InputError(path, where, f"expected an integer >= 0, got {value!r}")
        kwargs[key] = value
    model = ModelServing(name=name, **kwargs)
    check_serving(model, path)
    return model


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def serving_config_for(given: ServingConfig | None, args_repo: str | None, profile, schedule) -> ServingConfig:
    """The serving config: ``given`` (from --config), else from --repo (its ensembles' step graphs with it), else
    from the profile (in that order of precedence)."""
    if given is not None:
        return given
    if args_repo:
        return ServingConfig.from_repo(args_repo, list(schedule.models))
    return config_from_profile(profile, schedule.models)


def main(args: argparse.Namespace) -> int:
    require_count("--concurrency", args.concurrency)
    require_count("--threads-per-instance", args.threads_per_instance)
    require_count("--max-requests", args.max_requests)
    load = LoadProfile.load(args.load_profile)
    requests = check_schedule_size(load, args.max_requests)
    profile = through_client(Profile.load(args.profile), client_cpu_s(args.client_cpu_us))
    given = load_serving_yaml(args.config) if args.config else None
    replications, source = IntervalOptions.from_args(args).resolve(profile, args.seed)
    with hold_results(args.out, requests):
        schedule = build_schedule(load, args.max_requests)
        config = serving_config_for(given, args.repo, profile, schedule).with_threads(args.threads_per_instance)
        target = SimTarget(profile, config, seed=args.seed, engine=args.engine)
        check_batches(schedule, config, args.load_profile)
        mode = ClosedLoop(args.concurrency) if args.concurrency else None
        records = target.run(schedule, mode)
        annotate = None
        if replications is not None:
            def schedule_of(draw):
                return schedule if args.same_schedule else build_schedule(
                    dataclasses.replace(load, seed=draw.seed), args.max_requests)
            intervals = summary_intervals(replicate(profile, config, schedule_of, replications, mode), replications)
            about = described(replications, source, "the one schedule" if args.same_schedule else
                              "each its own realisation of the load")
            annotate = functools.partial(with_intervals, intervals=intervals, about=about)
        summary = write_results(Path(args.out), records, schedule, annotate=annotate)
    print_summary(summary)
    print(f"wrote {args.out}/ (schedule.npz, records.*, summary.json, perf_analyzer.csv)")
    return 0


def print_summary(summary: dict) -> None:
    """Each model's figures of a results folder's ``summary``, then their intervals where it has them."""
    print(f"{'model':<28} {'ok':>8} {'p50 ms':>9} {'p99 ms':>9} {'rps':>9} {'batch':>6}")
    for name, s in summary["models"].items():
        def ms(v):
            return f"{v * 1e3:9.2f}" if v is not None else f"{'-':>9}"
        batch = f"{s['mean_exec_batch']:6.2f}" if s.get("mean_exec_batch") else f"{'-':>6}"
        print(f"{name:<28} {s['counts']['ok']:>8} {ms(s['p50_s'])} {ms(s['p99_s'])} {s['throughput_rps']:9.1f} {batch}")
    about = summary.get("replications")
    if not about:
        return
    print(f"{about['confidence']:.0%} intervals over {about['count']} replications ({about['schedules']}; host "
          f"spread {about['host_spread'] * 100:.1f} %: {about['host_spread_source']})")
    print(f"{'model':<28} {'p50 ms':>19} {'p99 ms':>19} {'rps':>19}")
    for name, s in summary["models"].items():
        found = s.get("intervals") or {}
        print(f"{name:<28} " + " ".join(interval_text(found.get(key), 1e3 if key.endswith("_s") else 1.0)
                                        for key in ("p50_s", "p99_s", "throughput_rps")))

"""``serving-bench tune PROFILE.yaml --profile PROFILE.json --slo model=p99:20ms,... [--repo model_repo/]``

Searches per-model instance count, max_batch_size, queue delay, preferred batch sizes, (with ``--variants``) which
measured variant serves each model and (with ``--gpus N``) which models share which GPU, under a memory budget per
device (``--memory-gb``), on the simulator at the load profile's load; checkpoints every observation to
``OUT/observations.jsonl`` (rerun the same command to resume); on a long load ranks the candidates on a screen of it
first and simulates the best on the whole load (``OUT/confirmed.jsonl``); verifies the top K on real Triton
(embedded, or ``--url``) at 1x, at the predicted capacity and one ladder rung above (``tune.verify``); writes
``OUT/tune.json``, the tuned repository ``OUT/tuned_repo/`` and ``OUT/report.html``. ``--growth superpose|scale``: how
the load grows to a multiple of itself (``tune.load``), named with every capacity figure.
``--client-cpu-us X`` tunes for a client costing ``X`` µs more host CPU per request than the profile's sender
(:func:`serving_bench.sim.client.through_client`; perf_analyzer's, say: docs/sim.md#another-client).
``--threads-per-instance N`` simulates and verifies every candidate with ``N`` runtime threads per instance
(default: the embedded server's, cores // all served instances, which changes with each candidate's instance counts).

The pick's capacity carries its interval over ``--replications R`` (default 40; 0: none) replicated searches
(:mod:`serving_bench.tune.intervals`: each its own realisation of the load, simulator seed and draw of the host's
speed from the profile's ``host_spread`` or ``--host-spread``), at ``--confidence C`` (default 90 %).
``--confidence C`` also judges every probe of the search at the upper end of each figure's interval over ``R``
replications (:mod:`serving_bench.tune.objective`): ``R`` simulations a probe, about ``R`` times the search's time.
Without it the search is as it was: one simulation a probe.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from serving_bench.serving_config import add_threads_option
from serving_bench.sim.intervals import add_interval_options
from serving_bench.tune import adapters
from serving_bench.tune.executors import EXECUTORS
from serving_bench.tune.generators import GENERATORS
from serving_bench.tune.load import GROWTHS, SCREEN_ABOVE, SCREEN_FORM, SCREEN_REQUESTS, screen_asked
from serving_bench.tune.objective import OBJECTIVES
from serving_bench.tune.run import DEFAULT_BUDGET_MINUTES, TuneOptions, run_tune
from serving_bench.tune.search import DEFAULT_FINALISTS
from serving_bench.tune.slo import SLO_FORM
from serving_bench.tune.space import PREFERRED_RULES, parse_values


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("load", metavar="PROFILE.yaml", help="load profile (or a saved schedule .npz)")
    parser.add_argument("--profile", required=True, help="simulator profile JSON (serving-bench profile), or "
                        "builtin:h200-eager (the bundled H200 torch eager-mode table)")
    parser.add_argument("--slo", help="per-model SLOs, " + SLO_FORM + "; default: the load profile's slos")
    parser.add_argument("--repo", help="model repository: base configs, the tuned copy and verification")
    parser.add_argument("--models", help="comma-separated entries to tune (default: every served entry)")
    parser.add_argument("--gpus", type=int, default=0, help="place models on up to N GPUs (0: keep devices)")
    parser.add_argument("--objective", choices=OBJECTIVES, default="throughput",
                        help="throughput: most load under the SLOs; gpus: fewest GPUs, then throughput; energy: least "
                             "energy (or CPU-seconds, the profile's proxy) per request under the SLOs")
    parser.add_argument("--variants", help="search which measured variant serves each model: auto (every variant "
                        "of its zoo model in the profile) or a list (onnxruntime,onnxruntime:int8,tvm:trials=64)")
    parser.add_argument("--memory-gb", type=float, help="memory each device may hold, GB (default: a GPU's own; on a "
                        "CPU the host's available memory now)")
    parser.add_argument("--instances", default="1,2", help="candidate instance counts (default 1,2)")
    parser.add_argument("--max-batch-sizes", default="1,8,32", help="candidate max_batch_size values")
    parser.add_argument("--queue-delays-us", default="0,1000", help="candidate max_queue_delay_microseconds")
    parser.add_argument("--preferred", default="none", help=f"preferred batch rules among {', '.join(PREFERRED_RULES)}")
    parser.add_argument("--generator", choices=("auto", *GENERATORS), default="auto")
    parser.add_argument("--executor", choices=tuple(EXECUTORS), default="local")
    parser.add_argument("--workers", type=int, default=1,
                        help="local executor: worker processes (default 1: this process; 0: one per core); the "
                             "result does not depend on it")
    parser.add_argument("--ray-address", help="existing Ray cluster (default: start a local Ray)")
    parser.add_argument("--ray-cpus", type=int, help="CPUs for a local Ray (default: all)")
    parser.add_argument("--budget-minutes", type=float, default=DEFAULT_BUDGET_MINUTES,
                        help=f"stop proposing after this long (default {DEFAULT_BUDGET_MINUTES:g}; 0: no budget)")
    parser.add_argument("--max-evals", type=int, help="stop after this many evaluated configurations")
    parser.add_argument("--batch", type=int, default=4, help="configurations proposed per round (default 4)")
    parser.add_argument("--max-scale", type=float, default=16.0, help="largest load multiple searched (default 16)")
    parser.add_argument("--growth", choices=tuple(GROWTHS), default="superpose",
                        help="how the load grows to a multiple of itself, for capacity and its verification: "
                             "superpose (default): more independent users, bursts overlap less; scale: the same "
                             "users sending more, every arrival rate multiplied, bursts kept")
    parser.add_argument("--screen", default="auto", type=_screen_arg,
                        help=f"rank candidates on this fraction of the load's time first, then simulate the best on "
                             f"all of it (default auto: none up to {SCREEN_ABOVE:,} requests, else "
                             f"~{SCREEN_REQUESTS:,}; 1: no screen)")
    parser.add_argument("--finalists", type=int, default=DEFAULT_FINALISTS,
                        help=f"screened candidates simulated on the whole load at a time (default {DEFAULT_FINALISTS})")
    parser.add_argument("--duration", type=float, help="override the load profile's duration (s)")
    parser.add_argument("--max-requests", type=int, default=adapters.MAX_REQUESTS,
                        help=f"refuse a load of more requests at scale 1 (default {adapters.MAX_REQUESTS:,})")
    parser.add_argument("--seed", type=int, help="load seed (default: the load profile's); also seeds the search")
    parser.add_argument("--verify-top", type=int, default=1, help="verify the best K on real Triton (0: skip)")
    parser.add_argument("--url", help="verify on an external Triton at this gRPC host:port instead of embedded")
    parser.add_argument("--out", default="results/tune", help="output folder (default results/tune)")
    parser.add_argument("--restart", action="store_true", help="discard an existing checkpoint instead of resuming")
    parser.add_argument("--client-cpu-us", type=float, default=0.0,
                        help="tune for a client costing this many µs more host CPU per request than the profile's "
                             "sender (as simulate --client-cpu-us; verification still measures through ours)")
    add_threads_option(parser)
    add_interval_options(parser, judged="the SLOs are judged at the upper end of each figure's interval over the "
                                        "replications: R simulations a probe")


def _screen_arg(text: str) -> str | float:
    try:
        return screen_asked(text if text == "auto" else float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {SCREEN_FORM}") from None


def options_from_args(args: argparse.Namespace) -> TuneOptions:
    models = tuple(m.strip() for m in (args.models or "").split(",") if m.strip())
    return TuneOptions(
        load=args.load, profile=args.profile, out=args.out, slos=args.slo, repo=args.repo, models=models,
        gpus=args.gpus, objective=args.objective,
        instances=parse_values(args.instances, "--instances", "values"),
        max_batch_sizes=parse_values(args.max_batch_sizes, "--max-batch-sizes", "values"),
        queue_delays_us=parse_values(args.queue_delays_us, "--queue-delays-us", "values"),
        preferred=parse_values(args.preferred, "--preferred", "values", str), generator=args.generator,
        executor=args.executor, workers=args.workers, ray_address=args.ray_address, ray_cpus=args.ray_cpus,
        budget_minutes=args.budget_minutes, max_evals=args.max_evals, batch=args.batch, seed=args.seed,
        max_scale=args.max_scale, growth=args.growth, screen=args.screen, finalists=args.finalists,
        duration_s=args.duration, verify_top=args.verify_top, url=args.url, restart=args.restart,
        client_cpu_us=args.client_cpu_us, threads_per_instance=args.threads_per_instance,
        max_requests=args.max_requests, replications=args.replications, confidence=args.confidence,
        host_spread=args.host_spread, variants=args.variants, memory_gb=args.memory_gb)


def main(args: argparse.Namespace) -> int:
    opts = options_from_args(args)
    try:
        doc = run_tune(opts)
    except KeyboardInterrupt:
        print(f"interrupted: observations so far are in {Path(opts.out) / 'observations.jsonl'}; run the same "
              "command again to resume", file=sys.stderr)
        raise
    return 0 if doc["satisfiable"] else 1

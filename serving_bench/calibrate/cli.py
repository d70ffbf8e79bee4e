"""``serving-bench profile``: measure a simulator profile on real Triton, or import one measured elsewhere.

    serving-bench profile --repo model_repo/ --models sleep_python,tiny_cnn_onnxruntime --out p.json
        [--batch-sizes 1,2,4,8] [--calibrate 2] [--law pool_eff] [--colocation 1,2,4] [--colocation-batches 1,8]
        [--no-pairs] [--no-resources] [--rounds 3]
        [--seconds 2] [--threads N] [--url host:8001] [--trace] [--cuda-graphs all|1,2,4]
    serving-bench profile --csv timings.csv --model resnet50_onnxruntime --device gpu0 --out p.json
    serving-bench profile --import-h200 --out h200.json      # the bundled H200 torch-eager table
"""

from __future__ import annotations

import argparse
from pathlib import Path

from serving_bench.calibrate.measure import measure_profile
from serving_bench.calibrate.plan import DEFAULT_CALIBRATION, DEFAULT_LAW, LAW_CHOICES, MeasureConfig
from serving_bench.errors import InputError, require_count
from serving_bench.files import hold_file, rescue_folder
from serving_bench.profiles import importers
from serving_bench.profiles.law import GPU_LAW


def _ints(text: str, option: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise InputError(option, None, f"expected comma-separated integers >= 1, got {text!r}")
    return values


def configure(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--repo", help="model repository to measure on the embedded (or --url) Triton")
    what.add_argument("--csv", help="import a CSV of batch size and latency measured elsewhere")
    what.add_argument("--import-h200", action="store_true", help="import the bundled H200 torch-eager table")
    parser.add_argument("--out", required=True, help="profile JSON to write")
    parser.add_argument("--models", help="comma-separated entries to measure (with --repo); a variant's entry "
                                         "(resnet50_onnxruntime_int8) is recorded with its variant id; an ensemble: "
                                         "its members, and it alone for its own time beyond theirs")
    parser.add_argument("--batch-sizes", help="batch sizes to measure (default 1, 2, 4, ... max_batch_size)")
    parser.add_argument("--calibrate", type=int, default=DEFAULT_CALIBRATION,
                        help="instances per model in the co-located runs the device's sharing law is fitted to "
                             f"(default {DEFAULT_CALIBRATION}; 0: none)")
    parser.add_argument("--law", choices=LAW_CHOICES,
                        help=f"the sharing law to fit (default {DEFAULT_LAW} on a CPU host, {GPU_LAW} on a GPU; "
                             "see docs/sim.md)")
    parser.add_argument("--colocation", default="",
                        help="instance counts for measured override curves S(k), e.g. 1,2,4 (default: none)")
    parser.add_argument("--colocation-batches",
                        help="batch sizes of the co-location curves (default: 1 and the largest measured)")
    parser.add_argument("--no-pairs", action="store_true", help="skip the curves of model pairs on one device")
    parser.add_argument("--no-resources", action="store_true",
                        help="skip the memory per instance and energy (or CPU-seconds) per request of each entry")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per co-location point")
    parser.add_argument("--seconds", type=float, default=2.0, help="closed-loop seconds per measured point")
    parser.add_argument("--threads", type=int,
                        help="threads per instance on the embedded server (default: what the served config gets)")
    parser.add_argument("--url", help="an external Triton's gRPC host:port instead of the embedded server (started "
                        "with --model-control-mode=explicit, its models are reloaded with each phase's instances)")
    parser.add_argument("--cuda-graphs", help="serve TorchScript entries on GPU instances with CUDA graphs (all, or "
                        "batch sizes 1,2,4: batches are padded to them) and profile them at those sizes")
    parser.add_argument("--trace", action="store_true",
                        help="server-side times from Triton's request trace instead of the runners' execution logs "
                             "(off by default: the bundled tritonserver 2.51 can abort under tracing, docs/serve.md)")
    parser.add_argument("--model", help="(--csv) entry name when the CSV has no model column")
    parser.add_argument("--device", default="gpu0", help="(--csv) device name: cpu or gpuN")
    parser.add_argument("--cores", type=int, help="(--csv, cpu) core count")
    parser.add_argument("--execution-mode", default="n/a", help="(--csv) eager, cuda_graphs, compiled, tensorrt")


def main(args: argparse.Namespace) -> int:
    """Measure or import the profile and write it to ``--out``, held before any work (:func:`hold_file`); a write
    that fails after measuring keeps the profile elsewhere and names it (:class:`OutputError`, exit 4)."""
    measured = None if args.import_h200 or args.csv else _measure_config(args)
    with hold_file(args.out):
        if args.import_h200:
            profile = importers.import_h200_eager()
        elif args.csv:
            profile = importers.import_csv(args.csv, importers.CsvImport(model=args.model, device=args.device,
                                                                         cores=args.cores,
                                                                         execution_mode=args.execution_mode))
        else:
            models, config = measured
            profile = measure_profile(args.repo, models, None, config, log=print)
        try:
            profile.save(args.out)
        except OSError as err:
            name = Path(args.out).name
            raise rescue_folder(args.out, err, lambda folder: profile.save(folder / name)) from None
    names = ", ".join(sorted(profile.models))
    print(f"wrote {args.out}: {len(profile.models)} models ({names}) on {', '.join(sorted(profile.devices))}")
    for note in profile.notes:
        print(f"note: {note}")
    return 0


def _measure_config(args: argparse.Namespace) -> tuple[list[str], MeasureConfig]:
    """``--repo``'s entries to measure and the measurement's options, checked."""
    if not args.models:
        raise InputError("--models", None, "expected the comma-separated entries to measure")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    sizes = _ints(args.batch_sizes, "--batch-sizes") if args.batch_sizes else None
    require_count("--threads", args.threads)
    return models, MeasureConfig(
        batch_sizes=sizes, colocation=_ints(args.colocation, "--colocation") if args.colocation else (),
        calibrate=args.calibrate, law=args.law,
        colocation_batches=_ints(args.colocation_batches, "--colocation-batches") if args.colocation_batches else None,
        pairs=not args.no_pairs, rounds=args.rounds, seconds=args.seconds, threads=args.threads, url=args.url,
        trace=args.trace, cuda_graphs=args.cuda_graphs, resources=not args.no_resources)

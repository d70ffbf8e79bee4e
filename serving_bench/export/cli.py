"""``serving-bench export``: zoo models -> a Triton model repository (see ``docs/export.md``)."""

from __future__ import annotations

import argparse
import time

from serving_bench.errors import InputError
from serving_bench.export.api import STATUSES, export_models
from serving_bench.export.frameworks import FRAMEWORKS, ExportOptions
from serving_bench.models import MODELS


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="",
                        help=f"comma-separated zoo models: {', '.join(MODELS)} (may be omitted with --ensemble)")
    parser.add_argument("--frameworks", default=None,
                        help=f"comma-separated frameworks, each at its default settings (default: all): "
                             f"{', '.join(FRAMEWORKS)}")
    parser.add_argument("--variants", default=None, metavar="LIST",
                        help="instead of --frameworks: variants, framework[:setting,...] each, e.g. "
                             "'onnxruntime,onnxruntime:int8,onnxruntime:opt=basic,intra=2,tvm:trials=64'; or 'auto' "
                             "(docs/export.md, Variants)")
    parser.add_argument("--repo", default="model_repo", help="model repository folder (default: model_repo)")
    parser.add_argument("--max-batch-size", type=int, default=32, help="largest batch; the batch axis is dynamic "
                                                                        "over 1..max (default 32)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "fp16"],
                        help="float precision of --frameworks entries (fp32)")
    parser.add_argument("--instances", type=int, default=1, help="instance count in instance_group (default 1)")
    parser.add_argument("--overwrite", action="store_true", help="replace existing entries")
    parser.add_argument("--ensemble", action="append", default=[], metavar="NAME=ENTRY,ENTRY",
                        help="an ensemble averaging the named entries' outputs (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and parity inputs (default 0)")
    parser.add_argument("--seq-len", type=int, default=None, help="bert_base sequence length (default 128)")
    parser.add_argument("--tvm-tune-trials", type=int, default=0,
                        help="MetaSchedule trials for TVM (0 = untuned, the default; records are cached)")
    parser.add_argument("--tvm-buckets", default="", metavar="1,8,32",
                        help="static batch sizes TVM tuning compiles and tunes (default: powers of two up to the "
                             "maximum; the maximum is always added)")
    parser.add_argument("--sleep-base-ms", type=float, default=5.0, help="sleep model: time per batch (ms)")
    parser.add_argument("--sleep-per-item-ms", type=float, default=1.0, help="sleep model: time per item (ms)")


def main(args: argparse.Namespace) -> int:
    try:
        tvm_buckets = [int(b) for b in args.tvm_buckets.split(",") if b.strip()]
    except ValueError:
        raise InputError("--tvm-buckets", args.tvm_buckets, "expected comma-separated batch sizes") from None
    start = time.perf_counter()
    frameworks = args.frameworks if args.frameworks is not None or args.variants else ",".join(FRAMEWORKS)
    records = export_models(args.models, frameworks or "", args.repo,
                            options=ExportOptions(max_batch_size=args.max_batch_size, precision=args.precision,
                                                  instances=args.instances, seed=args.seed,
                                                  tvm_tune_trials=args.tvm_tune_trials, tvm_buckets=tvm_buckets,
                                                  seq_len=args.seq_len, sleep_base_ms=args.sleep_base_ms,
                                                  sleep_per_item_ms=args.sleep_per_item_ms),
                            variants=args.variants, overwrite=args.overwrite, ensembles=args.ensemble,
                            log=lambda line: print(line, flush=True))
    counts = {s: sum(r["status"] == s for r in records) for s in STATUSES}
    print(f"{args.repo}: {counts['exported']} exported, {counts['skipped']} skipped, "
          + (f"{counts['rejected']} rejected by the int8 gate, " if counts["rejected"] else "")
          + f"{counts['failed']} failed in {time.perf_counter() - start:.1f} s")
    return 1 if counts["failed"] else 0

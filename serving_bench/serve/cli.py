"""``serving-bench serve <repo>``: the real tritonserver on 127.0.0.1 until Ctrl-C or SIGTERM.

    serving-bench serve model_repo/ --models tiny_cnn_onnxruntime --instances tiny_cnn_onnxruntime=2

Prints the endpoints, the served models with their instance counts, and a ``curl`` line for the readiness probe;
then watches the server until a signal (clean stop, exit 0) or its death (exit 3, naming the log). While it runs, its
endpoints are announced in the cache folder (:mod:`serving_bench.serve.announce`), so ``replay --url`` and the other
``--url`` commands find its metrics and HTTP ports from the gRPC address alone. With ``--url`` it starts nothing: it
checks the external server, prints the same facts and exits.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from serving_bench.interrupts import raise_on_signal
from serving_bench.serve.announce import announce, withdraw
from serving_bench.serve.control import Control
from serving_bench.serve.endpoints import LOOPBACK
from serving_bench.serve.server import ServerOptions, TritonServer, connect
from serving_bench.serving_config import add_threads_option, parse_instances, queue_policy_settings

POLL_S = 0.5


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("repo", nargs="?", default="model_repo", help="model repository (default: model_repo)")
    parser.add_argument("--models", help="comma-separated entries to serve (default: all; ensembles bring members)")
    parser.add_argument("--instances", help="instance counts per entry, MODEL=N,... (overrides the configs)")
    add_threads_option(parser)
    parser.add_argument("--cuda-graphs", metavar="SIZES",
                        help="TorchScript on KIND_GPU: CUDA graphs for 'all' batch sizes or e.g. '1,2,4,8'")
    for name in ("http", "grpc", "metrics"):
        parser.add_argument(f"--{name}-port", type=int, help=f"{name} port (default: a free one)")
    parser.add_argument("--host", default=LOOPBACK, help="address to bind (default: 127.0.0.1, this machine only)")
    parser.add_argument("--log", help="write the server log here (default: a temporary file, kept on failure)")
    parser.add_argument("--startup-timeout", type=float, default=300.0, help="seconds to wait for readiness")
    parser.add_argument("--url", help="an external Triton server's gRPC host:port: check it and print its endpoints")


class _Stop(BaseException):
    """Raised in the main thread by the first SIGINT/SIGTERM; later signals are ignored until we have stopped."""


def _models_table(server, endpoints) -> list[str]:
    lines = []
    with Control(endpoints.grpc_url) as control:
        for name in server.served_models:
            config = control.model_config(name)
            count = sum(int(g.count or 1) for g in config.instance_group)
            kind = config.platform or config.backend
            original = config.parameters["original_platform"].string_value \
                if "original_platform" in config.parameters else ""
            runner = f" (runs {original} in the python backend)" if original else ""
            policy = queue_policy_settings(config)
            stall = f"; queue policy ({', '.join(policy)}): the batcher stalls under load, see docs/serve.md" \
                if policy else ""
            lines.append(f"  {name}: {kind}{runner}, max_batch_size {config.max_batch_size}, "
                         f"{count or '-'} instance(s){stall}")
    return lines


def _print_facts(server) -> None:
    endpoints = server.endpoints
    host, port = endpoints.http_url.rsplit(":", 1)
    probe_host = LOOPBACK if host in ("0.0.0.0", "::") else host
    print(f"HTTP    http://{endpoints.http_url}{endpoints.guess_note('http')}")
    print(f"gRPC    {endpoints.grpc_url}")
    print(f"metrics http://{endpoints.metrics_url}/metrics{endpoints.guess_note('metrics')}")
    if server.log_path:
        print(f"log     {server.log_path}")
    print("models:")
    for line in _models_table(server, endpoints):
        print(line)
    print(f"ready?  curl -s -o /dev/null -w '%{{http_code}}\\n' http://{probe_host}:{port}/v2/health/ready")
    sys.stdout.flush()


def main(args: argparse.Namespace) -> int:
    models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None
    instances = parse_instances(args.instances) if args.instances else None
    if args.host != LOOPBACK and not args.url:
        print(f"warning: binding {args.host}: the server (no authentication) is reachable from other machines",
              file=sys.stderr)
    server = connect(args.repo, url=args.url, models=models, instances=instances,
                     threads_per_instance=args.threads_per_instance, cuda_graphs=args.cuda_graphs,
                     options=ServerOptions(host=args.host, http_port=args.http_port, grpc_port=args.grpc_port,
                                           metrics_port=args.metrics_port, log_path=args.log,
                                           startup_timeout_s=args.startup_timeout))
    if not isinstance(server, TritonServer):  # --url: check the external server, print its facts, exit
        with server:
            _print_facts(server)
        return 0
    with raise_on_signal((signal.SIGINT, signal.SIGTERM), _Stop):
        try:
            with server:
                print(f"tritonserver ready (pid {server.pid}); Ctrl-C or SIGTERM stops it")
                endpoints = server.endpoints
                told = announce(endpoints.grpc_url, endpoints.http_url, endpoints.metrics_url, server.pid)
                try:
                    _print_facts(server)
                    while True:
                        server.check_alive()  # a dead server ends the command with its log named (exit 3)
                        threading.Event().wait(POLL_S)
                finally:
                    withdraw(told)
        except _Stop as stop:
            print(f"{stop.args[0]}: stopped tritonserver; nothing left running", file=sys.stderr)
            return 0

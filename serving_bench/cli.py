"""``serving-bench`` entry point: one subcommand per stage of the data flow.

Each subcommand lives in the package that does the work, as a module with ``configure(parser)`` and
``main(args) -> int``, imported only when that subcommand runs (or shows its help): ``serving-bench --help`` lists the
commands from :data:`COMMANDS` without importing any of them, so it stays fast however much a command imports.
Bad input (:class:`InputError`) prints one line and exits 2; a server failure exits 3; results that could not be
written although their folder was checked before the run (:class:`OutputError`: the disk filled, the folder was
removed or made read-only meanwhile) print one line saying where what was measured went, and exit 4; Ctrl-C or
SIGTERM exits 130, after the command has unwound (its servers stopped, its worker pools shut down:
:func:`interrupts.sigterm_unwinds`). Warnings print as one line each, without the source line that raised them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

from serving_bench.errors import InputError, OutputError, ServerError
from serving_bench.interrupts import Terminated, sigterm_unwinds

# subcommand -> (module, one-line help). Order is the data flow.
COMMANDS = {
    "export": ("serving_bench.export.cli", "export zoo models to a Triton model repository"),
    "check-repo": ("serving_bench.export.check", "check every entry of a model repository"),
    "serve": ("serving_bench.serve.cli", "serve a repository on real tritonserver (127.0.0.1)"),
    "replay": ("serving_bench.load.cli", "replay a load profile or trace against Triton"),
    "profile": ("serving_bench.calibrate.cli", "measure a simulator profile on real Triton"),
    "simulate": ("serving_bench.sim.cli", "run a load profile through the calibrated simulator"),
    "validate": ("serving_bench.validate", "same schedule on Triton and in the simulator; error table"),
    "tune": ("serving_bench.tune.cli", "search instance counts and batching on the simulator; verify on Triton"),
    "plan": ("serving_bench.tune.plan", "fewest GPUs meeting the SLOs for forecast growth"),
    "report": ("serving_bench.report.cli", "write the HTML report for results folders"),
    "demo": ("serving_bench.demo", "the main job end to end on the embedded default"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; only the module of subcommand ``only`` is imported (none when ``only`` is None: the
    top-level help lists the commands)."""
    parser = argparse.ArgumentParser(prog="serving-bench", description="Export, serve, replay, measure and simulate DNN inference on real Triton.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        if only == name:
            module = importlib.import_module(module_name)
            module.configure(cmd)
            cmd.set_defaults(_main=module.main)
    return parser


def one_line_warning(message, category, filename, lineno, line=None) -> str:
    """``warning: <message>``: what a user needs, without the Python source line :mod:`warnings` adds."""
    return f"warning: {' '.join(str(message).split())}\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    only = argv[0] if argv and argv[0] in COMMANDS else None
    parser = build_parser(only)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    saved, warnings.formatwarning = warnings.formatwarning, one_line_warning
    try:
        with sigterm_unwinds():
            return int(args._main(args) or 0)
    except InputError as err:
        print(f"error: {err.line()}", file=sys.stderr)
        return 2
    except ServerError as err:
        print(f"server error: {err}", file=sys.stderr)
        return 3
    except OutputError as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 4
    except KeyboardInterrupt as err:
        print("interrupted (SIGTERM)" if isinstance(err, Terminated) else "interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.formatwarning = saved


if __name__ == "__main__":
    sys.exit(main())

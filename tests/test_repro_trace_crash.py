"""``scripts/diagnostics/repro_trace_crash.py``: its reading of a dead server's log (against the real bundled binary's
symbols). The script is a one-off diagnostic (scripts/diagnostics/README.md): its tries on the real server are not
part of the suite."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "diagnostics" / "repro_trace_crash.py"

# The end of a server log from a traced run of the script (2026-12-01): Triton's own dump after SIGSEGV.
DEAD_LOG = """\
I1201 00:54:28.930871 31113 http_server.cc:362] "Started Metrics Service at 127.0.0.1:54777"
Signal (11) received.
 0# 0x000056512B62A52D in /x/site-packages/pytriton/tritonserver/bin/tritonserver
 1# 0x00007FBDDC45A050 in /lib/x86_64-linux-gnu/libc.so.6
 2# 0x00007FBDDC4A3E06 in /lib/x86_64-linux-gnu/libc.so.6
 3# 0x000056512B7B38FB in /x/site-packages/pytriton/tritonserver/bin/tritonserver
 4# 0x00007FBDDCE51CF1 in /x/site-packages/nvidia_pytriton.libs/libtritonserver-717102f0.so
 5# TRITONBACKEND_RequestRelease in /x/site-packages/nvidia_pytriton.libs/libtritonserver-717102f0.so
 6# TRITONBACKEND_ModelInstanceExecute in /root/.cache/serving-bench/backends/py3.11/python/libtriton_python.so
"""


def _load_script():
    spec = importlib.util.spec_from_file_location("repro_trace_crash", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_crash_site_names_the_server_frames():
    from serving_bench.serve.install import find_tritonserver

    script = _load_script()
    symbols = script.Symbols(find_tritonserver().server_bin)
    if not symbols.starts:
        pytest.skip("nm (binutils) is not installed")
    site = script.crash_site(DEAD_LOG, symbols=symbols)
    assert site[0] == "Signal (11) received."
    assert any("TraceManager::TraceRelease" in line for line in site), site  # the frame after the libc ones
    assert site[-1].startswith("#6 TRITONBACKEND_ModelInstanceExecute")
    fatal = "tritonserver: tpp.c:86: __pthread_tpp_change_priority: Assertion `previous_prio == -1' failed.\n"
    assert script.crash_site("log line\n" + fatal + "Signal (6) received.\n", symbols=symbols)[:2] == [
        fatal.strip(), "Signal (6) received."]
    assert script.crash_site("nothing fatal here\n", symbols=symbols) == []

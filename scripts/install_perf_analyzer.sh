#!/usr/bin/env bash
# Install the real perf_analyzer 2.50 (the C++ binary shipped inside the tritonclient==2.50.0 wheel) into the venv.
# Idempotent: does nothing when `perf_analyzer --version` already works. Needs PyPI access, and Debian's libb64-0d
# (installed by scripts/install_system_packages.sh where it can; exit 1 naming the command where it cannot).
# Newer tritonclient wheels need glibc >= 2.38; 2.50.0 runs on Debian 12's 2.36.
set -euo pipefail
VENV="${VENV:-$(cd "$(dirname "$0")/.." && pwd)/.venv}"
PY="$VENV/bin/python"
BIN="$VENV/bin/perf_analyzer"

works() { "$PY" -m serving_bench.peers.perf_analyzer --check >/dev/null 2>&1; }
if works; then echo "perf_analyzer already installed: $("$PY" -m serving_bench.peers.perf_analyzer --check)"; exit 0; fi

if ! /sbin/ldconfig -p 2>/dev/null | grep -q 'libb64.so.0d'; then
  "$(dirname "$0")/install_system_packages.sh" --strict perf_analyzer || exit 1  # it says what to run
fi
# the wheel's data/bin/perf_analyzer lands in the venv's bin; the CUDA runtime library comes from PyPI (no GPU needed)
"$PY" -m pip install --quiet "tritonclient[grpc,http]==2.50.0"
"$PY" -m pip install --quiet "nvidia-cuda-runtime-cu12==12.9.79"
if [ ! -x "$BIN" ]; then
  WHEEL_DIR="$(mktemp -d)"; trap 'rm -rf "$WHEEL_DIR"' EXIT
  "$PY" -m pip download --quiet --no-deps "tritonclient==2.50.0" -d "$WHEEL_DIR"
  "$PY" - "$WHEEL_DIR" "$BIN" <<'PYEOF'
import sys, zipfile, pathlib, os
wheel = next(pathlib.Path(sys.argv[1]).glob("tritonclient-2.50.0-*.whl"))
with zipfile.ZipFile(wheel) as zf:
    data = zf.read("tritonclient-2.50.0.data/data/bin/perf_analyzer")
out = pathlib.Path(sys.argv[2]); tmp = out.with_suffix(".tmp"); tmp.write_bytes(data); os.chmod(tmp, 0o755); tmp.replace(out)
PYEOF
fi
works || { "$PY" -m serving_bench.peers.perf_analyzer --check; exit 1; }
echo "perf_analyzer installed: $("$PY" -m serving_bench.peers.perf_analyzer --check)"

#!/usr/bin/env bash
# Run every GPU check in one go (scripts/gpu_check.py; docs/serve.md#gpu-check), in under 8 minutes.
#
#   scripts/gpu_check.sh [--wheels DIR] [--python PY] [--setup-only] [--cpu] [--quick] [--out DIR] [--url HOST:PORT]
#
# Where it runs: a GPU host whose python3 (3.12) has torch with CUDA but no tritonclient or pytriton, and no network.
# The wheels come along in DIR (default .cache/gpu-wheels, filled by scripts/gpu_wheels.sh where PyPI is reachable);
# they are installed into .cache/gpu-check-venv, a venv over the system site-packages (so the host's torch is used),
# with pip --no-index: nothing is downloaded. Where the chosen Python already has everything (this repository's .venv)
# no venv is made. With no GPU (or --cpu) the reduced CPU plan runs: tiny models on CPU instances, no GPU figures.
# Results: benchmarks/results/gpu_check_<date>_<machine>.{json,md}.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
WHEELS="${GPU_CHECK_WHEELS:-$REPO/.cache/gpu-wheels}"
VENV="$REPO/.cache/gpu-check-venv"
PY=""
SETUP_ONLY=0
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS="$2"; shift 2 ;;
    --python) PY="$2"; shift 2 ;;
    --setup-only) SETUP_ONLY=1; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done

# module to import -> wheel (distribution) that provides it; installed only where the import fails
NEEDED="packaging:packaging tritonclient.grpc:tritonclient==2.50.0 rapidjson:python-rapidjson pandas:pandas
dateutil:python-dateutil pytz:pytz six:six psutil:psutil simpy:simpy"

has_all() {  # the interpreter $1 imports everything the check needs (pytriton located without importing it); else
             # it prints what is missing
  "$1" - <<'EOF'
import importlib.util, sys
mods = ["torch", "numpy", "grpc", "google.protobuf", "tritonclient.grpc", "rapidjson", "pandas", "psutil", "simpy",
        "prometheus_client", "yaml", "scipy", "pyarrow"]
missing = [m for m in mods if importlib.util.find_spec(m.split(".")[0]) is None]
if importlib.util.find_spec("pytriton") is None:
    missing.append("pytriton")
if not missing:
    import numpy, tritonclient.grpc, pandas  # noqa: F401  (really importable, not just present)
    if int(numpy.__version__.split(".")[0]) >= 2:
        missing.append("numpy<2")  # the bundled python backend returns empty output tensors with numpy 2
if missing:
    print(f"{sys.executable}: missing {', '.join(missing)}")
sys.exit(1 if missing else 0)
EOF
}

if [ -z "$PY" ]; then
  if [ -x "$REPO/.venv/bin/python" ] && has_all "$REPO/.venv/bin/python" >/dev/null 2>&1; then PY="$REPO/.venv/bin/python"
  else PY="$(command -v python3)"; fi
fi

if ! has_all "$PY" >/dev/null 2>&1; then
  if [ ! -d "$WHEELS" ]; then
    echo "error: $PY lacks tritonclient/pytriton and the wheel folder $WHEELS does not exist:" \
         "run scripts/gpu_wheels.sh where PyPI is reachable and bring the folder (or pass --wheels DIR)" >&2
    exit 2
  fi
  if [ ! -x "$VENV/bin/python" ]; then
    echo "making $VENV over $PY's site-packages"
    "$PY" -m venv --system-site-packages --without-pip "$VENV"  # no ensurepip needed: $PY's pip installs (below)
    # where $PY is itself a venv (the GPU host's python3 is /opt/torch/.venv/bin/python3), --system-site-packages
    # reaches the base interpreter's packages, not that venv's torch: a .pth file adds $PY's own site folders after
    # this venv's (so numpy<2 installed here still comes first); the stubs read it too, as they start from this venv
    "$PY" -c 'import site; print("\n".join(site.getsitepackages()))' \
      > "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/host-site-packages.pth"
  fi
  SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  PIP=("$PY" -m pip install --quiet --no-index --find-links "$WHEELS" --disable-pip-version-check --target "$SITE")
  # numpy<2 shadows the host's numpy 2 in this venv: the python backend of Triton 2.51 needs it in the stub (with
  # numpy 2 an output tensor arrives with its shape and no bytes); torch works with either
  if ! "$VENV/bin/python" -c "import numpy, sys; sys.exit(int(numpy.__version__.split('.')[0]) >= 2)" 2>/dev/null; then
    echo "installing numpy==1.26.4 from $WHEELS"
    "${PIP[@]}" --no-deps "numpy==1.26.4"
  fi
  "${PIP[@]}" --no-deps "nvidia-pytriton==0.7.0"
  for pair in $NEEDED; do
    module="${pair%%:*}"; dist="${pair#*:}"
    if ! "$VENV/bin/python" -c "import $module" 2>/dev/null; then
      echo "installing $dist from $WHEELS"
      "${PIP[@]}" --no-deps "$dist" || { echo "error: this host lacks $module and $WHEELS has no wheel of $dist:" \
        "fill the folder with scripts/gpu_wheels.sh --all where PyPI is reachable" >&2; exit 2; }
    fi
  done
  PY="$VENV/bin/python"
  has_all "$PY" >&2 || { echo "error: $PY cannot import everything the check needs (above)" >&2; exit 2; }
fi
echo "python: $PY ($("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)'))"
[ "$SETUP_ONLY" = 1 ] && exit 0

export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export SERVING_BENCH_CACHE="${SERVING_BENCH_CACHE:-$REPO/.cache/serving-bench}"
# the simulator's compiled engine is built by make, not on a GPU host that only runs this check: there, its source
"$PY" -c "import serving_bench.sim.core" 2>/dev/null || export SERVING_BENCH_SIM_PURE=1
cd "$REPO"
exec timeout --signal=INT --kill-after=20 480 "$PY" "$REPO/scripts/gpu_check.py" "${ARGS[@]}"

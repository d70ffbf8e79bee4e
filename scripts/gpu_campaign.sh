#!/usr/bin/env bash
# The GPU campaign (scripts/gpu_campaign.py; docs/gpu.md "The GPU campaign"): on one lent GPU, in under 8 minutes with
# no network, measure the dataset the GPU interference model is judged on and save it under
# OUT/<date>_<gpu>/ (dataset.json, raw.npz, dataset.md, campaign.log; default OUT: benchmarks/results/gpu).
#
#   scripts/gpu_campaign.sh [--wheels DIR] [--python PY] [--cpu] [--out OUT] [--budget-s S]
#
# Python as scripts/gpu_check.sh prepares it (its --setup-only: the host's python3 with the wheels of
# scripts/gpu_wheels.sh installed into .cache/gpu-check-venv, nothing downloaded; or a Python that has everything).
# --cpu (or no GPU): the CPU plan, tiny models and short windows, the same steps (a check, no GPU figures).
#
# The next session with a lent GPU runs it FIRST, before any other device work (docs/gpu.md "The GPU campaign"):
#   here:        scripts/gpu_wheels.sh                      # where PyPI is reachable: .cache/gpu-wheels, ~51 MB
#   device tool: run(command="scripts/gpu_campaign.sh --out $OUT", carry=[".cache/gpu-wheels"], timeout_s=540)
#   here:        cp -r <files_at>/<date>_<gpu> benchmarks/results/gpu/
#                .venv/bin/python benchmarks/gpu_fidelity.py      # then commit the dataset and the evaluation
# (budget: the machine's start, ~1-2 min, plus at most 8 min here, inside the session's 15 minutes of device time;
# give the machine back at once afterwards: there is no time for a second full run. What travels must stay under
# 64 MiB: git ls-files -z | xargs -0 du -cb | tail -1, plus du -sb .cache/gpu-wheels.)
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
SETUP=()
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels|--python) SETUP+=("$1" "$2"); shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done

# the Python that has everything (gpu_check.sh says which on its last "python: PATH (...)" line)
PY="$(bash "$REPO/scripts/gpu_check.sh" --setup-only ${SETUP[@]+"${SETUP[@]}"} | tee /dev/stderr \
      | sed -n 's/^python: \([^ ]*\) (.*/\1/p' | tail -n 1)"
[ -n "$PY" ] || { echo "error: scripts/gpu_check.sh --setup-only named no Python" >&2; exit 2; }

export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export SERVING_BENCH_CACHE="${SERVING_BENCH_CACHE:-$REPO/.cache/serving-bench}"
# the open-loop schedule comes from the simulator's package; without its compiled engine, its source runs
"$PY" -c "import serving_bench.sim.core" 2>/dev/null || export SERVING_BENCH_SIM_PURE=1
cd "$REPO"
# the driver stops starting steps after --budget-s (400 s by default); this is the hard stop behind it
exec timeout --signal=INT --kill-after=20 450 "$PY" "$REPO/scripts/gpu_campaign.py" ${ARGS[@]+"${ARGS[@]}"}

#!/usr/bin/env bash
# The GPU campaign (scripts/gpu_campaign.py; docs/gpu.md "The GPU campaign"): on one lent GPU, in under 8 minutes with
# no network, measure the dataset the GPU interference model is judged on and save it under
# OUT/<date>_<gpu>/ (dataset.json, raw.npz, dataset.md, campaign.log; default OUT: benchmarks/results/gpu).
#
#   scripts/gpu_campaign.sh [--wheels DIR] [--python PY] [--cpu] [--out OUT] [--budget-s S]
#   scripts/gpu_campaign.sh --size [--wheels DIR]    # what a device run would carry, against its 64 MiB
#
# Python as scripts/gpu_check.sh prepares it (its --setup-only: the host's python3 with the wheels of
# scripts/gpu_wheels.sh installed into .cache/gpu-check-venv, nothing downloaded; or a Python that has everything).
# --cpu (or no GPU): the CPU plan, tiny models and short windows, the same steps (a check, no GPU figures; ~45 s).
# The whole command, setup included, ends within GPU_CAMPAIGN_TOTAL_S seconds (470 by default).
#
# The next session with a lent GPU runs it FIRST, before any other device work (docs/gpu.md "The GPU campaign"):
#   here:        scripts/gpu_wheels.sh && scripts/gpu_campaign.sh --size    # PyPI reachable; ~40 MB of wheels
#   device tool: run(command="scripts/gpu_campaign.sh --out $OUT", carry=[".cache/gpu-wheels"], timeout_s=500)
#   here:        cp -r <files_at>/<date>_<gpu> benchmarks/results/gpu/
#                .venv/bin/python benchmarks/gpu_fidelity.py      # then commit the dataset and the evaluation
# (device time: the machine's start, ~1-2 min, plus at most 8 min here, inside the session's 15 minutes; give the
# machine back at once afterwards: there is no time for a second full run.)
set -euo pipefail
SECONDS=0
TOTAL_S="${GPU_CAMPAIGN_TOTAL_S:-470}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
SETUP=()
ARGS=()
WHEELS="$REPO/.cache/gpu-wheels"
SIZE_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) SETUP+=("$1" "$2"); WHEELS="$2"; shift 2 ;;
    --python) SETUP+=("$1" "$2"); shift 2 ;;
    --size) SIZE_ONLY=1; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done

if [ "$SIZE_ONLY" = 1 ]; then
  # what a device run carries from this checkout (the device tool's limit, 64 MiB = 67,108,864 bytes): the tracked
  # and untracked-not-ignored files, a shared/ folder inside the checkout, and the carried wheel folder
  bytes() { xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}'; }
  TREE=$(git -C "$REPO" ls-files -z --cached --others --exclude-standard | (cd "$REPO" && bytes))
  SHARED=0
  if [ -d "$REPO/shared" ] && git -C "$REPO" check-ignore -q shared; then
    SHARED=$(find "$REPO/shared" -type f -print0 | bytes)
  fi
  WHL=0
  [ -d "$WHEELS" ] && WHL=$(find "$WHEELS" -type f -print0 | bytes)
  TOTAL=$((TREE + SHARED + WHL))
  LIMIT=67108864
  awk -v t="$TREE" -v s="$SHARED" -v w="$WHL" -v a="$TOTAL" -v l="$LIMIT" 'BEGIN {printf "a device run carries " \
    "%.1f MB of %.1f MB: the tree %.1f MB, shared/ %.1f MB, the wheels %.1f MB (%.1f MB to spare)\n", a / 1e6, \
    l / 1e6, t / 1e6, s / 1e6, w / 1e6, (l - a) / 1e6}'
  [ "$WHL" -gt 0 ] || echo "no wheel folder at $WHEELS: scripts/gpu_wheels.sh fills it where PyPI is reachable"
  [ "$TOTAL" -le "$LIMIT" ] || { echo "error: over the device run's 64 MiB: the call would be refused" >&2; exit 1; }
  exit 0
fi

# the Python that has everything (gpu_check.sh says which on its last "python: PATH (...)" line)
PY="$(bash "$REPO/scripts/gpu_check.sh" --setup-only ${SETUP[@]+"${SETUP[@]}"} | tee /dev/stderr \
      | sed -n 's/^python: \([^ ]*\) (.*/\1/p' | tail -n 1)"
[ -n "$PY" ] || { echo "error: scripts/gpu_check.sh --setup-only named no Python" >&2; exit 2; }

export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export SERVING_BENCH_CACHE="${SERVING_BENCH_CACHE:-$REPO/.cache/serving-bench}"
# the open-loop schedule comes from the simulator's package; without its compiled engine, its source runs
"$PY" -c "import serving_bench.sim.core" 2>/dev/null || export SERVING_BENCH_SIM_PURE=1
cd "$REPO"
# The whole command, setup included, ends within TOTAL_S (470 s: a device run's 8 minutes with room to spare). The
# driver starts no step that would end after its budget (what is left less 60 s, at most 400 s; a --budget-s given
# overrides it); the hard stop behind it interrupts the driver 10 s before the end, which saves what it measured.
LEFT=$((TOTAL_S - SECONDS))
BUDGET=$((LEFT - 60 < 400 ? LEFT - 60 : 400))
[ "$BUDGET" -gt 30 ] || { echo "error: the setup left ${LEFT} s of ${TOTAL_S} s: no time to measure" >&2; exit 2; }
echo "gpu_campaign.sh: setup took ${SECONDS} s; budget ${BUDGET} s (unless --budget-s says otherwise)," \
     "hard stop in $((LEFT - 10)) s"
exec timeout --signal=INT --kill-after=5 $((LEFT - 10)) "$PY" "$REPO/scripts/gpu_campaign.py" --budget-s "$BUDGET" \
  ${ARGS[@]+"${ARGS[@]}"}

#!/usr/bin/env bash
# Soak the main job: `scripts/soak.sh N [OUT.json]` runs `make demo` N times in a row, each on a fresh clone of this
# repository's HEAD (its own ./.venv, installed by `make demo` itself), and writes
# benchmarks/results/soak_<date>_<host>.json (or OUT.json):
#   {"runs": N, "passed": P, "commit": ..., "host": ..., "results": [{"run", "passed", "exit_code", "seconds",
#    "stages": {stage: {"status", "seconds", "detail"}}, "validation": {model: {metric: relative error}}, "log_tail"}]}
# ("validation": the demo's own simulated-vs-measured p50 / p99 / throughput errors, so a soak also gives their spread).
# A run passes when `make demo` exits 0 and every stage in results/demo/demo.json is ok. The result file is
# rewritten after every run, so a soak cut short keeps what it measured ("complete": false).
set -uo pipefail
N="${1:?usage: scripts/soak.sh N [OUT.json]}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
HOST="$(hostname -s 2>/dev/null || hostname)"
OUT="${2:-$ROOT/benchmarks/results/soak_$(date -u +%F)_${HOST}.json}"
COMMIT="$(git -C "$ROOT" rev-parse HEAD)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/serving-bench-soak-XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
RUNS="$WORK/runs.jsonl"
: > "$RUNS"

write_result() {  # $1: complete (true/false)
  python3 - "$RUNS" "$OUT" "$N" "$COMMIT" "$HOST" "$1" <<'PYEOF'
import json, os, platform, sys
runs_file, out, n, commit, host, complete = sys.argv[1:]
runs = [json.loads(line) for line in open(runs_file) if line.strip()]
doc = {"runs": len(runs), "planned": int(n), "passed": sum(r["passed"] for r in runs), "complete": complete == "true",
       "commit": commit, "host": host, "cores": os.cpu_count(), "machine": platform.platform(),
       "command": "make demo on a fresh clone, one after another", "results": runs}
tmp = out + ".tmp"
with open(tmp, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
os.replace(tmp, out)
print(f"soak: {doc['passed']}/{doc['runs']} passed -> {out}")
PYEOF
}

for i in $(seq 1 "$N"); do
  clone="$WORK/clone-$i"
  git clone --quiet "$ROOT" "$clone" && git -C "$clone" checkout --quiet "$COMMIT"
  start=$(date +%s.%N)
  (cd "$clone" && make demo) > "$WORK/demo-$i.log" 2>&1
  code=$?
  seconds=$(python3 -c "import time; print(round(time.time() - $start, 1))")
  python3 - "$clone/results/demo/demo.json" "$WORK/demo-$i.log" "$i" "$code" "$seconds" \
      "$clone/results/demo/validate/validation.csv" >> "$RUNS" <<'PYEOF'
import csv, json, sys
demo_json, log, run, code, seconds, validation_csv = sys.argv[1:]
validation = {}
try:
    for row in csv.DictReader(open(validation_csv)):
        if row["metric"] in ("p50", "p99", "throughput") and row["rel_error"]:
            validation.setdefault(row["model"], {})[row["metric"]] = round(float(row["rel_error"]), 4)
except OSError:
    pass
try:
    stages = json.load(open(demo_json))
except (OSError, ValueError):
    stages = {}
passed = int(code) == 0 and bool(stages) and all(s["status"] == "ok" for s in stages.values())
tail = open(log, errors="replace").read().splitlines()[-15:]
print(json.dumps({"run": int(run), "passed": passed, "exit_code": int(code), "seconds": float(seconds),
                  "stages": stages, "validation": validation, "log_tail": [] if passed else tail}))
PYEOF
  echo "soak run $i/$N: exit $code in ${seconds} s"
  rm -rf "$clone"
  write_result false > /dev/null
done
write_result true

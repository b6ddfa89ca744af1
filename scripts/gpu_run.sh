#!/usr/bin/env bash
# The whole DAG on one real GPU, in one command, on a host without a package index (the device tool's lent H100 or
# H200): install the bundle `make gpu-bundle` made (.gpu-bundle/), make a model of Llama-3.2-1B's shape there
# (scripts/make_gpu_model.py), `enginefoundry run configs/gpu-sm90-search.yaml` (fetch, convert, build, serve on
# CUDA, smoke with the reference on the GPU, the goodput search at the SLO with AIPerf, NVML energy, cost, publish,
# track), then judge two broken variants with `enginefoundry smoke` against the same reference (EF_GPU_SKIP_RUN=1:
# only those).
#
#   bash scripts/gpu_run.sh [RESULTS_DIR]      # default $OUT (the device tool's), else .gpu-run/out
#
# RESULTS_DIR gets: timings.json (seconds per step), run.json (the run's --json summary), run.log, broken-<fault>.json
# (each broken variant's verdict), host.txt (GPU, driver, the host's Python packages) and results.tar.gz (the manifest,
# search.json/search.png and the other reports, the MLflow database, the install and model logs). docs/scale.md has
# what the lent H200 gave.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_common.sh
RESULTS=${1:-${OUT:-.gpu-run/out}}
SITE=${EF_GPU_SITE:-/tmp/ef-site}
PY=${PYTHON:-python3}
mkdir -p "$RESULTS" .gpu-run
rm -rf .gpu-run/store .gpu-run/mlflow.db .gpu-run/workdir .gpu-run/broken-*
TIMINGS=.gpu-run/timings.tsv
: > "$TIMINGS"

step() {  # step NAME CMD…: run, time, record; a failed step is recorded and the script goes on to collect
  local name=$1; shift
  local t0=$SECONDS
  echo "=== $name: $*" >&2
  "$@"
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$((SECONDS - t0))" "$rc" >> "$TIMINGS"
  echo "=== $name: exit $rc after $((SECONDS - t0)) s" >&2
  return $rc
}

{
  nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv
  "$PY" -V
  "$PY" -m pip freeze 2>/dev/null
} > "$RESULTS/host.txt" 2>&1

step install "$PY" scripts/gpu_install.py --bundle .gpu-bundle --into "$SITE" > .gpu-run/install.json || exit 1
export PYTHONPATH="$PWD:$SITE" PATH="$SITE/bin:$PATH" EF_AIPERF="$SITE/bin/aiperf"
export EF_WORK_DIR="$PWD/.gpu-run/workdir" EF_CACHE_DIR="$PWD/.gpu-run/cache" HF_HUB_OFFLINE=1
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}

if [ ! -f .gpu-run/model/model.safetensors ]; then
  step model "$PY" scripts/make_gpu_model.py --shape llama-3.2-1b --out .gpu-run/model > .gpu-run/model.log 2>&1 \
    || { tail -20 .gpu-run/model.log >&2; exit 1; }
fi
tail -1 .gpu-run/model.log >&2

if [ "${EF_GPU_SKIP_RUN:-0}" != 1 ]; then  # 1: judge the broken variants only (the reference is computed there)
  step run "$PY" -m enginefoundry.cli run configs/gpu-sm90-search.yaml --json > "$RESULTS/run.json" 2> "$RESULTS/run.log"
  tail -40 "$RESULTS/run.log" >&2
fi

# Broken variants, judged like the unit: the scoring server on the broken weights, the same prompts and the same
# fp32 reference on the GPU (its answers are already in the reference cache when the run's smoke stage ran).
PORT=18123
for FAULT in attn-noise-mid o-proj-x1.5; do
  step "broken-model-$FAULT" "$PY" scripts/make_gpu_model.py --broken-from .gpu-run/model --out ".gpu-run/broken-$FAULT" \
    --fault "$FAULT" >> .gpu-run/model.log 2>&1
  "$PY" -m enginefoundry.smoke.serve ".gpu-run/broken-$FAULT" --device cuda --port "$PORT" --name broken \
    > ".gpu-run/broken-$FAULT-server.log" 2>&1 &
  SERVER=$!
  wait_healthy "$PORT" "$SERVER"
  step "broken-smoke-$FAULT" "$PY" -m enginefoundry.cli smoke --endpoint "http://127.0.0.1:$PORT" \
    --served-model broken --reference .gpu-run/model --prompts configs/prompts/tiny-chat.jsonl --precision fp32 \
    --reference-device gpu --max-new-tokens 6 --server-log ".gpu-run/broken-$FAULT-server.log" \
    --report-dir ".gpu-run/broken-$FAULT-smoke" --json > "$RESULTS/broken-$FAULT.json" 2> ".gpu-run/broken-$FAULT-smoke.log"
  kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null
  PORT=$((PORT + 1))
done

"$PY" - "$TIMINGS" > "$RESULTS/timings.json" <<'EOF'
import json, sys
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
print(json.dumps({name: {"seconds": int(s), "exit": int(rc)} for name, s, rc in rows}, indent=1))
EOF
tar -czf "$RESULTS/results.tar.gz" --exclude='*.safetensors' --exclude='*.bin' --exclude='cache' \
  .gpu-run/install.json .gpu-run/model.log .gpu-run/broken-*-server.log .gpu-run/broken-*-smoke.log \
  .gpu-run/broken-*-smoke .gpu-run/mlflow.db .gpu-run/store/manifests .gpu-run/workdir/units/*/reports 2>/dev/null
cat "$RESULTS/timings.json" >&2

#!/usr/bin/env bash
# The gate on one real GPU, healthy against broken, at the precision a build is served in: a Llama-3.2-1B-shaped model
# made on the GPU (scripts/make_gpu_model.py) trained only to TARGET_LOSS (default 0.6: its greedy answers decided,
# not near-certain, so a fault can move their log-probs; the DAG's model of scripts/gpu_run.sh is trained to 0.05),
# then, for each dtype (fp32, bf16) and each variant (the healthy copy `none`, make_gpu_model.py's faults), that copy
# served on the GPU by the reference lane's scoring server and judged by `enginefoundry smoke` with the policy of its
# precision against the healthy model's reference computed on the GPU: at the copy's precision by default (the gate's
# own default, like with like: `--reference-precision unit`), or at REFERENCE_PRECISION (fp32: the 16-bit copy judged
# against fp32). A healthy copy must pass and a broken one must be rejected; the table says which did what. Run where
# the device tool lends a GPU (docs/scale.md has what the lent H100 gave):
#
#   bash scripts/gpu_gate_check.sh [RESULTS_DIR] [TARGET_LOSS]     # default $OUT (the device tool's), else .gpu-run/gate
#   DTYPES=bf16 REFERENCE_PRECISION=fp32 bash scripts/gpu_gate_check.sh          # the dtypes served, the reference's
#
# RESULTS_DIR gets gate-check.json (each verdict's figures) and gate-check.log. Exit 1 when a healthy copy is rejected
# or a broken one passes.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_common.sh
RESULTS=${1:-${OUT:-.gpu-run/gate}}
LOSS=${2:-0.6}
SITE=${EF_GPU_SITE:-/tmp/ef-site}
PY=${PYTHON:-python3}
DTYPES=${DTYPES:-fp32 bf16}
REFERENCE_PRECISION=${REFERENCE_PRECISION:-unit}
mkdir -p "$RESULTS" .gpu-run
LOG="$RESULTS/gate-check.log"
: > "$LOG"

"$PY" scripts/gpu_install.py --bundle .gpu-bundle --into "$SITE" >> "$LOG" 2>&1 || { tail -20 "$LOG"; exit 1; }
export PYTHONPATH="$PWD:$SITE" PATH="$SITE/bin:$PATH" HF_HUB_OFFLINE=1 PREFECT_SERVER_ANALYTICS_ENABLED=false
export EF_WORK_DIR="$PWD/.gpu-run/workdir" EF_CACHE_DIR="$PWD/.gpu-run/gate-cache" OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
MODEL=.gpu-run/gate-model
"$PY" scripts/make_gpu_model.py --shape llama-3.2-1b --out "$MODEL" --target-loss "$LOSS" >> "$LOG" 2>&1 \
  || { tail -20 "$LOG"; exit 1; }
tail -1 "$LOG"

PORT=18300
VERDICTS=()
for DTYPE in $DTYPES; do
  for FAULT in none attn-noise-mid o-proj-x1.5; do
    COPY=".gpu-run/gate-$FAULT-$DTYPE"
    "$PY" scripts/make_gpu_model.py --broken-from "$MODEL" --out "$COPY" --fault "$FAULT" --dtype "$DTYPE" >> "$LOG" 2>&1
    "$PY" -m enginefoundry.smoke.serve "$COPY" --device cuda --port "$PORT" --name unit > "$COPY.server.log" 2>&1 &
    SERVER=$!
    wait_healthy "$PORT" "$SERVER"
    "$PY" -m enginefoundry.cli smoke --endpoint "http://127.0.0.1:$PORT" --served-model unit --reference "$MODEL" \
      --prompts configs/prompts/tiny-chat.jsonl --precision "$DTYPE" --reference-precision "$REFERENCE_PRECISION" \
      --reference-device gpu --max-new-tokens 6 --server-log "$COPY.server.log" --json > "$COPY.verdict.json" 2>> "$LOG"
    echo "$FAULT $DTYPE: smoke exit $?" >> "$LOG"
    kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null
    VERDICTS+=("$FAULT" "$DTYPE" "$COPY.verdict.json")
    rm -rf "$COPY"
    PORT=$((PORT + 1))
  done
done

"$PY" - "$RESULTS/gate-check.json" "${VERDICTS[@]}" <<'EOF'
import json, sys
out, rest = sys.argv[1], sys.argv[2:]
rows, wrong = [], 0
for fault, dtype, path in zip(rest[0::3], rest[1::3], rest[2::3]):
    try:
        v = json.load(open(path))
    except (OSError, ValueError) as e:
        rows.append({"fault": fault, "dtype": dtype, "error": str(e)}); wrong += 1; continue
    rules = {r["name"]: r for r in v["verdict"]["rules"]}
    tf = rules.get("teacher-forced log-prob distance", {})
    row = {"fault": fault, "dtype": dtype, "passed": v["verdict"]["passed"], "agree": f"{v['agree']}/{v['n']}",
           "tf_logprob": tf.get("detail", ""), "failed": [n for n, r in rules.items() if not r["ok"]]}
    row["right"] = row["passed"] == (fault == "none")
    wrong += not row["right"]
    rows.append(row)
json.dump(rows, open(out, "w"), indent=1)
print(f"{'variant':16} {'dtype':5} {'verdict':8} {'as it must':10} teacher-forced log-prob distance")
for r in rows:
    verdict = "error" if "error" in r else ("PASS" if r["passed"] else "REJECT")
    print(f"{r['fault']:16} {r['dtype']:5} {verdict:8} {str(r.get('right', False)):10} {r.get('tf_logprob', r.get('error'))}")
sys.exit(1 if wrong else 0)
EOF

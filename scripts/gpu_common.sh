# Sourced by scripts/gpu_run.sh and scripts/gpu_gate_check.sh.

# wait_healthy PORT PID: until the server on PORT answers GET /health (at most 180 s; status 0), or its process PID
# has ended (status 1: the command that asks it next says what failed).
wait_healthy() {
  local port=$1 pid=$2
  for _ in $(seq 1 180); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 1
  done
  return 1
}

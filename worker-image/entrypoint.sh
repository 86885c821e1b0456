#!/usr/bin/env bash
# Worker entrypoint: register -> tunnel (optional) -> params -> daemon -> warmup -> benchmark -> report -> serve|exit.
#
# Place in the flow: the container command of every rented instance (worker-image/Dockerfile). It speaks
# protocol v1 (fleet-spec/schema/worker-protocol.v1.schema.json) to FLEET_CONTROLLER_URL with
# `Authorization: Bearer $FLEET_TOKEN`: one register, `started`/`done` events for each phase (with
# timestamps), progress events, one result, and its log lines in batches (log-shipper.sh).
# If a phase fails, the EXIT trap reports {phase, failed, exit_code, message, log_tail} at once, then the
# benchmark result (benchmark failures), then exits with that code. A controller outage never fails a
# phase: reports retry with backoff, then the worker carries on. Environment: see worker-image/README.md.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${FLEET_HOME:=$HERE}"
export FLEET_HOME
# shellcheck source=lib/fleet.sh
. "$HERE/lib/fleet.sh"

# --- Configuration: without these nothing can be reported, so they fail before anything starts. ----
missing=()
for var in FLEET_CONTROLLER_URL FLEET_INSTANCE_ID FLEET_TOKEN; do
  [[ -n ${!var:-} ]] || missing+=("$var")
done
if ((${#missing[@]})); then
  printf 'fleet: ERROR: missing required environment: %s\n' "${missing[*]}" >&2
  exit "$FLEET_EXIT_CONFIG"
fi
if [[ ! $FLEET_INSTANCE_ID =~ ^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$ ]]; then
  printf 'fleet: ERROR: FLEET_INSTANCE_ID %q is not a valid instance id\n' "$FLEET_INSTANCE_ID" >&2
  exit "$FLEET_EXIT_CONFIG"
fi
: "${FLEET_AFTER_BENCH:=serve}"
if [[ $FLEET_AFTER_BENCH != serve && $FLEET_AFTER_BENCH != exit ]]; then
  printf 'fleet: ERROR: FLEET_AFTER_BENCH must be serve or exit, got %q\n' "$FLEET_AFTER_BENCH" >&2
  exit "$FLEET_EXIT_CONFIG"
fi
: "${FLEET_PARAMS_DIR:=/var/tmp/filecoin-proof-parameters}"
: "${FLEET_DAEMON_WAIT_S:=300}"
: "${FLEET_DAEMON_POLL_S:=2}"
: "${FLEET_DAEMON_LISTEN:=0.0.0.0:9820}"
: "${FLEET_LOG_FINAL_FLUSH_S:=30}"
export FLEET_PARAMS_DIR FIL_PROOFS_PARAMETER_CACHE="$FLEET_PARAMS_DIR"
export FLEET_DAEMON_ADDR="http://127.0.0.1:${FLEET_DAEMON_LISTEN##*:}"
# tracing-subscriber colours the daemon's and cuzk-bench's log lines even into a pipe unless NO_COLOR is set.
export NO_COLOR=1
if [[ ${FLEET_USE_STANDINS:-0} == 1 ]]; then
  export PATH="$FLEET_HOME/standin:$PATH"
fi

# --- Logging: everything below goes through the sink into the ring; the shipper sends it. ----------
fleet_init_state
exec 3>&1
exec > >(fleet_log_sink) 2>&1
"$HERE/log-shipper.sh" &
SHIPPER_PID=$!

PHASE=""
CHILD_PID=""
DAEMON_PID=""
TUNNEL_PID=""
WATCH_PID=""
STOP_SIGNAL=""

# Run a phase script in the background and wait for it, so a TERM reaches our trap at once.
run_child() {
  local rc=0
  "$@" &
  CHILD_PID=$!
  wait "$CHILD_PID" || rc=$?
  CHILD_PID=""
  return "$rc"
}

stop_background() {
  local pid i
  for pid in "$CHILD_PID" "$WATCH_PID" "$TUNNEL_PID" "$DAEMON_PID"; do
    [[ -n $pid ]] && fleet_kill_tree "$pid" TERM
  done
  for pid in "$CHILD_PID" "$WATCH_PID" "$TUNNEL_PID" "$DAEMON_PID"; do
    [[ -n $pid ]] || continue
    for ((i = 0; i < 100; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && fleet_kill_tree "$pid" KILL
  done
  return 0
}

flush_logs() {
  local i
  fleet_log_checkpoint "worker exiting with code $1"
  kill -USR1 "$SHIPPER_PID" 2>/dev/null || true
  for ((i = 0; i < FLEET_LOG_FINAL_FLUSH_S * 10; i++)); do
    kill -0 "$SHIPPER_PID" 2>/dev/null || return 0
    sleep 0.1
  done
  kill "$SHIPPER_PID" 2>/dev/null || true
}

on_exit() {
  local rc=$? message tail_filter=""
  trap - EXIT TERM INT
  set +e
  if ((rc != 0)) && [[ -n $PHASE ]]; then
    message=$(head -c 4000 "$FLEET_FAILURE_MESSAGE_FILE" 2>/dev/null)
    [[ -n $message ]] || message="phase $PHASE failed with exit code $rc"
    fleet_log_checkpoint "phase $PHASE failed with exit code $rc: $message"
    # The daemon's failure is explained by the daemon's own lines (and our lines about it).
    [[ $PHASE == daemon ]] && tail_filter="cuzk-daemon"
    fleet_event "$PHASE" failed --exit-code "$rc" --message "$message" \
      --tail "$FLEET_LOG_TAIL_LINES" --tail-filter "$tail_filter"
    if [[ ($PHASE == benchmark || $PHASE == warmup) && -f $FLEET_STATE_DIR/result.json ]]; then
      fleet_post result "$FLEET_STATE_DIR/result.json" "$FLEET_RESULT_ATTEMPTS" ||
        fleet_log "benchmark result not delivered to the controller"
    fi
  fi
  stop_background
  flush_logs "$rc"
  exit "$rc"
}

on_signal() {
  local sig=$1 code=$2
  if [[ $PHASE == serve ]]; then
    STOP_SIGNAL=$sig # serve.sh reports a clean stop
    [[ -n $CHILD_PID ]] && kill "-$sig" "$CHILD_PID" 2>/dev/null
    return 0
  fi
  fleet_log "received SIG$sig during phase ${PHASE:-startup}"
  printf 'worker stopped by SIG%s during phase %s\n' "$sig" "${PHASE:-startup}" >"$FLEET_FAILURE_MESSAGE_FILE"
  exit "$code"
}

trap on_exit EXIT
trap 'on_signal TERM 143' TERM
trap 'on_signal INT 130' INT

# --- register -------------------------------------------------------------------------------------
PHASE=register
fleet_log "worker ${FLEET_IMAGE_VERSION:-(no image version)} starting: instance $FLEET_INSTANCE_ID, pool ${FLEET_POOL:-?}, slot ${FLEET_SLOT:-?}, machine ${FLEET_MACHINE_ID:-?}"
if [[ ${FLEET_USE_STANDINS:-0} == 1 ]]; then
  fleet_log "FLEET_USE_STANDINS=1: using the CPU stand-ins for cuzk-daemon/cuzk-bench; benchmark numbers are simulated, not measured on a GPU"
fi
gpus_file="$FLEET_TMP_DIR/gpus"
: >"$gpus_file"
if command -v nvidia-smi >/dev/null 2>&1; then
  timeout 30 nvidia-smi --query-gpu=index,name,memory.total,driver_version,pci.bus_id --format=csv,noheader \
    >"$gpus_file" 2>&1 || fleet_log "nvidia-smi failed: $(head -c 300 "$gpus_file")"
  cat "$gpus_file"
fi
jq -n --arg at "$(fleet_now)" --arg id "$FLEET_INSTANCE_ID" --arg pool "${FLEET_POOL:-}" \
  --arg slot "${FLEET_SLOT:-}" --arg machine "${FLEET_MACHINE_ID:-}" --arg claim "${FLEET_MACHINE_CLAIM:-}" \
  --arg host "${FLEET_HOST_ID:-}" \
  --arg contract "${FLEET_CONTRACT_ID:-${CONTAINER_ID:-}}" --arg gpu "${FLEET_GPU_NAME:-}" \
  --arg digest "${FLEET_IMAGE_DIGEST:-}" --arg version "${FLEET_IMAGE_VERSION:-}" \
  --arg hostname "${HOSTNAME:-}" --rawfile gpus "$gpus_file" '
  def opt($n): if . == "" then null else .[:$n] end;
  {protocol: 1, instance_id: $id, at: $at,
   pool: ($pool | opt(64)), slot: ($slot | opt(128)), machine_id: ($machine | opt(64)),
   machine_claim: ($claim | opt(64)),
   host_id: ($host | opt(64)), contract_id: ($contract | opt(64)), gpu_name: ($gpu | opt(128)),
   image_digest: ($digest | opt(128)), image_version: ($version | opt(128)),
   hostname: ($hostname | opt(255)),
   gpus: ($gpus | rtrimstr("\n") | if . == "" then [] else split("\n") | map(.[:512]) | .[:16] end)}' \
  >"$FLEET_TMP_DIR/register.json"
if fleet_post register "$FLEET_TMP_DIR/register.json" "${FLEET_REGISTER_ATTEMPTS:-8}"; then
  : >"$FLEET_REGISTERED_FILE" # the log shipper starts shipping now (before this the controller answers 404)
else
  fleet_log "not registered with the controller; continuing (reports will keep retrying)"
fi

# --- tunnel (optional; nothing below depends on it) -------------------------------------------------
PHASE=tunnel
start_tunnel() {
  local forwards=${FLEET_TUNNEL_FORWARDS:-1234:127.0.0.1:1234} f args
  args=(-N -o ExitOnForwardFailure=yes -o ServerAliveInterval=15 -o ServerAliveCountMax=3
    -o StrictHostKeyChecking=accept-new -o BatchMode=yes)
  [[ -n ${FLEET_TUNNEL_SSH_KEY_FILE:-} ]] && args+=(-i "$FLEET_TUNNEL_SSH_KEY_FILE")
  for f in $forwards; do args+=(-L "$f"); done
  (
    child=""
    trap '[[ -n $child ]] && kill "$child" 2>/dev/null; exit 0' TERM
    while :; do
      # shellcheck disable=SC2029  # the target is user@host, not a remote command
      ssh "${args[@]}" "$FLEET_TUNNEL_SSH" > >(fleet_prefix "tunnel: ") 2>&1 &
      child=$!
      rc=0
      wait "$child" || rc=$?
      fleet_log "tunnel: ssh to $FLEET_TUNNEL_SSH exited with code $rc; restarting in ${FLEET_TUNNEL_RETRY_S:-15}s"
      sleep "${FLEET_TUNNEL_RETRY_S:-15}" >/dev/null 2>&1 &
      child=$!
      wait "$child" || true
    done
  ) &
  TUNNEL_PID=$!
  fleet_event tunnel "done" --message "ssh tunnel supervisor started (-L $forwards via $FLEET_TUNNEL_SSH); the benchmark does not depend on it" \
    --details "$(jq -cn --arg f "$forwards" '{up: true, forwards: ($f | split(" "))}')"
}
if [[ -z ${FLEET_TUNNEL_SSH:-} ]]; then
  fleet_event tunnel "done" --message "no tunnel configured (FLEET_TUNNEL_SSH unset)" --details '{"up": false}'
elif ! command -v ssh >/dev/null 2>&1; then
  fleet_log "tunnel: ssh is not installed; no tunnel (the benchmark does not need it)"
  fleet_event tunnel "done" --message "tunnel not started: ssh is not installed; the benchmark does not depend on it" \
    --details '{"up": false}'
else
  start_tunnel
fi

# --- params ---------------------------------------------------------------------------------------
PHASE=params
fleet_event params started --details "$(jq -cn --arg dir "$FLEET_PARAMS_DIR" \
  --arg src "$([[ -n ${FLEET_PARAMS_BASE_URL:-} ]] && echo mirror || echo curio)" '{dir: $dir, source: $src}')"
run_child "$HERE/fetch-params.sh"
fleet_event params "done" --message "params present and verified in $FLEET_PARAMS_DIR"

# --- daemon ---------------------------------------------------------------------------------------
PHASE=daemon
fleet_event daemon started --details "$(jq -cn --arg listen "$FLEET_DAEMON_LISTEN" '{listen: $listen}')"
DAEMON_BIN=$(fleet_daemon_bin) ||
  fleet_fail 127 "cuzk-daemon is not installed in this image (neither cuzk-daemon nor cuzk on PATH)"
command -v cuzk-bench >/dev/null 2>&1 || fleet_fail 127 "cuzk-bench is not installed in this image (not on PATH)"
if ! fleet_memory_budget; then
  fleet_fail "$FLEET_EXIT_CONFIG" "cannot size cuzk-daemon's memory budget: FLEET_MEMORY_BUDGET_GIB='${FLEET_MEMORY_BUDGET_GIB:-}' is not a positive integer, or there is no cgroup limit and no /proc/meminfo"
fi
budget_gib=$((MEM_BUDGET_BYTES / 1073741824))
jq -cn --argjson b "$MEM_BUDGET_BYTES" --arg s "$MEM_SOURCE" --arg l "${MEM_LIMIT_BYTES:-}" \
  --arg h "${MEM_HOST_BYTES:-}" '{budget_bytes: $b, source: $s, limit_bytes: ($l | tonumber? // null),
  host_total_bytes: ($h | tonumber? // null)}' >"$FLEET_STATE_DIR/memory.json"
fleet_log "cuzk-daemon memory budget: ${budget_gib} GiB (from $MEM_SOURCE; limit ${MEM_LIMIT_BYTES:-none} bytes, host MemTotal ${MEM_HOST_BYTES:-unknown} bytes)"
# curio's cuzk.toml keys (extern/cuzk/cuzk.example.toml). The daemon's own defaults are a unix socket and a
# budget sized from the HOST's RAM (cuzk-core memory.rs:88-100), both wrong in a rented container.
cat >"$FLEET_STATE_DIR/cuzk.toml" <<EOF
# Generated by the fleet worker entrypoint.
[daemon]
listen = "$FLEET_DAEMON_LISTEN"

[srs]
param_cache = "$FLEET_PARAMS_DIR"

[memory]
total_budget = "${budget_gib}GiB"
EOF
fleet_log "starting $DAEMON_BIN --config $FLEET_STATE_DIR/cuzk.toml (listen $FLEET_DAEMON_LISTEN)"
rm -f "$FLEET_STATE_DIR/daemon.exit"
: >"$FLEET_STATE_DIR/daemon.log"
fleet_oom_kills >"$FLEET_STATE_DIR/oom_kill.start"
# The daemon's log, filtered (fleet_daemon_filter), goes to daemon.log (evidence for results) and, tagged,
# into the worker's log. Its exit code goes to daemon.exit for whoever notices that it is gone.
(
  rc=0
  "$DAEMON_BIN" --config "$FLEET_STATE_DIR/cuzk.toml" || rc=$?
  printf '%s\n' "$rc" >"$FLEET_STATE_DIR/daemon.exit"
  exit "$rc"
) > >(fleet_daemon_filter | tee -a "$FLEET_STATE_DIR/daemon.log" | fleet_prefix "cuzk-daemon: ") 2>&1 &
DAEMON_PID=$!
waited_from=$EPOCHSECONDS
last_note=$EPOCHSECONDS
probe="$FLEET_TMP_DIR/status.out"
while :; do
  if ! kill -0 "$DAEMON_PID" 2>/dev/null; then
    rc=0
    wait "$DAEMON_PID" || rc=$?
    DAEMON_PID=""
    sleep 0.2 # let the daemon's last lines reach the log
    ((rc != 0)) || rc=$FLEET_EXIT_SOFTWARE
    fleet_fail "$rc" "cuzk-daemon exited (code $rc) before answering cuzk-bench status"
  fi
  if cuzk-bench --addr "$FLEET_DAEMON_ADDR" status >"$probe" 2>&1; then
    break
  fi
  if ((EPOCHSECONDS - waited_from >= ${FLEET_DAEMON_WAIT_S%.*})); then
    fleet_prefix "fleet: last cuzk-bench status probe (cuzk-daemon not answering): " <"$probe"
    fleet_fail "$FLEET_EXIT_TIMEOUT" "cuzk-daemon did not answer cuzk-bench status at $FLEET_DAEMON_ADDR within FLEET_DAEMON_WAIT_S=${FLEET_DAEMON_WAIT_S}s"
  fi
  if ((EPOCHSECONDS - last_note >= 10)); then
    last_note=$EPOCHSECONDS
    fleet_log "waiting for cuzk-daemon to answer ($((EPOCHSECONDS - waited_from))s): $(tail -n 1 "$probe")"
  fi
  sleep "$FLEET_DAEMON_POLL_S"
done
fleet_prefix "cuzk-bench status: " <"$probe"
fleet_event daemon "done" --message "cuzk-daemon answers at $FLEET_DAEMON_ADDR" \
  --details "$(jq -cn --argjson w "$((EPOCHSECONDS - waited_from))" --argjson g "$budget_gib" --arg s "$MEM_SOURCE" \
    '{waited_s: $w, memory_budget_gib: $g, memory_source: $s}')"
export FLEET_DAEMON_PID=$DAEMON_PID

# --- warmup: preload the SRS, then one discarded proof (never counted in the rate) ------------------
PHASE=warmup
fleet_event warmup started --details "$(jq -cn --arg c "$(fleet_circuit_id)" '{circuit_id: $c}')"
run_child "$HERE/warmup.sh"
fleet_event warmup "done" \
  --message "$(jq -r '"warm-up: preload \(.preload_seconds // "-")s, warm-up proof \(.label // "-") in \(.seconds // "-")s"' "$FLEET_STATE_DIR/warmup.json")" \
  --details "$(jq -c '{preload_seconds, preload_already_loaded, seconds, "label": .label}' "$FLEET_STATE_DIR/warmup.json")"

# --- benchmark ------------------------------------------------------------------------------------
PHASE=benchmark
fleet_event benchmark started --details "$(jq -cn --arg t "${FLEET_BENCH_PROOF_TYPE:-porep}" \
  --arg n "${FLEET_BENCH_PROOFS:-10}" --arg j "${FLEET_BENCH_CONCURRENCY:-1}" --arg d "${FLEET_BENCH_TIMEOUT_S:-3600}" \
  'def num: (tonumber? // .); {proof_type: $t, requested: ($n | num), concurrency: ($j | num), timeout_s: ($d | num)}')"
"$HERE/serve.sh" watch &
WATCH_PID=$!
bench_rc=0
run_child "$HERE/benchmark.sh" || bench_rc=$?
{ kill "$WATCH_PID" 2>/dev/null && wait "$WATCH_PID" 2>/dev/null; } || true
WATCH_PID=""
if [[ -s $FLEET_STATE_DIR/directive.stop ]]; then # an early verdict: judged already, nothing to report
  PHASE=""
  fleet_event benchmark "done" --message "ended early by the controller: $(jq -r '[.verdict, .reason] | map(select(. != null)) | join(": ")' "$FLEET_STATE_DIR/directive.stop")" \
    --details "$(jq -c '{ended_by: "controller", directive: .}' "$FLEET_STATE_DIR/directive.stop")"
  exit 0
fi
((bench_rc == 0)) || exit "$bench_rc"
fleet_event benchmark "done" --message "benchmark completed" \
  --details "$(jq -c '{completed, failed, requested, proofs_per_hour, seconds_per_proof}' "$FLEET_STATE_DIR/result.json")"

# --- report ---------------------------------------------------------------------------------------
PHASE=report
fleet_event report started
if fleet_post result "$FLEET_STATE_DIR/result.json" "$FLEET_RESULT_ATTEMPTS"; then
  fleet_event report "done" --message "result delivered"
else
  fleet_log "benchmark result NOT delivered to the controller (see above); continuing"
fi

# --- serve or exit --------------------------------------------------------------------------------
if [[ $FLEET_AFTER_BENCH == exit ]]; then
  PHASE=""
  fleet_log "FLEET_AFTER_BENCH=exit: benchmark reported; stopping"
  exit 0
fi
PHASE=serve
# serve.sh: verdict, forwards, heartbeats (it sends the serve events). It exits 75 when the daemon is
# gone: the daemon is our child, so its exit code is ours to collect and report.
FLEET_DAEMON_PID=$DAEMON_PID "$HERE/serve.sh" &
CHILD_PID=$!
serve_rc=0
while :; do
  serve_rc=0
  wait "$CHILD_PID" || serve_rc=$?
  kill -0 "$CHILD_PID" 2>/dev/null || break # else a signal interrupted the wait; serve.sh got it too
done
CHILD_PID=""
if ((serve_rc == 75)); then
  rc=0
  wait "$DAEMON_PID" || rc=$?
  DAEMON_PID=""
  ((rc != 0)) || rc=$FLEET_EXIT_SOFTWARE
  fleet_fail "$rc" "cuzk-daemon exited (code $rc) while serving"
fi
((serve_rc == 0)) || exit "$serve_rc"
PHASE=""
[[ -z $STOP_SIGNAL ]] || fleet_log "received SIG$STOP_SIGNAL while serving: stopped"

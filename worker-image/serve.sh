#!/usr/bin/env bash
# Serve phase: after the benchmark was reported, learn the controller's verdict, then keep cuzk serving
# the owner's proving cluster, with health-checked forwards and heartbeats.
#
# Place in the flow: entrypoint.sh runs `serve.sh` (phase serve) once the result is reported, and
# `serve.sh watch` in the background during the benchmark. Protocol v1
# (fleet-spec/schema/worker-protocol.v1.schema.json):
#   GET  /api/v1/instances/{id}/directive -> {"action": "wait"|"serve"|"stop"|"drain", "reason", "verdict"}
#        (404/405: a controller without directives; the worker serves, as it always did)
#   POST /api/v1/instances/{id}/events    -> event_batch of `serve` events: `progress` events whose
#        details carry a `heartbeat` (proofs done since the last one, from the daemon's own
#        `cuzk-bench status` and `cuzk-bench metrics`, GPU temperature/clock from nvidia-smi) or a
#        `forward` state change; `started`/`done` around the phase.
#
# Modes:
#   serve  wait for the verdict (FLEET_VERDICT_WAIT_S; no answer -> serve); `stop` -> report and exit 0;
#          `serve` -> forwards + optional FLEET_SERVE_CMD (curio) + heartbeats every FLEET_HEARTBEAT_S,
#          the directive re-read at each heartbeat (`stop` after a degraded verdict ends serving;
#          `drain`, the pool shrinks: no new work (FLEET_DRAIN_CMD, e.g. `curio cli cordon`, or else the
#          serve command is stopped), the daemon finishes the proofs it holds (`cuzk-bench status` shows
#          no queue), then exit 0; a `serve` while draining resumes (FLEET_UNDRAIN_CMD, or the serve
#          command again); FLEET_DRAIN_MAX_S caps the wait).
#          Exit 0 on a stop (directive or TERM), 75 when cuzk-daemon (FLEET_DAEMON_PID) is gone: the
#          entrypoint, its parent, collects the daemon's exit code and reports the failure.
#   watch  during the benchmark: poll the directive; on `stop` (an early verdict) write it to
#          $FLEET_STATE_DIR/directive.stop and end the benchmark (TERM to the entrypoint's benchmark.sh
#          child, FLEET_WATCH_PARENT). Exits when the parent is gone or on TERM.
#
# Forwards (FLEET_FORWARDS, space separated `name=LOCAL_PORT:HOST:PORT`, e.g.
# "lotus=1234:10.0.0.5:1234 yb=5433:10.0.0.6:5433 cql=9042:10.0.0.6:9042"): curio on this machine needs
# the Lotus API (1234) and the cluster's YugabyteDB (5433 YSQL, 9042 YCQL) on 127.0.0.1. Each forward is
# its own process (`ssh -N -L` through FLEET_TUNNEL_SSH, or `socat` with FLEET_FORWARD_VIA=socat), probed
# through the forward every FLEET_FORWARD_CHECK_S with the service's own protocol (name lotus*: an HTTP
# JSON-RPC request; yb/ysql/pg*: a Postgres SSLRequest, answered S or N; cql/ycql*: a CQL OPTIONS frame,
# answered SUPPORTED; anything else: a TCP connect) and restarted when it exits or fails
# FLEET_FORWARD_FAILURES probes in a row. The benchmark never depends on them: they start here, after it.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/fleet.sh
. "$HERE/lib/fleet.sh"

: "${FLEET_HEARTBEAT_S:=300}"
: "${FLEET_VERDICT_WAIT_S:=1800}"
: "${FLEET_DIRECTIVE_POLL_S:=10}"
: "${FLEET_FORWARDS:=}"
: "${FLEET_FORWARD_VIA:=ssh}"
: "${FLEET_FORWARD_CHECK_S:=30}"
: "${FLEET_FORWARD_FAILURES:=2}"
: "${FLEET_FORWARD_RETRY_S:=5}"
: "${FLEET_FORWARD_PROBE_TIMEOUT_S:=5}"
: "${FLEET_SERVE_CMD:=}"
: "${FLEET_SERVE_RETRY_S:=15}"
: "${FLEET_DRAIN_CMD:=}"
: "${FLEET_UNDRAIN_CMD:=}"
: "${FLEET_DRAIN_MAX_S:=10800}"
: "${FLEET_DAEMON_ADDR:=http://127.0.0.1:9820}"
: "${FLEET_DAEMON_PID:=}"
: "${FLEET_WATCH_PARENT:=$PPID}"

readonly SERVE_EXIT_DAEMON_GONE=75 # EX_TEMPFAIL: the entrypoint knows the daemon's exit code, we do not
QUEUE_DIR="$FLEET_STATE_DIR/serve-queue"
DIRECTIVE_FILE="$FLEET_TMP_DIR/directive.json"
STOP_FILE="$FLEET_STATE_DIR/directive.stop"
mkdir -p "$QUEUE_DIR" "$FLEET_TMP_DIR"

number() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?$ ]]; }
for var in FLEET_HEARTBEAT_S FLEET_VERDICT_WAIT_S FLEET_DIRECTIVE_POLL_S FLEET_FORWARD_CHECK_S \
  FLEET_FORWARD_RETRY_S FLEET_FORWARD_PROBE_TIMEOUT_S FLEET_SERVE_RETRY_S FLEET_DRAIN_MAX_S; do
  if ! number "${!var}" || [[ ${!var} =~ ^0+(\.0+)?$ ]]; then
    fleet_fail "$FLEET_EXIT_CONFIG" "$var must be a positive number of seconds, got '${!var}'"
  fi
done
[[ $FLEET_FORWARD_FAILURES =~ ^[1-9][0-9]*$ ]] ||
  fleet_fail "$FLEET_EXIT_CONFIG" "FLEET_FORWARD_FAILURES must be a positive integer, got '$FLEET_FORWARD_FAILURES'"

# Interruptible sleep: a TERM is handled at once, not after the sleep.
SLEEP_PID=""
pause() {
  sleep "$1" >/dev/null 2>&1 &
  SLEEP_PID=$!
  wait "$SLEEP_PID" || true
  SLEEP_PID=""
}

# ---------------------------------------------------------------------------------------------------
# Directive: what the controller decided about this instance.

# Prints the action (wait|serve|stop|none); the body is left in $DIRECTIVE_FILE. `none`: the controller
# has no directive route (an older controller; the worker behaves as before: it serves). `error`: no
# usable answer this time (outage); the caller polls again.
read_directive() {
  local url="${FLEET_CONTROLLER_URL%/}/api/v1/instances/$FLEET_INSTANCE_ID/directive" code action
  code=$(curl -sS -o "$DIRECTIVE_FILE.tmp" -w '%{http_code}' \
    --connect-timeout "$FLEET_HTTP_CONNECT_TIMEOUT_S" --max-time "$FLEET_HTTP_MAX_TIME_S" \
    -H "@$FLEET_AUTH_HEADER_FILE" "$url" 2>/dev/null) || true
  case $code in
    200)
      action=$(jq -r 'if (.action | type) == "string" then .action else "error" end' "$DIRECTIVE_FILE.tmp" 2>/dev/null) ||
        action=error
      case $action in
        wait | serve | stop | drain) mv -f "$DIRECTIVE_FILE.tmp" "$DIRECTIVE_FILE" ;;
        *) action=error ;;
      esac
      ;;
    404 | 405) action=none ;;
    *) action=error ;;
  esac
  rm -f "$DIRECTIVE_FILE.tmp"
  printf '%s\n' "$action"
}

directive_reason() { jq -r '[.verdict, .reason] | map(select(. != null and . != "")) | join(": ")' "$DIRECTIVE_FILE" 2>/dev/null || true; }

# ---------------------------------------------------------------------------------------------------
# Event queue: supervisors and the main loop add events; `flush_events` sends them as one batch.

QUEUE_SEQ=0
queue_event() { # STATUS MESSAGE DETAILS_JSON
  local file
  QUEUE_SEQ=$((QUEUE_SEQ + 1))
  printf -v file '%s/%s.%06d.%s' "$QUEUE_DIR" "${EPOCHREALTIME/[.,]/}" "$QUEUE_SEQ" "$BASHPID"
  if jq -cn --arg status "$1" --arg message "$2" --argjson details "$3" --arg at "$(fleet_now)" \
    '{protocol: 1, phase: "serve", status: $status, at: $at, message: $message[:4096], details: $details}' \
    >"$file.tmp"; then
    mv -f "$file.tmp" "$file.json"
  else
    rm -f "$file.tmp"
    fleet_log "serve: could not build an event ($2); not queued"
  fi
}

# Send queued events, oldest first, at most 200 per request (the protocol's batch limit); a single event
# goes as a plain event body. Kept when the controller is unreachable (the next flush retries); the queue
# keeps the newest 1000 (a long outage loses the oldest). A refused batch is sent again one event at a
# time, so one bad event does not lose the others.
flush_events() {
  local files batch="$FLEET_TMP_DIR/serve-batch.json" rc
  mapfile -t files < <(find "$QUEUE_DIR" -maxdepth 1 -name '*.json' -printf '%f\n' 2>/dev/null | sort)
  if ((${#files[@]} > 1000)); then
    fleet_log "serve: event queue over 1000 (controller unreachable); dropping the $((${#files[@]} - 1000)) oldest"
    (cd "$QUEUE_DIR" && rm -f -- "${files[@]:0:${#files[@]}-1000}")
    files=("${files[@]: -1000}")
  fi
  while ((${#files[@]} > 0)); do
    local chunk=("${files[@]:0:200}") one
    if ((${#chunk[@]} == 1)); then
      cp -f "$QUEUE_DIR/${chunk[0]}" "$batch"
    else
      (cd "$QUEUE_DIR" && jq -cs '{protocol: 1, events: .}' -- "${chunk[@]}") >"$batch" || return 0
    fi
    rc=0
    fleet_post events "$batch" 2 || rc=$?
    if ((rc == 1)); then
      return 0 # unreachable: keep them for the next flush
    fi
    if ((rc == 2 && ${#chunk[@]} > 1)); then
      for one in "${chunk[@]}"; do
        rc=0
        fleet_post events "$QUEUE_DIR/$one" 2 || rc=$?
        ((rc == 1)) && return 0
        ((rc == 0)) || fleet_log "serve: controller refused event $one: dropped"
        rm -f -- "${QUEUE_DIR:?}/$one"
      done
    elif ((rc == 2)); then
      fleet_log "serve: controller refused event ${chunk[0]}: dropped"
    fi
    (cd "$QUEUE_DIR" && rm -f -- "${chunk[@]}")
    files=("${files[@]:200}")
  done
  rm -f "$batch"
}

# ---------------------------------------------------------------------------------------------------
# watch mode (during the benchmark)

if [[ ${1:-serve} == watch ]]; then
  trap 'exit 0' TERM INT
  rm -f "$STOP_FILE"
  while kill -0 "$FLEET_WATCH_PARENT" 2>/dev/null; do
    pause "$FLEET_DIRECTIVE_POLL_S"
    case $(read_directive) in
      stop) ;;
      none) exit 0 ;; # a controller without directives never ends a benchmark early
      *) continue ;;
    esac
    cp -f "$DIRECTIVE_FILE" "$STOP_FILE"
    fleet_log "serve: the controller ended the benchmark early: $(directive_reason)"
    # shellcheck disable=SC2013  # the file is one line of space-separated pids
    for child in $(cat "/proc/$FLEET_WATCH_PARENT/task/$FLEET_WATCH_PARENT/children" 2>/dev/null); do
      if tr '\0' ' ' <"/proc/$child/cmdline" 2>/dev/null | grep -q 'benchmark\.sh'; then
        fleet_kill_tree "$child" TERM
      fi
    done
    exit 0
  done
  exit 0
fi

# ---------------------------------------------------------------------------------------------------
# Forwards

# shellcheck disable=SC2016  # the probes' `bash -c` scripts expand their own $1
forward_probe() { # KIND PORT -> 0 when the service behind the forward answered in its own protocol
  local kind=$1 port=$2 t=$FLEET_FORWARD_PROBE_TIMEOUT_S reply
  case $kind in
    http)
      reply=$(curl -sS -o /dev/null -w '%{http_code}' --max-time "$t" -H 'Content-Type: application/json' \
        --data '{"jsonrpc":"2.0","method":"Filecoin.Version","params":[],"id":1}' \
        "http://127.0.0.1:$port/rpc/v0" 2>/dev/null) || true
      [[ $reply =~ ^[1-5][0-9][0-9]$ ]]
      ;;
    pg) # SSLRequest (Postgres protocol 3, code 80877103): a server answers one byte, S or N
      reply=$(timeout "$t" bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && printf "\x00\x00\x00\x08\x04\xd2\x16\x2f" >&3 &&
        head -c 1 <&3' _ "$port" 2>/dev/null) || true
      [[ $reply == S || $reply == N ]]
      ;;
    cql) # OPTIONS frame, protocol v4: the answer is a response frame (version 0x84) with opcode SUPPORTED (0x06)
      reply=$(timeout "$t" bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && printf "\x04\x00\x00\x01\x05\x00\x00\x00\x00" >&3 &&
        head -c 9 <&3 | od -An -tx1' _ "$port" 2>/dev/null) || true
      read -r -a reply_bytes <<<"$reply"
      [[ ${reply_bytes[0]:-} == 84 && ${reply_bytes[4]:-} == 06 ]]
      ;;
    *)
      timeout "$t" bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$port" 2>/dev/null
      ;;
  esac
}

forward_kind() {
  case ${1,,} in
    lotus* | http* | api*) echo http ;;
    yb* | ysql* | pg* | postgres*) echo pg ;;
    cql* | ycql* | cassandra*) echo cql ;;
    *) echo tcp ;;
  esac
}

# One supervisor per forward (a subshell): start, probe, restart; state changes are queued as events.
supervise_forward() {
  local name=$1 local_port=$2 target=$3 kind fwd="" state=starting failures=0 restarts=0 why rc
  kind=$(forward_kind "$name")
  trap '[[ -n $fwd ]] && fleet_kill_tree "$fwd" TERM; [[ -n $SLEEP_PID ]] && kill "$SLEEP_PID" 2>/dev/null; exit 0' TERM INT
  forward_event() { # STATE REASON
    queue_event progress "forward $name (127.0.0.1:$local_port -> $target): $1${2:+: $2}" \
      "$(jq -cn --arg name "$name" --argjson port "$local_port" --arg target "$target" --arg kind "$kind" \
        --arg state "$1" --arg reason "$2" --argjson restarts "$restarts" --arg via "$FLEET_FORWARD_VIA" \
        '{forward: {name: $name, local_port: $port, target: $target, probe: $kind, via: $via,
                    state: $state, reason: (if $reason == "" then null else $reason end), restarts: $restarts}}')"
  }
  while :; do
    case $FLEET_FORWARD_VIA in
      socat) socat "TCP-LISTEN:$local_port,bind=127.0.0.1,reuseaddr,fork" "TCP:$target" \
        > >(fleet_prefix "forward $name: ") 2>&1 & ;;
      *) ssh -N -o ExitOnForwardFailure=yes -o ServerAliveInterval=15 -o ServerAliveCountMax=3 \
        -o StrictHostKeyChecking=accept-new -o BatchMode=yes \
        ${FLEET_TUNNEL_SSH_KEY_FILE:+-i "$FLEET_TUNNEL_SSH_KEY_FILE"} \
        -L "127.0.0.1:$local_port:$target" "$FLEET_TUNNEL_SSH" > >(fleet_prefix "forward $name: ") 2>&1 & ;;
    esac
    fwd=$!
    failures=0
    # Give it a moment to listen, then probe on the interval until it exits or fails repeatedly.
    pause 0.3
    while :; do
      if ! kill -0 "$fwd" 2>/dev/null; then
        rc=0
        wait "$fwd" || rc=$?
        why="forwarder exited with code $rc"
        break
      fi
      if forward_probe "$kind" "$local_port"; then
        failures=0
        if [[ $state != up ]]; then
          state=up
          forward_event up ""
          fleet_log "serve: forward $name 127.0.0.1:$local_port -> $target is up ($kind probe answered)"
        fi
      else
        failures=$((failures + 1))
        if ((failures >= FLEET_FORWARD_FAILURES)); then
          why="$failures $kind probes in a row got no answer through 127.0.0.1:$local_port"
          fleet_kill_tree "$fwd" TERM
          wait "$fwd" 2>/dev/null || true
          break
        fi
      fi
      pause "$FLEET_FORWARD_CHECK_S"
    done
    fwd=""
    restarts=$((restarts + 1))
    fleet_log "serve: forward $name is down ($why); restarting in ${FLEET_FORWARD_RETRY_S}s (restart $restarts)"
    state=down
    forward_event down "$why; restart $restarts in ${FLEET_FORWARD_RETRY_S}s"
    pause "$FLEET_FORWARD_RETRY_S"
  done
}

FORWARD_PIDS=()
start_forwards() {
  local spec name rest local_port target
  [[ -n $FLEET_FORWARDS ]] || return 0
  if [[ $FLEET_FORWARD_VIA == ssh && -z ${FLEET_TUNNEL_SSH:-} ]]; then
    fleet_log "serve: FLEET_FORWARDS set but FLEET_TUNNEL_SSH is not (ssh forwards need a target); no forwards"
    queue_event progress "forwards not started: FLEET_TUNNEL_SSH is unset" '{"forward": null}'
    return 0
  fi
  local tool=ssh
  [[ $FLEET_FORWARD_VIA == socat ]] && tool=socat
  if ! command -v "$tool" >/dev/null 2>&1; then
    fleet_log "serve: $tool is not installed; no forwards (proving for the cluster needs them)"
    queue_event progress "forwards not started: $tool is not installed" '{"forward": null}'
    return 0
  fi
  for spec in $FLEET_FORWARDS; do
    name=${spec%%=*} rest=${spec#*=}
    local_port=${rest%%:*} target=${rest#*:}
    if [[ $spec != *=* || ! $name =~ ^[A-Za-z][A-Za-z0-9_-]{0,31}$ || ! $local_port =~ ^[0-9]{1,5}$ ||
      ! $target =~ ^[^:[:space:]]+:[0-9]{1,5}$ ]]; then
      fleet_log "serve: FLEET_FORWARDS entry '$spec' is not name=LOCAL_PORT:HOST:PORT; skipped"
      queue_event progress "forward entry '$spec' is not name=LOCAL_PORT:HOST:PORT; skipped" '{"forward": null}'
      continue
    fi
    supervise_forward "$name" "$local_port" "$target" &
    FORWARD_PIDS+=("$!")
  done
}

# ---------------------------------------------------------------------------------------------------
# The cluster's client on this machine (curio), restarted when it exits.

SERVE_CMD_PID=""
start_serve_cmd() {
  [[ -n $FLEET_SERVE_CMD ]] || return 0
  # curio names its node after CURIO_NODE_NAME (cmd/curio/run.go `--name`, stored in harmony_machine_details.
  # machine_name): the instance id, so the leader can tell which machine missed a Snark Market deadline.
  export CURIO_NODE_NAME="${CURIO_NODE_NAME:-$FLEET_INSTANCE_ID}"
  (
    child=""
    trap '[[ -n $child ]] && fleet_kill_tree "$child" TERM; exit 0' TERM INT
    n=0
    while :; do
      # shellcheck disable=SC2086  # FLEET_SERVE_CMD is a command line
      $FLEET_SERVE_CMD > >(fleet_prefix "serve-cmd: ") 2>&1 &
      child=$!
      rc=0
      wait "$child" || rc=$?
      n=$((n + 1))
      fleet_log "serve: '$FLEET_SERVE_CMD' exited with code $rc; restarting in ${FLEET_SERVE_RETRY_S}s (restart $n)"
      queue_event progress "serve command exited with code $rc; restart $n" \
        "$(jq -cn --arg cmd "$FLEET_SERVE_CMD" --argjson rc "$rc" --argjson n "$n" '{serve_cmd: {command: $cmd, exit_code: $rc, restarts: $n}}')"
      sleep "$FLEET_SERVE_RETRY_S" >/dev/null 2>&1 &
      child=$!
      wait "$child" || true
    done
  ) &
  SERVE_CMD_PID=$!
}

# ---------------------------------------------------------------------------------------------------
# Heartbeats: the daemon's own counters, deltas since the previous heartbeat.

HB_SEQ=0 HB_PREV_DONE="" HB_PREV_FAILED="" HB_PREV_T=""
heartbeat() {
  local status="$FLEET_TMP_DIR/hb.status" metrics="$FLEET_TMP_DIR/hb.metrics" gpus="$FLEET_TMP_DIR/hb.gpus"
  local now_t n_done failed uptime busy status_error="" count sum interval d_done d_failed recent
  now_t=$(fleet_epoch)
  if ! timeout 30 cuzk-bench --addr "$FLEET_DAEMON_ADDR" status >"$status" 2>&1; then
    status_error=$(grep -v 'STAND-IN' "$status" | tr '\n' ' ' | head -c 500)
    status_error=${status_error:-cuzk-bench status failed}
  fi
  n_done=$(sed -n 's/^proofs completed:[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$status" | head -n 1)
  failed=$(sed -n 's/^proofs failed:[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$status" | head -n 1)
  uptime=$(sed -n 's/^uptime:[[:space:]]*\([0-9][0-9]*\)s.*/\1/p' "$status" | head -n 1)
  # Work queued or in progress: the GPU had a reason to be proving (an idle daemon says nothing about speed).
  busy=$(awk '/^Queues:/ { q = 1; next } q && /pending=/ { gsub(/[^0-9=,]/, ""); split($0, a, /[=,]/);
           if (a[2] + a[4] > 0) b = 1 } END { print (b ? "true" : "false") }' "$status")
  count="" sum=""
  if timeout 30 cuzk-bench --addr "$FLEET_DAEMON_ADDR" metrics >"$metrics" 2>/dev/null; then
    count=$(awk '/^cuzk_proof_duration_seconds_count/ { s += $NF } END { if (NR) print s + 0 }' "$metrics")
    sum=$(awk '/^cuzk_proof_duration_seconds_sum/ { s += $NF } END { if (NR) printf "%.3f", s + 0 }' "$metrics")
  fi
  recent=null
  if [[ -n $count && $count != 0 && -n $sum ]]; then
    recent=$(awk -v s="$sum" -v c="$count" 'BEGIN { printf "%.3f", s / c }')
  fi
  : >"$gpus"
  if command -v nvidia-smi >/dev/null 2>&1; then
    timeout 20 nvidia-smi --query-gpu=index,temperature.gpu,clocks.sm,clocks.max.sm,power.draw,utilization.gpu \
      --format=csv,noheader,nounits >"$gpus" 2>&1 || {
      status_error="${status_error:+$status_error; }nvidia-smi: $(tr '\n' ' ' <"$gpus" | head -c 300)"
      : >"$gpus"
    }
  fi
  interval=null d_done=null d_failed=null
  if [[ -n $HB_PREV_T ]]; then
    interval=$(awk -v a="$HB_PREV_T" -v b="$now_t" 'BEGIN { printf "%.3f", b - a }')
  fi
  # A counter that went down means the daemon restarted: count from zero.
  if [[ -n $n_done ]]; then
    d_done=$((n_done - ${HB_PREV_DONE:-0}))
    ((d_done >= 0)) || d_done=$n_done
  fi
  if [[ -n $failed ]]; then
    d_failed=$((failed - ${HB_PREV_FAILED:-0}))
    ((d_failed >= 0)) || d_failed=$failed
  fi
  HB_SEQ=$((HB_SEQ + 1))
  queue_event progress "heartbeat $HB_SEQ: ${d_done//null/?} proofs done, ${d_failed//null/?} failed since the last (${interval//null/first}s)" \
    "$(jq -cn --argjson seq "$HB_SEQ" --argjson interval "$interval" --argjson n_done "$d_done" \
      --argjson failed "$d_failed" --arg total "$n_done" --arg failed_total "$failed" --arg uptime "$uptime" \
      --argjson busy "$busy" --argjson recent "$recent" --arg error "$status_error" --rawfile gpus "$gpus" '
      def num: if . == null then null else (gsub("^\\s+|\\s+$"; "") | tonumber? // null) end;
      def opt: if . == "" then null else tonumber end;
      {heartbeat: {seq: $seq, interval_s: $interval, completed: $n_done, failed: $failed,
                   completed_total: ($total | opt), failed_total: ($failed_total | opt),
                   uptime_s: ($uptime | opt), busy: $busy, recent_proof_s: $recent,
                   status_error: (if $error == "" then null else $error[:1000] end),
                   gpus: ($gpus | split("\n") | map(select(test("^\\s*[0-9]"))) | .[:16] | map(split(",")) |
                          map({index: (.[0] | num), temperature_c: (.[1] | num), sm_clock_mhz: (.[2] | num),
                               max_sm_clock_mhz: (.[3] | num), power_w: (.[4] | num),
                               utilization_pct: (.[5] | num)}))}}')"
  [[ -n $n_done ]] && HB_PREV_DONE=$n_done
  [[ -n $failed ]] && HB_PREV_FAILED=$failed
  HB_PREV_T=$now_t
  return 0
}

# ---------------------------------------------------------------------------------------------------
# serve mode

STOP=""
trap 'STOP=${STOP:-TERM}; [[ -n $SLEEP_PID ]] && kill "$SLEEP_PID" 2>/dev/null; true' TERM
trap 'STOP=${STOP:-INT}; [[ -n $SLEEP_PID ]] && kill "$SLEEP_PID" 2>/dev/null; true' INT

stop_children() {
  local pid
  for pid in "${FORWARD_PIDS[@]}" "$SERVE_CMD_PID"; do
    [[ -n $pid ]] && fleet_kill_tree "$pid" TERM
  done
  for pid in "${FORWARD_PIDS[@]}" "$SERVE_CMD_PID"; do
    [[ -n $pid ]] && { wait "$pid" 2>/dev/null || true; }
  done
  FORWARD_PIDS=() SERVE_CMD_PID=""
}

daemon_alive() { [[ -z $FLEET_DAEMON_PID ]] || kill -0 "$FLEET_DAEMON_PID" 2>/dev/null; }

# The daemon holds work: its `cuzk-bench status` lists queues (curio extern/cuzk/cuzk-bench/src/main.rs:682-686,
# `  porep: pending=N, in_progress=M`) with a non-zero count. A status that cannot be read counts as busy:
# a drain never stops a machine on missing data.
daemon_busy() {
  local status="$FLEET_TMP_DIR/drain.status"
  timeout 30 cuzk-bench --addr "$FLEET_DAEMON_ADDR" status >"$status" 2>&1 || return 0
  awk '/^Queues:/ { q = 1; next } q && /pending=/ { gsub(/[^0-9=,]/, ""); split($0, a, /[=,]/);
       if (a[2] + a[4] > 0) b = 1 } END { exit (b ? 0 : 1) }' "$status"
}

# Drain: the pool shrinks and this machine goes (the worst $/proof first). Take no new work, let the daemon
# finish what it holds, then stop: never mid-proof. Returns when the controller says `serve` again.
drain() {
  local why started=$EPOCHSECONDS next how
  why=$(directive_reason)
  if [[ -n $FLEET_DRAIN_CMD ]]; then
    how="ran '$FLEET_DRAIN_CMD'"
    # shellcheck disable=SC2086  # a command line
    $FLEET_DRAIN_CMD > >(fleet_prefix "drain-cmd: ") 2>&1 || {
      how="'$FLEET_DRAIN_CMD' failed; stopped the serve command instead"
      stop_serve_cmd
    }
  else
    how="stopped the serve command"
    stop_serve_cmd
  fi
  fleet_log "serve: draining ($why): no new work ($how); waiting for the daemon's proofs to finish"
  queue_event progress "draining: no new work ($how); finishing the proofs in progress" \
    "$(jq -cn --arg why "$why" --arg how "$how" '{drain: {state: "started", reason: $why, how: $how}}')"
  flush_events
  next=$(awk -v t="$(fleet_epoch)" -v h="$FLEET_HEARTBEAT_S" 'BEGIN { printf "%.3f", t + h }')
  while daemon_busy; do
    [[ -z $STOP ]] || { heartbeat; finish 0 "stopped by SIG$STOP while draining"; }
    daemon_alive || finish "$SERVE_EXIT_DAEMON_GONE" ""
    if ((EPOCHSECONDS - started >= ${FLEET_DRAIN_MAX_S%.*})); then
      fleet_log "serve: still busy after FLEET_DRAIN_MAX_S=${FLEET_DRAIN_MAX_S}s of draining; stopping anyway"
      heartbeat
      finish 0 "drained: stopped after FLEET_DRAIN_MAX_S=${FLEET_DRAIN_MAX_S}s with work still queued ($why)"
    fi
    if awk -v t="$(fleet_epoch)" -v n="$next" 'BEGIN { exit !(t >= n) }'; then
      heartbeat
      next=$(awk -v t="$(fleet_epoch)" -v h="$FLEET_HEARTBEAT_S" 'BEGIN { printf "%.3f", t + h }')
      if [[ $(read_directive) == serve ]]; then
        undrain
        return 0
      fi
    fi
    flush_events
    pause "$(awk -v h="$FLEET_HEARTBEAT_S" 'BEGIN { print (h < 1 ? h : 1) }')"
  done
  heartbeat
  fleet_log "serve: drained: the daemon has no proofs left; stopping ($why)"
  finish 0 "drained: no proofs left in progress ($why)"
}

undrain() {
  if [[ -n $FLEET_UNDRAIN_CMD ]]; then
    # shellcheck disable=SC2086  # a command line
    $FLEET_UNDRAIN_CMD > >(fleet_prefix "undrain-cmd: ") 2>&1 || fleet_log "serve: '$FLEET_UNDRAIN_CMD' failed"
  fi
  [[ -n $SERVE_CMD_PID ]] || start_serve_cmd
  fleet_log "serve: drain cancelled by the controller: serving again ($(directive_reason))"
  queue_event progress "drain cancelled: serving again" '{"drain": {"state": "cancelled"}}'
}

stop_serve_cmd() {
  if [[ -n $SERVE_CMD_PID ]]; then
    fleet_kill_tree "$SERVE_CMD_PID" TERM
    wait "$SERVE_CMD_PID" 2>/dev/null || true
    SERVE_CMD_PID=""
  fi
}

finish() { # CODE MESSAGE
  stop_children
  [[ $1 == 0 ]] && queue_event "done" "$2" '{}'
  flush_events
  exit "$1"
}

# 1. The verdict. Old controllers (no directive route) and a silent controller mean: serve.
waited_from=$EPOCHSECONDS
action=none
while :; do
  action=$(read_directive)
  [[ $action == wait || $action == error ]] || break
  if ((EPOCHSECONDS - waited_from >= ${FLEET_VERDICT_WAIT_S%.*})); then
    fleet_log "serve: no verdict from the controller after ${FLEET_VERDICT_WAIT_S}s; serving (the controller can still stop this instance)"
    action=timeout
    break
  fi
  pause "$FLEET_DIRECTIVE_POLL_S"
  [[ -z $STOP ]] || finish 0 "stopped by SIG$STOP"
  daemon_alive || finish "$SERVE_EXIT_DAEMON_GONE" ""
done
if [[ $action == stop || $action == drain ]]; then
  fleet_log "serve: not serving: the controller's verdict is $(directive_reason)"
  finish 0 "not serving: controller verdict $(directive_reason)"
fi
if [[ $action == serve ]]; then
  # The spec's heartbeat interval (serving.heartbeat_minutes) comes with the verdict.
  hb=$(jq -r '.heartbeat_s // empty' "$DIRECTIVE_FILE" 2>/dev/null || true)
  if number "$hb" && [[ ! $hb =~ ^0+(\.0+)?$ ]]; then
    FLEET_HEARTBEAT_S=$hb
  fi
fi
case $action in
  serve) how="controller verdict: $(directive_reason)" ;;
  none) how="the controller gives no verdicts (no directive route); serving as before" ;;
  *) how="no verdict within FLEET_VERDICT_WAIT_S=${FLEET_VERDICT_WAIT_S}s" ;;
esac
queue_event started "cuzk-daemon keeps serving at $FLEET_DAEMON_ADDR ($how)" \
  "$(jq -cn --arg how "$action" --argjson hb "$FLEET_HEARTBEAT_S" --arg fw "$FLEET_FORWARDS" \
    '{verdict: $how, heartbeat_s: $hb, forwards: ($fw | split(" ") | map(select(. != "")))}')"
flush_events

# 2. Serve: forwards, the cluster's client, heartbeats; the directive is re-read at every heartbeat.
start_forwards
start_serve_cmd
heartbeat
flush_events
next_hb=$(awk -v t="$(fleet_epoch)" -v h="$FLEET_HEARTBEAT_S" 'BEGIN { printf "%.3f", t + h }')
while :; do
  [[ -z $STOP ]] || { heartbeat; finish 0 "stopped by SIG$STOP"; }
  if ! daemon_alive; then
    fleet_log "serve: cuzk-daemon (pid $FLEET_DAEMON_PID) is gone"
    finish "$SERVE_EXIT_DAEMON_GONE" ""
  fi
  if awk -v t="$(fleet_epoch)" -v n="$next_hb" 'BEGIN { exit !(t >= n) }'; then
    heartbeat
    next_hb=$(awk -v t="$next_hb" -v h="$FLEET_HEARTBEAT_S" -v now="$(fleet_epoch)" \
      'BEGIN { t += h; if (t < now) t = now + h; printf "%.3f", t }')
    case $(read_directive) in
      stop)
        fleet_log "serve: the controller stopped serving: $(directive_reason)"
        finish 0 "stopped by the controller: $(directive_reason)"
        ;;
      drain) drain ;;
    esac
  fi
  flush_events
  # Poll in short steps: the daemon's death and a TERM are noticed within a second.
  pause "$(awk -v h="$FLEET_HEARTBEAT_S" 'BEGIN { print (h < 1 ? h : 1) }')"
done

# shellcheck shell=bash disable=SC2034  # exit codes and paths here are used by the scripts sourcing this file
# Shared helpers for the worker scripts (entrypoint.sh, fetch-params.sh, benchmark.sh, log-shipper.sh).
#
# Place in the flow: every worker script sources this file. It knows the worker side of the report
# protocol (fleet-spec/schema/worker-protocol.v1.schema.json): how to build bodies with jq, how to POST
# them with the instance token and bounded retries, and where the local log ring lives.
#
# The log ring: everything the worker prints goes through `fleet_log_sink`, which numbers each line
# (seq), redacts the token, and appends it to segment files `$FLEET_STATE_DIR/ring/seg.<n>` of
# FLEET_RING_SEG lines each. Only the sink writes segments; only the shipper (log-shipper.sh) deletes them,
# so no locks are needed. The ring keeps about FLEET_LOG_RING_LINES lines; log tails for reports are
# read from it.

export TZ=UTC LC_ALL=C

: "${FLEET_STATE_DIR:=/var/lib/fleet-worker}"
: "${FLEET_LOG_RING_LINES:=2000}"
: "${FLEET_LOG_TAIL_LINES:=50}"
: "${FLEET_REPORT_ATTEMPTS:=4}"
: "${FLEET_RESULT_ATTEMPTS:=20}"
: "${FLEET_REPORT_RETRY_BASE_S:=1}"
: "${FLEET_REPORT_RETRY_CAP_S:=30}"
: "${FLEET_HTTP_CONNECT_TIMEOUT_S:=5}"
: "${FLEET_HTTP_MAX_TIME_S:=20}"
: "${FLEET_PROGRESS_INTERVAL_S:=30}"
export FLEET_STATE_DIR FLEET_LOG_RING_LINES FLEET_LOG_TAIL_LINES FLEET_REPORT_ATTEMPTS FLEET_RESULT_ATTEMPTS \
  FLEET_REPORT_RETRY_BASE_S FLEET_REPORT_RETRY_CAP_S FLEET_HTTP_CONNECT_TIMEOUT_S FLEET_HTTP_MAX_TIME_S \
  FLEET_PROGRESS_INTERVAL_S

FLEET_RING_DIR="$FLEET_STATE_DIR/ring"
FLEET_TMP_DIR="$FLEET_STATE_DIR/tmp"
FLEET_AUTH_HEADER_FILE="$FLEET_STATE_DIR/auth.header"
FLEET_FAILURE_MESSAGE_FILE="$FLEET_STATE_DIR/failure.message"
# Lines per ring segment: the shipper deletes whole segments, so the ring holds at most
# FLEET_LOG_RING_LINES + FLEET_RING_SEG lines.
FLEET_RING_SEG=$((FLEET_LOG_RING_LINES / 4))
((FLEET_RING_SEG >= 1)) || FLEET_RING_SEG=1

# Exit codes the worker uses for its own failures (a failing command's own code is passed through).
readonly FLEET_EXIT_CONFIG=64     # missing/bad environment
readonly FLEET_EXIT_DATA=65       # checksum mismatch, bad manifest
readonly FLEET_EXIT_NOINPUT=66    # benchmark input (c1.json) missing
readonly FLEET_EXIT_UNAVAILABLE=69  # no way to fetch params
readonly FLEET_EXIT_SOFTWARE=70   # a tool exited 0 but produced no usable output
readonly FLEET_EXIT_TIMEOUT=124   # a deadline passed (same code as coreutils timeout)

fleet_now() { printf '%(%Y-%m-%dT%H:%M:%SZ)T' -1; }

fleet_log() { printf 'fleet: %s\n' "$*"; }

# Record why the current step fails (the entrypoint's trap puts it in the failure event), then exit.
fleet_fail() {
  local code=$1
  shift
  fleet_log "ERROR: $*"
  mkdir -p "$FLEET_STATE_DIR"
  printf '%s\n' "$*" >"$FLEET_FAILURE_MESSAGE_FILE"
  exit "$code"
}

fleet_init_state() {
  mkdir -p "$FLEET_STATE_DIR" "$FLEET_RING_DIR" "$FLEET_TMP_DIR"
  chmod 700 "$FLEET_STATE_DIR"
  # The token goes to curl through a file, never on a command line (visible in ps) or in the log.
  (umask 077 && printf 'Authorization: Bearer %s\n' "$FLEET_TOKEN" >"$FLEET_AUTH_HEADER_FILE")
  rm -f "$FLEET_FAILURE_MESSAGE_FILE"
}

# ---------------------------------------------------------------------------------------------------
# Log ring

fleet_ring_segments() {
  local f
  for f in "$FLEET_RING_DIR"/seg.*; do
    [[ -e $f ]] && printf '%s\n' "$f"
  done
  return 0
}

# Reads lines on stdin until EOF; appends them to the ring and copies them to fd 3 (the container's
# stdout). Runs as the single writer of the ring.
fleet_log_sink() {
  local line seq=0 ts last seg
  # The sink must outlive the scripts writing to it (it stops at EOF), and never die on a bad write.
  trap '' TERM INT
  set +e
  last=$(fleet_ring_segments | tail -n 1)
  if [[ -n $last ]]; then
    # A restarted worker continues the numbering so the shipper's position stays meaningful.
    seq=$(tail -n 1 "$last" | cut -f1)
    [[ $seq =~ ^[0-9]+$ ]] || seq=0
  fi
  while IFS= read -r line || [[ -n $line ]]; do
    line=${line//$'\r'/}
    if [[ -n ${FLEET_TOKEN:-} ]]; then
      line=${line//"$FLEET_TOKEN"/[redacted]}
    fi
    line=${line:0:4000}
    printf -v ts '%(%Y-%m-%dT%H:%M:%SZ)T' -1
    seq=$((seq + 1))
    printf -v seg '%s/seg.%012d' "$FLEET_RING_DIR" $(((seq - 1) / FLEET_RING_SEG))
    printf '%s\t%s %s\n' "$seq" "$ts" "$line" >>"$seg"
    printf '%s %s\n' "$ts" "$line" >&3
  done
}

# Last N lines of the ring (oldest first), optionally only those containing a fixed string.
fleet_log_tail() {
  local n=${1:-$FLEET_LOG_TAIL_LINES} filter=${2:-} segs
  mapfile -t segs < <(fleet_ring_segments)
  ((${#segs[@]} > 0)) || return 0
  if [[ -n $filter ]]; then
    cat "${segs[@]}" 2>/dev/null | cut -f2- | grep -F -- "$filter" | tail -n "$n" || true
  else
    cat "${segs[@]}" 2>/dev/null | cut -f2- | tail -n "$n" || true
  fi
}

# Print a log line and wait (bounded) until the sink has written it, so a log tail taken right after
# includes everything printed before.
fleet_log_checkpoint() {
  local text="fleet: $* [checkpoint $RANDOM$RANDOM]" i last
  printf '%s\n' "$text"
  for ((i = 0; i < 150; i++)); do
    last=$(fleet_ring_segments | tail -n 1)
    if [[ -n $last ]] && grep -qF -- "$text" "$last"; then
      return 0
    fi
    sleep 0.02
  done
  return 0
}

# ---------------------------------------------------------------------------------------------------
# Reports

fleet_backoff_delay() { # attempt_index -> seconds (jittered, capped)
  awk -v b="$FLEET_REPORT_RETRY_BASE_S" -v k="$1" -v c="$FLEET_REPORT_RETRY_CAP_S" -v r="$RANDOM" \
    'BEGIN { d = b * 2 ^ k; if (d > c) d = c; printf "%.3f", d * (0.5 + r / 65536) }'
}

# POST a JSON body file to one protocol endpoint. Temporary failures (no connection, 5xx, 408, 429)
# are retried with jittered backoff up to `attempts` times; other 4xx are permanent.
# Returns 0 delivered, 1 gave up (controller unreachable), 2 rejected. Never exits the caller.
# With quiet=1 only the final outcome is logged (the log shipper: its own lines would feed the ring).
fleet_post() {
  local endpoint=$1 body=$2 attempts=${3:-$FLEET_REPORT_ATTEMPTS} quiet=${4:-0}
  local url="${FLEET_CONTROLLER_URL%/}/api/v1/instances/$FLEET_INSTANCE_ID/$endpoint"
  local resp="$FLEET_TMP_DIR/resp.$BASHPID" code k=0 delay why
  while :; do
    code=$(curl -sS -o "$resp" -w '%{http_code}' \
      --connect-timeout "$FLEET_HTTP_CONNECT_TIMEOUT_S" --max-time "$FLEET_HTTP_MAX_TIME_S" \
      -H "@$FLEET_AUTH_HEADER_FILE" -H 'Content-Type: application/json' \
      --data-binary "@$body" "$url" 2>"$resp.err") || true
    case $code in
      2??)
        rm -f "$resp" "$resp.err"
        return 0
        ;;
      408 | 429) ;;
      4??)
        fleet_log "controller rejected POST $endpoint with HTTP $code: $(head -c 300 "$resp" 2>/dev/null | tr '\n' ' ')"
        rm -f "$resp" "$resp.err"
        return 2
        ;;
    esac
    if [[ $code == 000 || -z $code ]]; then
      why=$(tr '\n' ' ' <"$resp.err" 2>/dev/null | head -c 200)
      why=${why:-no response}
    else
      why="HTTP $code"
    fi
    k=$((k + 1))
    if ((k >= attempts)); then
      fleet_log "controller unreachable: gave up POST $endpoint after $k attempts ($why)"
      rm -f "$resp" "$resp.err"
      return 1
    fi
    delay=$(fleet_backoff_delay "$((k - 1))")
    ((quiet)) || fleet_log "controller unreachable: POST $endpoint attempt $k/$attempts failed ($why); retrying in ${delay}s"
    sleep "$delay"
  done
}

# fleet_event PHASE STATUS [--message M] [--exit-code N] [--details JSON] [--tail N] [--tail-filter S]
#             [--attempts N]
# Builds an `event` body and POSTs it. Never fails the caller: a controller outage must not fail a phase.
fleet_event() {
  local phase=$1 status=$2
  shift 2
  local message="" exit_code="" details="null" tail_n=0 tail_filter="" attempts=$FLEET_REPORT_ATTEMPTS
  while (($#)); do
    case $1 in
      --message) message=$2 ;;
      --exit-code) exit_code=$2 ;;
      --details) details=$2 ;;
      --tail) tail_n=$2 ;;
      --tail-filter) tail_filter=$2 ;;
      --attempts) attempts=$2 ;;
      *) fleet_log "fleet_event: unknown option $1" && return 0 ;;
    esac
    shift 2
  done
  local body="$FLEET_TMP_DIR/event.$BASHPID.json" tailfile="$FLEET_TMP_DIR/tail.$BASHPID"
  if ((tail_n > 0)); then
    fleet_log_tail "$tail_n" "$tail_filter" >"$tailfile"
  else
    : >"$tailfile"
  fi
  if ! jq -n --arg phase "$phase" --arg status "$status" --arg at "$(fleet_now)" \
    --arg message "$message" --arg exit_code "$exit_code" --argjson details "$details" \
    --rawfile tail "$tailfile" --argjson with_tail "$((tail_n > 0))" '
      {protocol: 1, phase: $phase, status: $status, at: $at}
      + (if $message != "" then {message: $message[:4096]} else {} end)
      + (if $exit_code != "" then {exit_code: ($exit_code | tonumber)} else {} end)
      + (if $details != null then {details: $details} else {} end)
      + (if $with_tail == 1 then {log_tail: ($tail | rtrimstr("\n") | if . == "" then [] else split("\n") end)}
         else {} end)' >"$body"; then
    fleet_log "could not build the $phase/$status event body (jq failed); not sent"
    rm -f "$tailfile"
    return 0
  fi
  rm -f "$tailfile"
  fleet_post events "$body" "$attempts" || true
  rm -f "$body"
  return 0
}

# Copy stdin to stdout with a prefix on every line (names the source of lines in the shared log).
fleet_prefix() {
  local line
  while IFS= read -r line || [[ -n $line ]]; do
    printf '%s%s\n' "$1" "${line//$'\r'/}"
  done
}

# Signal a process and all its descendants (the worker's own children only: found through
# /proc/<pid>/task/<pid>/children, deepest first so nothing respawns).
fleet_kill_tree() {
  local pid=$1 sig=${2:-TERM} child
  [[ -n $pid ]] || return 0
  # shellcheck disable=SC2013  # the file is one line of space-separated pids
  for child in $(cat "/proc/$pid/task/$pid/children" 2>/dev/null); do
    fleet_kill_tree "$child" "$sig"
  done
  kill "-$sig" "$pid" 2>/dev/null || true
}

# Seconds since the epoch with fractions (bash 5 builtin; no fork).
fleet_epoch() { printf '%s' "${EPOCHREALTIME/,/.}"; }

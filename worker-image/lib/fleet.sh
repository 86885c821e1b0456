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
# Present once the controller accepted this worker's registration: the controller answers 404 "unknown
# instance" to anything else before that, so the log shipper waits for it (log-shipper.sh).
FLEET_REGISTERED_FILE="$FLEET_STATE_DIR/registered"
# Lines per ring segment: the shipper deletes whole segments, so the ring holds at most
# FLEET_LOG_RING_LINES + FLEET_RING_SEG lines.
FLEET_RING_SEG=$((FLEET_LOG_RING_LINES / 4))
((FLEET_RING_SEG >= 1)) || FLEET_RING_SEG=1

# Exit codes the worker uses for its own failures (a failing command's own code is passed through): one table with
# the judge, generated from reconciler/domain/exit_statuses.py WORKER_EXITS (FLEET_EXIT_CONFIG, _DATA, ...).
# shellcheck source=exit-codes.sh
. "$(dirname "${BASH_SOURCE[0]}")/exit-codes.sh"

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
  rm -f "$FLEET_FAILURE_MESSAGE_FILE" "$FLEET_REGISTERED_FILE"
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

# aria2c's progress readout as it lands in the ring (`<ts> [#26a862 38GiB/56GiB(67%) CN:16 DL:408MiB ETA:46s]`,
# aria2 src/ConsoleStatCalc.cc): hundreds of them in a long download, never a cause.
FLEET_PROGRESS_LINE='^[^ ]+ \[#[0-9a-fA-F]+ [^]]*\]$'

# Last N lines of the ring (oldest first) without aria2c's progress lines, optionally only those containing a
# fixed string: a failure's evidence. Progress lines are dropped, not errors: a download error followed by a
# flood of progress lines stays in the tail (issue 23 item 3).
fleet_log_tail() {
  local n=${1:-$FLEET_LOG_TAIL_LINES} filter=${2:-} segs
  mapfile -t segs < <(fleet_ring_segments)
  ((${#segs[@]} > 0)) || return 0
  cat "${segs[@]}" 2>/dev/null | cut -f2- | grep -v -E -- "$FLEET_PROGRESS_LINE" |
    { if [[ -n $filter ]]; then grep -F -- "$filter"; else cat; fi; } | tail -n "$n" || true
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

# ---------------------------------------------------------------------------------------------------
# cuzk (facts: worker-image/README.md "Real cuzk output", curio e0294b0f)

# The daemon's own log, as it joins the evidence: ANSI colour stripped (tracing-subscriber colours even
# into a pipe unless NO_COLOR is set), timing noise and per-partition chatter dropped (CUZK_TIMING /
# CUZK_NTT_H from supraseal-c2's C++ on stderr, TIMELINE from cuzk-core engine.rs:349-353, FIN_TIMING /
# GPU_TIMING / pacer INFO lines). Line-buffered so a crash loses nothing.
FLEET_DAEMON_NOISE='CUZK_TIMING:|CUZK_NTT_H:|^TIMELINE,|FIN_TIMING|GPU_TIMING| pacer: |partition GPU prove complete|partition synthesis complete'
fleet_daemon_filter() { # pure bash: no buffering, and nothing a minimal base's busybox lacks
  local line
  shopt -s extglob
  while IFS= read -r line || [[ -n $line ]]; do
    line=${line//$'\e['*([0-9;])[A-Za-z]/}
    [[ $line =~ $FLEET_DAEMON_NOISE ]] && continue
    printf '%s\n' "$line"
  done
}

# The daemon binary: curio's `make cuzk` installs cuzk-daemon as `cuzk`; a cargo build names it cuzk-daemon.
fleet_daemon_bin() {
  command -v cuzk-daemon 2>/dev/null || command -v cuzk 2>/dev/null || return 1
}

# The cgroup's memory.events oom_kill counter (cgroup v2), or nothing.
fleet_oom_kills() {
  local dir=${FLEET_CGROUP_DIR:-/sys/fs/cgroup}
  awk '$1 == "oom_kill" { print $2; exit }' "$dir/memory.events" 2>/dev/null || true
}

# The memory budget for cuzk-daemon ([memory] total_budget). The daemon's "auto" reads the HOST's
# /proc/meminfo MemTotal (cuzk-core memory.rs:88-100), so in a container slice it overcommits and is
# OOM-killed: the worker sets it from the container's limit instead. Order: the spec's value
# (FLEET_MEMORY_BUDGET_GIB) capped by the limit; else the cgroup limit (v2 memory.max, v1
# memory.limit_in_bytes) minus a margin; else MemTotal minus the margin. Margin: the larger of
# FLEET_MEMORY_MARGIN_GIB (default 5, the daemon's own safety_margin) and 10% (page cache, the worker).
# Sets MEM_BUDGET_BYTES MEM_SOURCE MEM_LIMIT_BYTES MEM_HOST_BYTES.
fleet_memory_budget() {
  local dir=${FLEET_CGROUP_DIR:-/sys/fs/cgroup} v limit="" source="" margin gib=1073741824 spec_bytes=""
  MEM_HOST_BYTES=$(awk '/^MemTotal:/ { printf "%.0f", $2 * 1024; exit }' "${FLEET_MEMINFO:-/proc/meminfo}" 2>/dev/null)
  [[ $MEM_HOST_BYTES =~ ^[0-9]+$ ]] || MEM_HOST_BYTES=""
  if [[ -r $dir/memory.max ]]; then
    read -r v <"$dir/memory.max" || v=""
    [[ $v =~ ^[0-9]+$ ]] && limit=$v source=cgroup-v2
  fi
  if [[ -z $limit ]]; then
    for f in "$dir/memory.limit_in_bytes" "$dir/memory/memory.limit_in_bytes"; do
      [[ -r $f ]] || continue
      read -r v <"$f" || v=""
      # v1 reports "no limit" as a huge number (PAGE_COUNTER_MAX pages)
      if [[ $v =~ ^[0-9]+$ ]] && ((${#v} < 19)) && { [[ -z $MEM_HOST_BYTES ]] || ((v < MEM_HOST_BYTES)); }; then
        limit=$v source=cgroup-v1
      fi
      break
    done
  fi
  if [[ -z $limit && -n $MEM_HOST_BYTES ]]; then
    limit=$MEM_HOST_BYTES source=host
  fi
  MEM_LIMIT_BYTES=$limit
  if [[ -n ${FLEET_MEMORY_BUDGET_GIB:-} ]]; then
    [[ $FLEET_MEMORY_BUDGET_GIB =~ ^[1-9][0-9]*$ ]] || return 1
    spec_bytes=$((FLEET_MEMORY_BUDGET_GIB * gib))
  fi
  if [[ -z $limit ]]; then
    [[ -n $spec_bytes ]] || return 1
    MEM_BUDGET_BYTES=$spec_bytes MEM_SOURCE=spec
    return 0
  fi
  margin=$((${FLEET_MEMORY_MARGIN_GIB:-5} * gib))
  ((limit / 10 > margin)) && margin=$((limit / 10))
  MEM_BUDGET_BYTES=$((limit > margin ? limit - margin : 0))
  MEM_SOURCE=$source
  if [[ -n $spec_bytes ]] && ((spec_bytes <= MEM_BUDGET_BYTES)); then
    MEM_BUDGET_BYTES=$spec_bytes MEM_SOURCE=spec
  fi
  return 0
}

# SectorNum of a lotus-bench Commit2In c1.json (what --sector-num must match), or nothing.
fleet_c1_sector_num() {
  jq -r 'if type == "object" and (.SectorNum | type) == "number" then .SectorNum else empty end' "$1" 2>/dev/null || true
}

# The porep circuit preloaded for the benchmark's sector size.
fleet_circuit_id() {
  case ${FLEET_PARAMS_SECTOR_SIZE:-32GiB} in
    64GiB | 64G | 68719476736) echo porep-64g ;;
    *) echo porep-32g ;;
  esac
}

# Per-proof results as TSV: index label seconds prove_ms queue_ms request_id reason.
# $1: cuzk-bench's output; $2: the daemon's filtered log lines written during that run (often empty: at
# RUST_LOG=warn a healthy daemon logs nothing, so the file is told apart by name, never by awk's FNR == NR,
# which holds for the bench's own lines too when the first file is empty). The i-th
# `Prove request_id=` line of the daemon is proof i (requests are submitted in index order); a proof that
# did not complete gets the daemon's ERROR line naming its job_id, else the next unclaimed ERROR line
# without one (GPU panics and SRS failures name no job), else the allocator's/kernel's last words.
fleet_proof_results() {
  awk -F '\t' -v OFS='\t' -v daemon_file="$2" '
    function field(line, key,   m) {
      if (match(line, key "=[^ ]+")) return substr(line, RSTART + length(key) + 1, RLENGTH - length(key) - 1)
      return ""
    }
    FILENAME == daemon_file {
      line = $0
      if (line ~ /Prove request_id=/) { ids[++nid] = field(line, "request_id"); next }
      if (line ~ /^[^ ]+ +ERROR / && line !~ /per-partition verification/) {
        msg = line; sub(/^[^ ]+ +ERROR +[^ ]+: /, "", msg)
        job = field(line, "job_id")
        err = ""
        if (match(msg, / error=.*/)) { err = substr(msg, RSTART + 7); msg = substr(msg, 1, RSTART - 1) }
        gsub(/ (job_id|proof_len|partition)=[^ ]+/, "", msg)
        ne++; ev_job[ne] = job; ev_text[ne] = (err != "" ? msg ": " err : msg)
        next
      }
      if (line ~ /^memory allocation of [0-9]+ bytes failed/ || line ~ /Killed/) { ne++; ev_job[ne] = ""; ev_text[ne] = line }
      next
    }
    match($0, /\[[0-9]+\/[0-9]+\][ \t]+[A-Za-z]+/) {
      head = substr($0, RSTART + 1, RLENGTH - 1)
      split(head, parts, /[]\/ \t]+/)
      idx = parts[1] + 0; label = parts[3]
      if (label == "ok" || label == "OK") label = "COMPLETED"
      secs = ""; prove = ""; queue = ""
      if (match($0, /[0-9]+(\.[0-9]+)?s \(/)) secs = substr($0, RSTART, RLENGTH - 3)
      if (match($0, /prove=[0-9]+/)) prove = substr($0, RSTART + 6, RLENGTH - 6)
      if (match($0, /queue=[0-9]+/)) queue = substr($0, RSTART + 6, RLENGTH - 6)
      rid = (idx in ids) ? ids[idx] : ""
      reason = ""
      if (label != "COMPLETED") {
        for (k = 1; k <= ne && reason == ""; k++) if (!used[k] && rid != "" && ev_job[k] == rid) { used[k] = 1; reason = ev_text[k] }
        for (k = 1; k <= ne && reason == ""; k++) if (!used[k] && ev_job[k] == "") { used[k] = 1; reason = ev_text[k] }
      }
      gsub(/\t/, " ", reason)
      print idx, label, secs, prove, queue, rid, substr(reason, 1, 1024)
    }' "$2" "$1"
}

# TSV from fleet_proof_results -> JSON array for the result's `proofs`.
fleet_proofs_json() {
  jq -R -s '
    def num: if . == "" then null else tonumber end;
    [split("\n")[] | select(. != "") | split("\t")
     | {index: (.[0] | tonumber), label: (if (.[1] | IN("COMPLETED","FAILED","CANCELLED","TIMEOUT")) then .[1] else "UNKNOWN" end),
        seconds: (.[2] | num), prove_ms: (.[3] | num), queue_ms: (.[4] | num),
        request_id: (if .[5] == "" then null else .[5][:64] end), reason: (if (.[6] // "") == "" then null else .[6] end)}]' "$1"
}

# Tagged, filtered daemon log tail for the evidence: the last N lines of $FLEET_STATE_DIR/daemon.log.
fleet_daemon_tail_json() { # N
  local f="$FLEET_STATE_DIR/daemon.log"
  if [[ -f $f ]]; then
    tail -n "${1:-$FLEET_LOG_TAIL_LINES}" "$f" | jq -R -s --arg t "${FLEET_TOKEN:-}" \
      '[split("\n")[] | select(. != "") | (if $t != "" then gsub($t; "[redacted]") else . end) | "cuzk-daemon: " + .[:4000]]'
  else
    echo '[]'
  fi
}

# If the daemon is gone, one line saying how it ended (exit code, signal, cgroup OOM kills), else nothing.
fleet_daemon_epitaph() {
  local f="$FLEET_STATE_DIR/daemon.exit" rc kills before sig=""
  [[ -f $f ]] || return 0
  read -r rc <"$f" || return 0
  ((rc > 128)) && sig=" (killed by $(kill -l $((rc - 128)) 2>/dev/null | sed 's/^/SIG/'))"
  before=$(cat "$FLEET_STATE_DIR/oom_kill.start" 2>/dev/null || true)
  kills=$(fleet_oom_kills)
  if [[ -n $kills && -n $before && $kills -gt $before ]]; then
    printf 'fleet: cuzk-daemon exited with code %s%s; cgroup memory.events oom_kill %s -> %s: the kernel OOM killer ended it (out of memory)\n' "$rc" "$sig" "$before" "$kills"
  else
    printf 'fleet: cuzk-daemon exited with code %s%s\n' "$rc" "$sig"
  fi
}

# The benchmark input: FLEET_BENCH_C1, else c1.json in the params dir or the image. Sets FLEET_C1 or fails.
fleet_find_c1() {
  local candidate
  FLEET_C1=${FLEET_BENCH_C1:-}
  if [[ -z $FLEET_C1 ]]; then
    for candidate in "${FLEET_PARAMS_DIR:-/var/tmp/filecoin-proof-parameters}/c1.json" "${FLEET_HOME:-.}/c1.json"; do
      if [[ -f $candidate ]]; then FLEET_C1=$candidate && break; fi
    done
  fi
  [[ -n $FLEET_C1 && -f $FLEET_C1 ]]
}

# --sector-num / --miner-id for cuzk-bench: they must match c1.json (cuzk-bench defaults 1 and 1000,
# extern/cuzk/cuzk-bench/src/main.rs:115-121; a mismatch fails every proof's self-check). Sector from
# FLEET_BENCH_SECTOR_NUM, else c1.json's SectorNum, else 1; miner from FLEET_BENCH_MINER_ID, else 1000.
fleet_sector_miner() { # C1 -> sets FLEET_SECTOR_NUM FLEET_MINER_ID
  FLEET_SECTOR_NUM=${FLEET_BENCH_SECTOR_NUM:-$(fleet_c1_sector_num "$1")}
  FLEET_SECTOR_NUM=${FLEET_SECTOR_NUM:-1}
  FLEET_MINER_ID=${FLEET_BENCH_MINER_ID:-1000}
  [[ $FLEET_SECTOR_NUM =~ ^[0-9]+$ && $FLEET_MINER_ID =~ ^[0-9]+$ ]]
}

# fleet_write_result OUTCOME EXIT_CODE COMPLETED FAILED PPH SPP BENCH_LOG [PROOFS_JSON_FILE]
# Writes $FLEET_STATE_DIR/result.json (protocol `result`): cuzk-bench's output tail, the per-proof results,
# the warm-up, the filtered daemon log tail, the memory budget, sector/miner.
fleet_write_result() {
  local out="$FLEET_STATE_DIR/result.json" tail="$FLEET_TMP_DIR/result.tail" requested=0 proofs=${8:-}
  local warm="$FLEET_STATE_DIR/warmup.json" mem="$FLEET_STATE_DIR/memory.json" dtail="$FLEET_TMP_DIR/daemon.tail.json"
  [[ ${FLEET_BENCH_PROOFS:-} =~ ^[0-9]+$ ]] && requested=$FLEET_BENCH_PROOFS
  if [[ -f $7 ]]; then tail -n "$FLEET_LOG_TAIL_LINES" "$7" >"$tail"; else : >"$tail"; fi
  [[ -n $proofs && -f $proofs ]] || { proofs="$FLEET_TMP_DIR/proofs.empty.json" && echo '[]' >"$proofs"; }
  [[ -f $warm ]] || warm=/dev/null
  [[ -f $mem ]] || mem=/dev/null
  fleet_daemon_tail_json "$FLEET_LOG_TAIL_LINES" >"$dtail"
  jq -n --arg outcome "$1" --argjson exit_code "$2" --argjson completed "$3" --argjson failed "$4" \
    --argjson pph "$5" --argjson spp "$6" --arg at "$(fleet_now)" --arg started_at "${FLEET_BENCH_STARTED_AT:-$(fleet_now)}" \
    --argjson requested "$requested" --arg proof_type "${FLEET_BENCH_PROOF_TYPE:-porep}" \
    --arg concurrency "${FLEET_BENCH_CONCURRENCY:-}" --arg digest "${FLEET_IMAGE_DIGEST:-}" --rawfile tail "$tail" \
    --slurpfile proofs "$proofs" --slurpfile warm "$warm" --slurpfile mem "$mem" --slurpfile dtail "$dtail" \
    --arg sector "${FLEET_SECTOR_NUM:-}" --arg miner "${FLEET_MINER_ID:-}" '
    ($warm[0] // null) as $w |
    {protocol: 1, outcome: $outcome, at: $at, started_at: $started_at, exit_code: $exit_code,
     requested: $requested, completed: $completed, failed: $failed,
     proofs_per_hour: $pph, seconds_per_proof: $spp,
     proof_type: ($proof_type[:32]),
     concurrency: ($concurrency | if test("^[1-9][0-9]*$") then tonumber else null end),
     image_digest: (if $digest == "" then null else $digest[:128] end),
     log_tail: ($tail | rtrimstr("\n") | if . == "" then [] else split("\n") end),
     proofs: ($proofs[0] // [])[:1000],
     warmup: $w,
     warmup_seconds: (if $w == null then null else (($w.preload_seconds // 0) + ($w.seconds // 0)) end),
     daemon_log_tail: ($dtail[0] // []),
     memory: ($mem[0] // null),
     sector_num: ($sector | tonumber? // null), miner_id: ($miner | tonumber? // null)}' >"$out.tmp"
  mv -f "$out.tmp" "$out"
  rm -f "$tail" "$dtail"
}

# NVIDIA Xid lines from the kernel log, as evidence next to a GPU failure (a container sees only the CUDA
# error an Xid causes; the Xid number says whose fault it is). FLEET_KERNEL_LOG_FILE if set, else dmesg when
# the container may read it (often it may not: then nothing).
fleet_kernel_xids() {
  local src=${FLEET_KERNEL_LOG_FILE:-}
  {
    if [[ -n $src ]]; then
      [[ -r $src ]] && grep -a 'NVRM: Xid' "$src"
    else
      timeout 5 dmesg 2>/dev/null | grep -a 'NVRM: Xid'
    fi
  } 2>/dev/null | tail -n 5 | sed 's/^/kernel: /' || true
}

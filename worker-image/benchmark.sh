#!/usr/bin/env bash
# Benchmark phase: run `cuzk-bench batch` once, under a deadline, and turn its output into a `result`.
#
# Place in the flow: run by entrypoint.sh once the daemon answers. Writes the result body to
# $FLEET_STATE_DIR/result.json in every case it can (the entrypoint POSTs it), sends progress events
# while proofs complete, and exits:
#   0    outcome completed: the summary block has a throughput line;
#   124  outcome timeout: killed at FLEET_BENCH_TIMEOUT_S; the proofs finished so far are counted and,
#        if any, proofs/hour is computed from them over the elapsed time;
#   N    outcome error: cuzk-bench exited N != 0; or 70 when it exited 0 without a throughput line.
# cuzk-bench output: per proof `  [i/N] ok — 12.3s ...` (COMPLETED in newer builds; any other label is a
# failed proof), then `=== Batch Summary ===`, `completed: N`, `failed: N`,
# `throughput:    X.XXX proofs/min (Y.Ys/proof)`; proofs/hour = 3600 / (s/proof).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/fleet.sh
. "$HERE/lib/fleet.sh"

: "${FLEET_BENCH_PROOF_TYPE:=porep}"
: "${FLEET_BENCH_PROOFS:=10}"
: "${FLEET_BENCH_CONCURRENCY:=1}"
: "${FLEET_BENCH_TIMEOUT_S:=3600}"
: "${FLEET_PARAMS_DIR:=/var/tmp/filecoin-proof-parameters}"
: "${FLEET_HOME:=$HERE}"
: "${FLEET_DAEMON_ADDR:=http://127.0.0.1:9820}"
: "${FLEET_IMAGE_DIGEST:=}"

RESULT_FILE="$FLEET_STATE_DIR/result.json"
BENCH_LOG="$FLEET_STATE_DIR/bench.log"
rm -f "$RESULT_FILE"
: >"$BENCH_LOG"
started_at=$(fleet_now)
t0=$(fleet_epoch)

# write_result OUTCOME EXIT_CODE COMPLETED FAILED PROOFS_PER_HOUR SECONDS_PER_PROOF (numbers or "null")
write_result() {
  local tail="$FLEET_TMP_DIR/bench.tail" requested=0
  [[ $FLEET_BENCH_PROOFS =~ ^[0-9]+$ ]] && requested=$FLEET_BENCH_PROOFS
  tail -n "$FLEET_LOG_TAIL_LINES" "$BENCH_LOG" >"$tail"
  jq -n --arg outcome "$1" --argjson exit_code "$2" --argjson completed "$3" --argjson failed "$4" \
    --argjson pph "$5" --argjson spp "$6" --arg at "$(fleet_now)" --arg started_at "$started_at" \
    --argjson requested "$requested" --arg proof_type "$FLEET_BENCH_PROOF_TYPE" \
    --arg concurrency "$FLEET_BENCH_CONCURRENCY" --arg digest "$FLEET_IMAGE_DIGEST" --rawfile tail "$tail" '
    {protocol: 1, outcome: $outcome, at: $at, started_at: $started_at, exit_code: $exit_code,
     requested: $requested, completed: $completed, failed: $failed,
     proofs_per_hour: $pph, seconds_per_proof: $spp,
     proof_type: ($proof_type[:32]),
     concurrency: ($concurrency | if test("^[1-9][0-9]*$") then tonumber else null end),
     image_digest: (if $digest == "" then null else $digest[:128] end),
     log_tail: ($tail | rtrimstr("\n") | if . == "" then [] else split("\n") end)}' >"$RESULT_FILE.tmp"
  mv -f "$RESULT_FILE.tmp" "$RESULT_FILE"
  rm -f "$tail"
}

# A configuration problem is still a benchmark result (outcome error): the controller must see it.
bench_config_error() {
  printf 'fleet: %s\n' "$*" >>"$BENCH_LOG"
  write_result error "$FLEET_EXIT_CONFIG" 0 0 null null
  fleet_fail "$FLEET_EXIT_CONFIG" "$*"
}
[[ $FLEET_BENCH_PROOFS =~ ^[1-9][0-9]*$ ]] || bench_config_error "FLEET_BENCH_PROOFS must be a positive integer, got '$FLEET_BENCH_PROOFS'"
[[ $FLEET_BENCH_CONCURRENCY =~ ^[1-9][0-9]*$ ]] || bench_config_error "FLEET_BENCH_CONCURRENCY must be a positive integer, got '$FLEET_BENCH_CONCURRENCY'"
[[ $FLEET_BENCH_TIMEOUT_S =~ ^[0-9]+(\.[0-9]+)?$ && $FLEET_BENCH_TIMEOUT_S != 0 ]] || bench_config_error "FLEET_BENCH_TIMEOUT_S must be a positive number of seconds, got '$FLEET_BENCH_TIMEOUT_S'"

c1=${FLEET_BENCH_C1:-}
if [[ -z $c1 ]]; then
  for candidate in "$FLEET_PARAMS_DIR/c1.json" "$FLEET_HOME/c1.json"; do
    if [[ -f $candidate ]]; then c1=$candidate && break; fi
  done
fi
if [[ -z $c1 || ! -f $c1 ]]; then
  printf 'fleet: benchmark input missing: %s\n' "${c1:-no FLEET_BENCH_C1 and no c1.json in $FLEET_PARAMS_DIR or $FLEET_HOME}" >>"$BENCH_LOG"
  cat "$BENCH_LOG"
  write_result error "$FLEET_EXIT_NOINPUT" 0 0 null null
  fleet_fail "$FLEET_EXIT_NOINPUT" "benchmark input (c1.json) missing: ${c1:-set FLEET_BENCH_C1 or ship c1.json in the params mirror}"
fi

# Copies cuzk-bench output to the log and bench.log; sends progress events at a bounded rate, at
# most one in flight (a slow controller must not stall the benchmark's output pipe).
follow_bench() {
  local line ok=0 bad=0 last_sent=$EPOCHSECONDS poster=""
  while IFS= read -r line || [[ -n $line ]]; do
    line=${line//$'\r'/}
    [[ -n ${FLEET_TOKEN:-} ]] && line=${line//"$FLEET_TOKEN"/[redacted]}
    printf '%s\n' "$line"
    printf '%s\n' "${line:0:4000}" >>"$BENCH_LOG"
    if [[ $line =~ ^[[:space:]]*\[[0-9]+/[0-9]+\][[:space:]]+([A-Za-z]+)[[:space:]] ]]; then
      case ${BASH_REMATCH[1]} in
        ok | OK | COMPLETED) ok=$((ok + 1)) ;;
        *) bad=$((bad + 1)) ;;
      esac
      if ((EPOCHSECONDS - last_sent >= FLEET_PROGRESS_INTERVAL_S)) && ! { [[ -n $poster ]] && kill -0 "$poster" 2>/dev/null; }; then
        last_sent=$EPOCHSECONDS
        fleet_event benchmark progress --attempts 2 \
          --details "{\"completed\": $ok, \"failed\": $bad, \"requested\": $FLEET_BENCH_PROOFS}" &
        poster=$!
      fi
    fi
  done
  if [[ -n $poster ]]; then wait "$poster" || true; fi
}

fleet_log "benchmark: cuzk-bench batch -t $FLEET_BENCH_PROOF_TYPE --c1 $c1 -c $FLEET_BENCH_PROOFS -j $FLEET_BENCH_CONCURRENCY (deadline ${FLEET_BENCH_TIMEOUT_S}s)"
set +e
timeout --kill-after=30 "$FLEET_BENCH_TIMEOUT_S" \
  cuzk-bench --addr "$FLEET_DAEMON_ADDR" batch -t "$FLEET_BENCH_PROOF_TYPE" --c1 "$c1" \
  -c "$FLEET_BENCH_PROOFS" -j "$FLEET_BENCH_CONCURRENCY" 2>&1 | follow_bench
rc=${PIPESTATUS[0]}
set -e
elapsed=$(awk -v a="$t0" -v b="$(fleet_epoch)" 'BEGIN { printf "%.3f", b - a }')

# Parse bench.log: the one record of what cuzk-bench said.
ok_lines=0 bad_lines=0 in_summary=0 sum_completed="" sum_failed="" ppm="" spp=""
while IFS= read -r line; do
  if [[ $line =~ ^[[:space:]]*\[[0-9]+/[0-9]+\][[:space:]]+([A-Za-z]+)[[:space:]] ]]; then
    case ${BASH_REMATCH[1]} in
      ok | OK | COMPLETED) ok_lines=$((ok_lines + 1)) ;;
      *) bad_lines=$((bad_lines + 1)) ;;
    esac
  elif [[ $line == *'=== Batch Summary ==='* ]]; then
    in_summary=1
  elif ((in_summary)) && [[ $line =~ ^[[:space:]]*completed:[[:space:]]+([0-9]+) ]]; then
    sum_completed=${BASH_REMATCH[1]}
  elif ((in_summary)) && [[ $line =~ ^[[:space:]]*failed:[[:space:]]+([0-9]+) ]]; then
    sum_failed=${BASH_REMATCH[1]}
  elif ((in_summary)) && [[ $line =~ ^[[:space:]]*throughput:[[:space:]]+([0-9]+(\.[0-9]+)?)[[:space:]]+proofs/min[[:space:]]+\(([0-9]+(\.[0-9]+)?)s/proof\) ]]; then
    ppm=${BASH_REMATCH[1]}
    spp=${BASH_REMATCH[3]}
  fi
done <"$BENCH_LOG"
completed=${sum_completed:-$ok_lines}
failed=${sum_failed:-$bad_lines}

timed_out=0
if ((rc == 124)); then
  timed_out=1
elif ((rc == 137)) && awk -v e="$elapsed" -v t="$FLEET_BENCH_TIMEOUT_S" 'BEGIN { exit !(e >= t) }'; then
  timed_out=1 # did not stop on TERM; killed after the grace period
fi

if ((timed_out)); then
  # The summary was never printed: count the per-proof lines.
  completed=$ok_lines failed=$bad_lines
  if ((completed > 0)); then
    read -r pph spph < <(awk -v n="$completed" -v e="$elapsed" 'BEGIN { printf "%.3f %.3f\n", n * 3600 / e, e / n }')
    how="proofs_per_hour computed from the $completed completed proofs over ${elapsed}s elapsed"
  else
    pph=null spph=null
    how="no proof completed, so no rate"
  fi
  write_result timeout "$rc" "$completed" "$failed" "$pph" "$spph"
  fleet_fail "$FLEET_EXIT_TIMEOUT" "cuzk-bench did not finish within FLEET_BENCH_TIMEOUT_S=${FLEET_BENCH_TIMEOUT_S}s: $completed of $FLEET_BENCH_PROOFS proofs completed, $failed failed; $how"
fi

if ((rc == 0)) && [[ -n $spp ]]; then
  # proofs/hour = 3600 / (s/proof). cuzk prints s/proof with one decimal: below 1 s/proof (only CPU
  # stand-ins get there) that is too coarse, so use proofs/min (three decimals) instead.
  read -r pph spph < <(awk -v s="$spp" -v m="$ppm" 'BEGIN {
      if (s >= 1 || (s > 0 && m <= 0)) printf "%.3f %.3f\n", 3600 / s, s
      else printf "%.3f %.3f\n", m * 60, (m > 0 ? 60 / m : 0) }')
  write_result completed 0 "$completed" "$failed" "$pph" "$spph"
  fleet_log "benchmark: completed $completed of $FLEET_BENCH_PROOFS proofs ($failed failed): $pph proofs/hour (${spph}s/proof)"
  exit 0
fi

write_result error "$rc" "$completed" "$failed" null null
if ((rc != 0)); then
  fleet_fail "$rc" "cuzk-bench exited with code $rc after $completed of $FLEET_BENCH_PROOFS proofs ($failed failed)"
fi
fleet_fail "$FLEET_EXIT_SOFTWARE" "cuzk-bench exited 0 but printed no throughput line ($completed of $FLEET_BENCH_PROOFS proofs completed, $failed failed)"

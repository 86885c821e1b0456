#!/usr/bin/env bash
# Benchmark phase: run `cuzk-bench batch` once, under a deadline, and turn its output into a `result`.
#
# Place in the flow: run by entrypoint.sh after the warm-up (warmup.sh), so the SRS is loaded and the
# rate is the steady one. Writes the result body to $FLEET_STATE_DIR/result.json in every case it can
# (the entrypoint POSTs it), sends progress events while proofs complete, and exits:
#   0    outcome completed: the summary block has a throughput line (FAILED proofs are in the result:
#        completed/failed and `proofs`, each with the daemon's reason; judging them is the controller's);
#   124  outcome timeout: killed at FLEET_BENCH_TIMEOUT_S; proofs finished so far are counted;
#   N    outcome error: cuzk-bench exited N != 0; or 70 when it exited 0 without a throughput line.
# Real cuzk-bench output (curio e0294b0f, extern/cuzk/cuzk-bench/src/main.rs:542-638): per proof
# `  [i/N] LABEL — 12.3s (prove=P ms, queue=Q ms)` (LABEL COMPLETED FAILED CANCELLED TIMEOUT UNKNOWN; older
# builds print `ok`), then `=== Batch Summary ===`, `completed: N`, `failed: N`,
# `throughput:    X.XXX proofs/min (Y.Ys/proof)`; proofs/hour = 3600 / (s/proof).
# With -j > 1 cuzk-bench prints the per-proof lines only once every proof was submitted, so progress and
# the partial count at a deadline come from the daemon's log (`self-check PASSED` per completed proof).
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
export FLEET_BENCH_PROOFS FLEET_BENCH_CONCURRENCY FLEET_BENCH_PROOF_TYPE

RESULT_FILE="$FLEET_STATE_DIR/result.json"
BENCH_LOG="$FLEET_STATE_DIR/bench.log"
DLOG="$FLEET_STATE_DIR/daemon.log"
PROOFS_TSV="$FLEET_TMP_DIR/proofs.tsv"
PROOFS_JSON="$FLEET_TMP_DIR/proofs.json"
rm -f "$RESULT_FILE"
: >"$BENCH_LOG"
export FLEET_BENCH_STARTED_AT
FLEET_BENCH_STARTED_AT=$(fleet_now)
t0=$(fleet_epoch)
daemon_start_line=$(wc -l <"$DLOG" 2>/dev/null || echo 0)

daemon_segment() { tail -n "+$((daemon_start_line + 1))" "$DLOG" 2>/dev/null || true; }

# Proofs the daemon finished since the batch started (its log is live for any -j).
daemon_counts() { # -> "completed failed"
  daemon_segment | awk '/self-check PASSED/ { c++ }
    / ERROR / && !/per-partition verification/ { f++ } END { printf "%d %d\n", c, f }'
}

build_proofs() {
  daemon_segment >"$FLEET_TMP_DIR/bench.daemon"
  fleet_proof_results "$BENCH_LOG" "$FLEET_TMP_DIR/bench.daemon" >"$PROOFS_TSV"
  fleet_proofs_json "$PROOFS_TSV" >"$PROOFS_JSON"
}

# A configuration problem is still a benchmark result (outcome error): the controller must see it.
bench_config_error() {
  printf 'fleet: %s\n' "$*" >>"$BENCH_LOG"
  fleet_write_result error "$FLEET_EXIT_CONFIG" 0 0 null null "$BENCH_LOG"
  fleet_fail "$FLEET_EXIT_CONFIG" "$*"
}
[[ $FLEET_BENCH_PROOFS =~ ^[1-9][0-9]*$ ]] || bench_config_error "FLEET_BENCH_PROOFS must be a positive integer, got '$FLEET_BENCH_PROOFS'"
[[ $FLEET_BENCH_CONCURRENCY =~ ^[1-9][0-9]*$ ]] || bench_config_error "FLEET_BENCH_CONCURRENCY must be a positive integer, got '$FLEET_BENCH_CONCURRENCY'"
[[ $FLEET_BENCH_TIMEOUT_S =~ ^[0-9]+(\.[0-9]+)?$ && $FLEET_BENCH_TIMEOUT_S != 0 ]] || bench_config_error "FLEET_BENCH_TIMEOUT_S must be a positive number of seconds, got '$FLEET_BENCH_TIMEOUT_S'"

if ! fleet_find_c1; then
  printf 'fleet: benchmark input missing: %s\n' "${FLEET_C1:-no FLEET_BENCH_C1 and no c1.json in $FLEET_PARAMS_DIR or $FLEET_HOME}" >>"$BENCH_LOG"
  cat "$BENCH_LOG"
  fleet_write_result error "$FLEET_EXIT_NOINPUT" 0 0 null null "$BENCH_LOG"
  fleet_fail "$FLEET_EXIT_NOINPUT" "benchmark input (c1.json) missing: ${FLEET_C1:-set FLEET_BENCH_C1 or ship c1.json in the params mirror}"
fi
c1=$FLEET_C1
fleet_sector_miner "$c1" || bench_config_error "FLEET_BENCH_SECTOR_NUM/FLEET_BENCH_MINER_ID must be integers"
export FLEET_SECTOR_NUM FLEET_MINER_ID

# Copies cuzk-bench output to the log and bench.log; sends progress events at a bounded rate, at most one
# in flight (a slow controller must not stall the benchmark's output pipe). Counts come from the daemon's
# log as well as cuzk-bench's lines: with -j > 1 the latter appear only at the end.
# details.proofs: every per-proof line so far ({index, label, seconds}), for early verdicts (serving).
progress_event() { # REPORTED_OK REPORTED_BAD
  local dc dbad
  read -r dc dbad < <(daemon_counts)
  fleet_event benchmark progress --attempts 2 --details "$(jq -cn --argjson ok "$1" --argjson bad "$2" \
    --argjson dc "$dc" --argjson dbad "$dbad" --argjson n "$FLEET_BENCH_PROOFS" --rawfile seen "$SEEN_TSV" '
    {completed: ([$ok, $dc] | max), failed: ([$bad, $dbad] | max), requested: $n, reported: ($ok + $bad),
     proofs: [$seen | split("\n")[] | select(. != "") | split("\t")
              | {index: (.[0] | tonumber), "label": .[1], seconds: (.[2] | tonumber? // null)}][-200:]}')"
}
SEEN_TSV="$FLEET_TMP_DIR/bench.seen.tsv"
: >"$SEEN_TSV"
follow_bench() {
  local line ok=0 bad=0 last_sent=$EPOCHSECONDS poster="" label unsent=0
  while :; do
    if IFS= read -r -t 1 line; then
      line=${line//$'\r'/}
      [[ -n ${FLEET_TOKEN:-} ]] && line=${line//"$FLEET_TOKEN"/[redacted]}
      printf '%s\n' "$line"
      printf '%s\n' "${line:0:4000}" >>"$BENCH_LOG"
      if [[ $line =~ ^[[:space:]]*\[([0-9]+)/[0-9]+\][[:space:]]+([A-Za-z]+)[[:space:]]+[^[:space:]]+[[:space:]]+([0-9.]+)s ]]; then
        label=${BASH_REMATCH[2]}
        case $label in
          ok | OK | COMPLETED) ok=$((ok + 1)) label=COMPLETED ;;
          *) bad=$((bad + 1)) ;;
        esac
        printf '%s\t%s\t%s\n' "${BASH_REMATCH[1]}" "$label" "${BASH_REMATCH[3]}" >>"$SEEN_TSV"
        unsent=1
      fi
    else
      (($? > 128)) || break # EOF (a timeout of read -t is > 128)
    fi
    if ((EPOCHSECONDS - last_sent >= FLEET_PROGRESS_INTERVAL_S)) && ! { [[ -n $poster ]] && kill -0 "$poster" 2>/dev/null; }; then
      last_sent=$EPOCHSECONDS unsent=0
      progress_event "$ok" "$bad" &
      poster=$!
    fi
  done
  if [[ -n $poster ]]; then wait "$poster" || true; fi
  if ((unsent)); then progress_event "$ok" "$bad"; fi # the last lines (with -j > 1: all of them) arrive at once
}

args=(batch -t "$FLEET_BENCH_PROOF_TYPE" --c1 "$c1" -c "$FLEET_BENCH_PROOFS" -j "$FLEET_BENCH_CONCURRENCY"
  --sector-num "$FLEET_SECTOR_NUM" --miner-id "$FLEET_MINER_ID")
fleet_log "benchmark: cuzk-bench ${args[*]} (deadline ${FLEET_BENCH_TIMEOUT_S}s)"
set +e
timeout --kill-after=30 "$FLEET_BENCH_TIMEOUT_S" cuzk-bench --addr "$FLEET_DAEMON_ADDR" "${args[@]}" 2>&1 | follow_bench
rc=${PIPESTATUS[0]}
set -e
elapsed=$(awk -v a="$t0" -v b="$(fleet_epoch)" 'BEGIN { printf "%.3f", b - a }')
sleep 0.2 # the daemon's last lines reach daemon.log
fleet_daemon_epitaph | tee -a "$BENCH_LOG"
if ((rc != 0)) || ! grep -q '^failed: *0$' "$BENCH_LOG"; then
  fleet_kernel_xids | tee -a "$BENCH_LOG"
fi

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
build_proofs
if ((failed > 0)); then
  jq -r '.[] | select(.label != "COMPLETED") | "fleet: proof \(.index) \(.label): \(.reason // "no reason in the daemon log")"' \
    "$PROOFS_JSON" | tee -a "$BENCH_LOG"
fi

timed_out=0
if ((rc == 124)); then
  timed_out=1
elif ((rc == 137)) && awk -v e="$elapsed" -v t="$FLEET_BENCH_TIMEOUT_S" 'BEGIN { exit !(e >= t) }'; then
  timed_out=1 # did not stop on TERM; killed after the grace period
fi

if ((timed_out)); then
  # The summary was never printed, and with -j > 1 neither were most per-proof lines: the daemon's log
  # says how many proofs it finished.
  read -r d_ok d_bad < <(daemon_counts)
  completed=$((ok_lines > d_ok ? ok_lines : d_ok))
  failed=$((bad_lines > d_bad ? bad_lines : d_bad))
  if ((completed > 0)); then
    read -r pph spph < <(awk -v n="$completed" -v e="$elapsed" 'BEGIN { printf "%.3f %.3f\n", n * 3600 / e, e / n }')
    how="proofs_per_hour computed from the $completed completed proofs over ${elapsed}s elapsed"
  else
    pph=null spph=null
    how="no proof completed, so no rate"
  fi
  fleet_write_result timeout "$rc" "$completed" "$failed" "$pph" "$spph" "$BENCH_LOG" "$PROOFS_JSON"
  fleet_fail "$FLEET_EXIT_TIMEOUT" "cuzk-bench did not finish within FLEET_BENCH_TIMEOUT_S=${FLEET_BENCH_TIMEOUT_S}s: $completed of $FLEET_BENCH_PROOFS proofs completed, $failed failed; $how"
fi

if ((rc == 0)) && [[ -n $spp ]]; then
  # proofs/hour = 3600 / (s/proof). cuzk prints s/proof with one decimal: below 1 s/proof (only CPU
  # stand-ins get there) that is too coarse, so use proofs/min (three decimals) instead.
  read -r pph spph < <(awk -v s="$spp" -v m="$ppm" 'BEGIN {
      if (s >= 1 || (s > 0 && m <= 0)) printf "%.3f %.3f\n", 3600 / s, s
      else printf "%.3f %.3f\n", m * 60, (m > 0 ? 60 / m : 0) }')
  fleet_write_result completed 0 "$completed" "$failed" "$pph" "$spph" "$BENCH_LOG" "$PROOFS_JSON"
  fleet_log "benchmark: completed $completed of $FLEET_BENCH_PROOFS proofs ($failed failed): $pph proofs/hour (${spph}s/proof)"
  exit 0
fi

fleet_write_result error "$rc" "$completed" "$failed" null null "$BENCH_LOG" "$PROOFS_JSON"
if ((rc != 0)); then
  fleet_fail "$rc" "cuzk-bench exited with code $rc after $completed of $FLEET_BENCH_PROOFS proofs ($failed failed)"
fi
fleet_fail "$FLEET_EXIT_SOFTWARE" "cuzk-bench exited 0 but printed no throughput line ($completed of $FLEET_BENCH_PROOFS proofs completed, $failed failed)"

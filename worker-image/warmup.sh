#!/usr/bin/env bash
# Warm-up phase: `cuzk-bench preload` (the SRS into memory), then ONE proof that is timed and discarded.
#
# Place in the flow: run by entrypoint.sh after the daemon answers, before benchmark.sh. The first proof
# of a fresh daemon loads the SRS (tens of GiB), may build PCE data (~25 GiB written into the params dir)
# and JIT-compiles kernels on new GPUs: counted as throughput it makes a good machine look slow. Its
# time is reported as its own phase (warmup.json -> the `warmup` event and the result's `warmup`).
# Exits 0 with warmup.json when the warm-up proof COMPLETED. Otherwise writes result.json (outcome error,
# the evidence) and exits: cuzk-bench's own code (an RPC failed: anyhow chain), 75 the proof printed
# another label, 78 the daemon's memory budget cannot hold the SRS (the daemon would block forever,
# cuzk-core memory.rs:188-192), 124 the warm-up deadline (FLEET_WARMUP_TIMEOUT_S) passed.
# FLEET_WARMUP=0 skips it (warmup.json says skipped).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/fleet.sh
. "$HERE/lib/fleet.sh"

: "${FLEET_WARMUP:=1}"
: "${FLEET_WARMUP_TIMEOUT_S:=1800}"
: "${FLEET_DAEMON_ADDR:=http://127.0.0.1:9820}"
: "${FLEET_BENCH_PROOF_TYPE:=porep}"

WARM="$FLEET_STATE_DIR/warmup.json"
WLOG="$FLEET_STATE_DIR/warmup.log"
DLOG="$FLEET_STATE_DIR/daemon.log"
rm -f "$WARM" "$FLEET_STATE_DIR/result.json"
: >"$WLOG"
export FLEET_BENCH_STARTED_AT
FLEET_BENCH_STARTED_AT=$(fleet_now)

# write_warmup OUTCOME PRELOAD_S ALREADY SECONDS LABEL REASON ("" = null)
write_warmup() {
  jq -n --arg o "$1" --arg p "$2" --arg a "$3" --arg s "$4" --arg l "$5" --arg r "$6" '
    def n: if . == "" then null else tonumber end;
    {outcome: $o, preload_seconds: ($p | n), preload_already_loaded: (if $a == "" then null else $a == "1" end),
     seconds: ($s | n), label: (if $l == "" then null else $l end), reason: (if $r == "" then null else $r[:1024] end)}' \
    >"$WARM"
}

# A failed warm-up is the benchmark's result too: outcome error, with everything known so far.
fail_warmup() { # CODE MESSAGE
  local code=$1
  shift
  printf 'fleet: %s\n' "$*" >>"$WLOG"
  fleet_daemon_epitaph >>"$WLOG"
  fleet_kernel_xids | tee -a "$WLOG"
  fleet_write_result error "$code" 0 0 null null "$WLOG"
  fleet_fail "$code" "warm-up failed: $*"
}

if [[ $FLEET_WARMUP == 0 ]]; then
  write_warmup skipped "" "" "" "" ""
  fleet_log "warm-up skipped (FLEET_WARMUP=0): the first measured proof pays the SRS load"
  exit 0
fi
[[ $FLEET_WARMUP_TIMEOUT_S =~ ^[1-9][0-9]*$ ]] ||
  fail_warmup "$FLEET_EXIT_CONFIG" "FLEET_WARMUP_TIMEOUT_S must be a positive number of seconds, got '$FLEET_WARMUP_TIMEOUT_S'"
if ! fleet_find_c1; then
  write_warmup failed "" "" "" "" "benchmark input (c1.json) missing"
  fail_warmup "$FLEET_EXIT_NOINPUT" "benchmark input (c1.json) missing: ${FLEET_C1:-set FLEET_BENCH_C1 or ship c1.json in the params mirror}"
fi
fleet_sector_miner "$FLEET_C1" ||
  fail_warmup "$FLEET_EXIT_CONFIG" "FLEET_BENCH_SECTOR_NUM/FLEET_BENCH_MINER_ID must be integers, got '${FLEET_SECTOR_NUM:-}'/'${FLEET_MINER_ID:-}'"
deadline=$((EPOCHSECONDS + FLEET_WARMUP_TIMEOUT_S))
left() { local l=$((deadline - EPOCHSECONDS)); ((l > 0)) || l=1; printf '%s' "$l"; }

# Run cuzk-bench under the deadline, its output to the log and WLOG; watch the daemon's log meanwhile: a
# budget smaller than the SRS makes the daemon block forever (memory.rs:188-192), so stop at once.
bench_watched() { # ARGS...
  local start_line pid rc=0
  start_line=$(wc -l <"$DLOG" 2>/dev/null || echo 0)
  timeout --kill-after=10 "$(left)" cuzk-bench --addr "$FLEET_DAEMON_ADDR" "$@" \
    > >(tee -a "$WLOG") 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    if tail -n "+$((start_line + 1))" "$DLOG" 2>/dev/null | grep -q 'acquire request exceeds total budget'; then
      fleet_kill_tree "$pid" TERM
      wait "$pid" 2>/dev/null || true
      local line
      line=$(tail -n "+$((start_line + 1))" "$DLOG" | grep -m1 'acquire request exceeds total budget')
      write_warmup failed "" "" "" "" "$line"
      fail_warmup "$FLEET_EXIT_BUDGET" "cuzk-daemon's memory budget cannot hold the SRS, so it would wait forever: $line. The pool's machines (or the container's memory limit) are too small for this workload: raise min_host_ram_gb / the memory limit, or lower benchmark.memory_budget_gib only if it was set too low"
    fi
    sleep 0.2
  done
  wait "$pid" || rc=$?
  sleep 0.1 # let tee finish
  return "$rc"
}

circuit=$(fleet_circuit_id)
fleet_log "warm-up: cuzk-bench preload -c $circuit (deadline ${FLEET_WARMUP_TIMEOUT_S}s)"
t0=$(fleet_epoch)
rc=0
bench_watched preload -c "$circuit" || rc=$?
preload_s=$(awk -v a="$t0" -v b="$(fleet_epoch)" 'BEGIN { printf "%.3f", b - a }')
already=0
# "porep-32g loaded in 51234 ms" / "porep-32g already loaded" (extern/cuzk/cuzk-bench/src/main.rs:701-705)
ms=$(sed -n "s/^$circuit loaded in \([0-9][0-9]*\) ms\$/\1/p" "$WLOG" | tail -n 1)
if [[ -n $ms ]]; then
  preload_s=$(awk -v m="$ms" 'BEGIN { printf "%.3f", m / 1000 }')
elif grep -qx "$circuit already loaded" "$WLOG"; then
  already=1
fi
if ((rc == 124 || rc == 137)); then
  write_warmup failed "" "" "" "" "cuzk-bench preload did not finish within FLEET_WARMUP_TIMEOUT_S"
  fail_warmup "$FLEET_EXIT_TIMEOUT" "cuzk-bench preload -c $circuit did not finish within FLEET_WARMUP_TIMEOUT_S=${FLEET_WARMUP_TIMEOUT_S}s"
elif ((rc != 0)); then
  write_warmup failed "$preload_s" "" "" "" "$(grep -m1 '^Error: ' "$WLOG" || true)"
  fail_warmup "$rc" "cuzk-bench preload -c $circuit exited with code $rc"
fi

fleet_log "warm-up: one discarded proof: cuzk-bench batch -t $FLEET_BENCH_PROOF_TYPE --c1 $FLEET_C1 -c 1 -j 1 --sector-num $FLEET_SECTOR_NUM --miner-id $FLEET_MINER_ID"
start_line=$(wc -l <"$DLOG" 2>/dev/null || echo 0)
mark=$(wc -l <"$WLOG")
rc=0
bench_watched batch -t "$FLEET_BENCH_PROOF_TYPE" --c1 "$FLEET_C1" -c 1 -j 1 \
  --sector-num "$FLEET_SECTOR_NUM" --miner-id "$FLEET_MINER_ID" || rc=$?
tail -n "+$((mark + 1))" "$WLOG" >"$FLEET_TMP_DIR/warm.bench"
tail -n "+$((start_line + 1))" "$DLOG" >"$FLEET_TMP_DIR/warm.daemon" 2>/dev/null || : >"$FLEET_TMP_DIR/warm.daemon"
IFS=$'\t' read -r _ label seconds _ _ _ reason < <(fleet_proof_results "$FLEET_TMP_DIR/warm.bench" "$FLEET_TMP_DIR/warm.daemon") || true
if ((rc == 124 || rc == 137)); then
  write_warmup failed "$preload_s" "$already" "" "" "the warm-up proof did not finish within FLEET_WARMUP_TIMEOUT_S"
  fail_warmup "$FLEET_EXIT_TIMEOUT" "the warm-up proof did not finish within FLEET_WARMUP_TIMEOUT_S=${FLEET_WARMUP_TIMEOUT_S}s"
elif ((rc != 0)); then
  write_warmup failed "$preload_s" "$already" "" "" "$(grep -m1 '^Error: ' "$FLEET_TMP_DIR/warm.bench" || true)"
  fail_warmup "$rc" "cuzk-bench batch (warm-up proof) exited with code $rc"
elif [[ -z ${label:-} ]]; then
  write_warmup failed "$preload_s" "$already" "" "" "cuzk-bench printed no [1/1] line"
  fail_warmup "$FLEET_EXIT_SOFTWARE" "cuzk-bench batch (warm-up proof) exited 0 but printed no [1/1] line"
elif [[ $label != COMPLETED ]]; then
  write_warmup failed "$preload_s" "$already" "$seconds" "$label" "${reason:-}"
  fail_warmup "$FLEET_EXIT_PROOF_FAILED" "the warm-up proof came back $label${reason:+: $reason}"
fi
write_warmup completed "$preload_s" "$already" "$seconds" "$label" ""
fleet_log "warm-up: preload ${preload_s}s, warm-up proof ${seconds}s (not counted in the rate)"

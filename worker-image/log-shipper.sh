#!/usr/bin/env bash
# Log shipper: sends the worker's log ring to the controller in batches (POST .../logs, `log_batch`).
#
# Place in the flow: started in the background by entrypoint.sh right after the log sink; ships nothing until
# the controller accepted the registration (FLEET_REGISTERED_FILE: before that every batch is a 404 "unknown
# instance", which is not an outage); runs until the entrypoint sends SIGUSR1 (final drain, then exit). A controller outage never stops it and never stops
# the worker: it keeps the ring bounded (FLEET_LOG_RING_LINES; the oldest whole segments go first),
# counts the unshipped lines it had to drop, and reports that count in the next batch that gets through.
# Retries back off (jittered, capped) between cycles instead of blocking on one batch.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/fleet.sh
. "$HERE/lib/fleet.sh"

: "${FLEET_LOG_SHIP_INTERVAL_S:=2}"
: "${FLEET_LOG_BATCH_BYTES:=200000}" # the protocol caps bodies at 256 KiB
: "${FLEET_LOG_BATCH_LINES:=2000}"   # the protocol caps a batch at 2000 lines
: "${FLEET_LOG_FINAL_ATTEMPTS:=3}"

SHIPPED_FILE="$FLEET_STATE_DIR/shipped.seq"
BATCH_FILE="$FLEET_TMP_DIR/shipper.batch"
BODY_FILE="$FLEET_TMP_DIR/shipper.json"

shipped=0
if [[ -f $SHIPPED_FILE ]]; then
  read -r shipped <"$SHIPPED_FILE" || shipped=0
  [[ $shipped =~ ^[0-9]+$ ]] || shipped=0
fi
dropped=0   # dropped since the last delivered batch
failures=0  # consecutive failed deliveries
stopping=0
trap 'stopping=1' USR1
trap '' INT

save_shipped() {
  printf '%s\n' "$shipped" >"$SHIPPED_FILE.tmp" && mv -f "$SHIPPED_FILE.tmp" "$SHIPPED_FILE"
}

# Delete the oldest complete segments while the complete ones alone exceed the bound; any of their
# lines not yet shipped are counted as dropped.
trim_ring() {
  local segs n idx seg_first seg_last lost
  mapfile -t segs < <(fleet_ring_segments)
  n=${#segs[@]}
  while (((n - 1) * FLEET_RING_SEG > FLEET_LOG_RING_LINES)); do
    idx=${segs[0]##*.}
    idx=$((10#$idx))
    seg_first=$((idx * FLEET_RING_SEG + 1))
    seg_last=$(((idx + 1) * FLEET_RING_SEG))
    if ((seg_last > shipped)); then
      lost=$((seg_last - (shipped > seg_first - 1 ? shipped : seg_first - 1)))
      dropped=$((dropped + lost))
      shipped=$seg_last
      save_shipped
    fi
    rm -f "${segs[0]}"
    segs=("${segs[@]:1}")
    n=$((n - 1))
  done
}

# Write the next batch (lines after `shipped`, within the byte/line caps) to BATCH_FILE and print the
# seq of its last line (or nothing). A half-written last line of the newest segment is left for later.
next_batch() {
  local segs newest
  mapfile -t segs < <(fleet_ring_segments)
  : >"$BATCH_FILE"
  ((${#segs[@]} > 0)) || return 0
  newest=${segs[-1]}
  {
    if ((${#segs[@]} > 1)); then cat "${segs[@]:0:${#segs[@]}-1}"; fi
    if [[ -n $(tail -c 1 "$newest") ]]; then sed '$d' "$newest"; else cat "$newest"; fi
  } 2>/dev/null | awk -F '\t' -v after="$shipped" -v maxb="$FLEET_LOG_BATCH_BYTES" \
    -v maxn="$FLEET_LOG_BATCH_LINES" -v out="$BATCH_FILE" '
      $1 + 0 > after {
        line = $0; sub(/^[0-9]+\t/, "", line)
        if (n >= maxn || bytes + length(line) + 8 > maxb) exit
        print line > out; n++; bytes += length(line) + 8; last = $1
      }
      END { if (n > 0) print last }'
}

# One delivery attempt; returns 0 when there is nothing more to send right now (or not registered yet).
ship_once() {
  local attempts=$1 last rc=0
  trim_ring
  [[ -e $FLEET_REGISTERED_FILE ]] || return 0
  last=$(next_batch)
  if [[ -z $last ]] && ((dropped == 0)); then
    return 0
  fi
  if ! jq -R -s --argjson dropped "$dropped" \
    '{protocol: 1, lines: (rtrimstr("\n") | if . == "" then [] else split("\n") end), dropped: $dropped}' \
    <"$BATCH_FILE" >"$BODY_FILE"; then
    fleet_log "log shipper: could not build a batch body (jq failed); skipping these lines"
    [[ -n $last ]] && shipped=$last && save_shipped
    return 1
  fi
  fleet_post logs "$BODY_FILE" "$attempts" 1 || rc=$?
  if ((rc == 0)); then
    if ((failures > 0)); then
      fleet_log "log shipper: controller reachable again after $failures failed attempts; $dropped buffered lines were dropped (ring bound $FLEET_LOG_RING_LINES lines)"
    fi
    [[ -n $last ]] && shipped=$last && save_shipped
    dropped=0
    failures=0
    return 1 # maybe more to send
  fi
  failures=$((failures + 1))
  if ((failures == 1 && rc == 2)); then
    # fleet_post logged the controller's answer (an HTTP 4xx): it was reached and refused the batch.
    fleet_log "log shipper: the controller refused the log batch (answer above); buffering up to $FLEET_LOG_RING_LINES lines and retrying"
  elif ((failures == 1)); then
    fleet_log "log shipper: cannot reach the controller; buffering up to $FLEET_LOG_RING_LINES lines and retrying"
  fi
  return 2
}

while ((!stopping)); do
  ship_once 1
  rc=$?
  if ((rc == 1)); then
    continue
  elif ((rc == 2)); then
    delay=$(fleet_backoff_delay "$((failures - 1))")
  else
    delay=$FLEET_LOG_SHIP_INTERVAL_S
  fi
  # `wait` returns at once when SIGUSR1 arrives (a plain `sleep` would finish first).
  sleep "$delay" >/dev/null 2>&1 &
  wait $! 2>/dev/null || kill $! 2>/dev/null
done

# Final drain: a few attempts each, then give up (the worker is exiting).
for ((round = 0; round < 1000; round++)); do
  ship_once "$FLEET_LOG_FINAL_ATTEMPTS"
  rc=$?
  ((rc == 1)) || break
done
exit 0

#!/usr/bin/env bash
# Params phase: make the Filecoin proof parameters present and verified in FLEET_PARAMS_DIR.
#
# Place in the flow: run by entrypoint.sh between register/tunnel and the daemon. Exit 0 when every file
# of the manifest is present and its blake2b-512 matches; otherwise exit non-zero after recording the
# reason with fleet_fail (the entrypoint's trap reports it).
#
# With FLEET_PARAMS_BASE_URL: fetch `$BASE/manifest.txt` (lines `<b2sum hex>  <size bytes>  <file name>`),
# then each file not already verified, with aria2c (-x16 -s16, --continue) if installed, else curl
# (-C - resume). Downloads go to `<name>.part` and are renamed only after the checksum matches, so the
# prover never sees a half file. A mismatch deletes the file and downloads it once more.
# Without it: `curio fetch-params $FLEET_PARAMS_SECTOR_SIZE` if curio is installed.
# Progress events (phase params, status progress) go out at most every FLEET_PROGRESS_INTERVAL_S and
# after each file; the whole phase obeys FLEET_PARAMS_TIMEOUT_S.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/fleet.sh
. "$HERE/lib/fleet.sh"

: "${FLEET_PARAMS_DIR:=/var/tmp/filecoin-proof-parameters}"
: "${FLEET_PARAMS_SECTOR_SIZE:=32GiB}"
: "${FLEET_PARAMS_TIMEOUT_S:=7200}"
: "${FLEET_PARAMS_POLL_S:=1}"
: "${FLEET_PARAMS_BASE_URL:=}"

mkdir -p "$FLEET_PARAMS_DIR"
export FIL_PROOFS_PARAMETER_CACHE="$FLEET_PARAMS_DIR"

started=$EPOCHSECONDS
deadline=$((started + ${FLEET_PARAMS_TIMEOUT_S%.*}))

remaining_s() { # at least 1: `timeout 0` and `curl --max-time 0` would mean "no limit"
  local left=$((deadline - EPOCHSECONDS))
  ((left > 0)) || left=1
  printf '%s' "$left"
}

fail_timeout() {
  fleet_fail "$FLEET_EXIT_TIMEOUT" "params fetch exceeded FLEET_PARAMS_TIMEOUT_S=${FLEET_PARAMS_TIMEOUT_S}s $*"
}

if [[ -z $FLEET_PARAMS_BASE_URL ]]; then
  if command -v curio >/dev/null 2>&1; then
    fleet_log "no FLEET_PARAMS_BASE_URL: running curio fetch-params $FLEET_PARAMS_SECTOR_SIZE into $FLEET_PARAMS_DIR"
    rc=0
    timeout --kill-after=30 "$(remaining_s)" curio fetch-params "$FLEET_PARAMS_SECTOR_SIZE" || rc=$?
    ((rc != 124)) || fail_timeout "(curio fetch-params)"
    ((rc == 0)) || fleet_fail "$rc" "curio fetch-params $FLEET_PARAMS_SECTOR_SIZE exited with code $rc"
    exit 0
  fi
  fleet_fail "$FLEET_EXIT_UNAVAILABLE" "no params source: FLEET_PARAMS_BASE_URL is not set and curio is not installed"
fi

base=${FLEET_PARAMS_BASE_URL%/}
manifest="$FLEET_STATE_DIR/params.manifest"
rc=0
curl -fsS --retry 3 --retry-delay 2 --connect-timeout 10 --max-time "$(remaining_s)" \
  -o "$manifest" "$base/manifest.txt" || rc=$?
((rc == 0)) || fleet_fail "$rc" "could not download $base/manifest.txt (curl exit code $rc)"

names=() sums=() sizes=()
total_bytes=0
lineno=0
while read -r sum size name extra || [[ -n ${sum:-} ]]; do
  lineno=$((lineno + 1))
  [[ -z ${sum:-} || $sum == \#* ]] && continue
  if [[ ! $sum =~ ^[0-9a-f]{128}$ || ! ${size:-} =~ ^[0-9]+$ || ! ${name:-} =~ ^[A-Za-z0-9._-]+$ || -n ${extra:-} ]]; then
    fleet_fail "$FLEET_EXIT_MANIFEST" "bad line $lineno in $base/manifest.txt (want '<b2sum hex>  <size>  <file name>'): $sum ${size:-} ${name:-}"
  fi
  names+=("$name") sums+=("$sum") sizes+=("$size")
  total_bytes=$((total_bytes + size))
done <"$manifest"
((${#names[@]} > 0)) || fleet_fail "$FLEET_EXIT_MANIFEST" "$base/manifest.txt lists no files"
fleet_log "params: ${#names[@]} files, $total_bytes bytes, into $FLEET_PARAMS_DIR"

if command -v aria2c >/dev/null 2>&1; then downloader=aria2c; else downloader=curl; fi
bytes_done=0 # bytes of files finished so far
last_progress=0

progress_event() { # file file_bytes_done file_bytes_total force (bytes_done: finished files only)
  local now=$EPOCHSECONDS
  if (($4 == 0 && now - last_progress < FLEET_PROGRESS_INTERVAL_S)); then return 0; fi
  last_progress=$now
  fleet_event params progress --details "$(jq -cn --arg file "$1" --argjson fd "$2" --argjson ft "$3" \
    --argjson "done" "$((bytes_done + $2))" --argjson total "$total_bytes" \
    '{file: $file, bytes_done: $done, bytes_total: $total, file_bytes_done: $fd, file_bytes_total: $ft}')" \
    --attempts 2
}

on_disk_bytes() { # bytes actually written (aria2c writes segments out of order: size alone overstates)
  local blocks
  blocks=$(stat -c '%b %B' "$1" 2>/dev/null) || { printf 0; return 0; }
  awk -v b="$blocks" -v max="$2" 'BEGIN { split(b, a, " "); n = a[1] * a[2]; if (n > max) n = max; printf "%d", n }'
}

b2_of() { b2sum "$1" | cut -d ' ' -f1; }

download() { # name url part size -> exit code of the downloader
  local name=$1 url=$2 part=$3 size=$4 pid rc=0
  if [[ $downloader == aria2c ]]; then
    timeout --kill-after=10 "$(remaining_s)" aria2c -x16 -s16 --continue=true --auto-file-renaming=false \
      --allow-overwrite=true --file-allocation=none --summary-interval=0 --console-log-level=warn \
      --download-result=hide --max-tries=5 --retry-wait=3 -d "$FLEET_PARAMS_DIR" -o "$name.part" "$url" &
  else
    timeout --kill-after=10 "$(remaining_s)" curl -fsS -L --retry 5 --retry-delay 3 --connect-timeout 10 \
      -C - -o "$part" "$url" &
  fi
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    progress_event "$name" "$(on_disk_bytes "$part" "$size")" "$size" 0
    sleep "$FLEET_PARAMS_POLL_S"
  done
  wait "$pid" || rc=$?
  return "$rc"
}

for i in "${!names[@]}"; do
  name=${names[$i]} want=${sums[$i]} size=${sizes[$i]}
  final="$FLEET_PARAMS_DIR/$name" part="$FLEET_PARAMS_DIR/$name.part" stamp="$FLEET_PARAMS_DIR/.$name.verified"
  if [[ -f $final ]]; then
    # Resume: a file verified earlier (same size and checksum recorded) is not hashed again.
    if [[ -f $stamp && $(cat "$stamp") == "$want $size" && $(stat -c %s "$final") == "$size" ]]; then
      fleet_log "params: $name already present and verified"
      bytes_done=$((bytes_done + size))
      continue
    fi
    if [[ $(stat -c %s "$final") == "$size" && $(b2_of "$final") == "$want" ]]; then
      printf '%s %s\n' "$want" "$size" >"$stamp"
      fleet_log "params: $name already present; checksum verified"
      bytes_done=$((bytes_done + size))
      continue
    fi
    fleet_log "params: $name present but wrong size or checksum; downloading again"
    rm -f "$final" "$stamp"
  fi
  for attempt in 1 2; do
    if [[ -f $part && $(stat -c %s "$part") -gt $size ]]; then rm -f "$part" "$part.aria2"; fi
    if [[ -f $part ]]; then
      fleet_log "params: resuming $name at $(stat -c %s "$part") of $size bytes ($downloader)"
    else
      fleet_log "params: downloading $name ($size bytes, $downloader)"
    fi
    ((EPOCHSECONDS < deadline)) || fail_timeout "before downloading $name"
    rc=0
    if [[ -f $part && $(stat -c %s "$part") -eq $size ]]; then
      fleet_log "params: $name.part is complete; verifying"
    else
      download "$name" "$base/$name" "$part" "$size" || rc=$?
    fi
    if ((rc == 124 || rc == 137)) || ((EPOCHSECONDS >= deadline)); then
      fail_timeout "while downloading $name ($(on_disk_bytes "$part" "$size") of $size bytes)"
    fi
    ((rc == 0)) || fleet_fail "$rc" "$downloader failed to download $base/$name (exit code $rc)"
    got=$(b2_of "$part")
    if [[ $got == "$want" ]]; then
      break
    fi
    rm -f "$part" "$part.aria2"
    if ((attempt == 2)); then
      fleet_fail "$FLEET_EXIT_DATA" "checksum mismatch for $name after 2 downloads: blake2b-512 expected $want, got $got"
    fi
    fleet_log "params: checksum mismatch for $name (expected $want, got $got); deleted, downloading once more"
  done
  mv -f "$part" "$final"
  printf '%s %s\n' "$want" "$size" >"$stamp"
  fleet_log "params: $name verified ($size bytes)"
  progress_event "$name" "$size" "$size" 1
  bytes_done=$((bytes_done + size))
done

fleet_log "params: all ${#names[@]} files present and verified in $(( EPOCHSECONDS - started ))s"

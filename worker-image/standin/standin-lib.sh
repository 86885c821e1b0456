# shellcheck shell=bash
# Shared by the cuzk stand-ins (cuzk-daemon / cuzk, cuzk-bench). Sourced, not run.
#
# The stand-ins print what the real binaries print, byte for byte, at curio commit
# e0294b0f948132d41e8f42f59fa949495d5fd3af (facts and citations: worker-image/README.md "Real cuzk output").
# Citations below are "file:line" at that commit; paths under extern/cuzk unless stated.
#
# How they talk: the bench stand-in drops a request file into the daemon stand-in's spool directory
# ($STANDIN_STATE_DIR/spool-<port>/) and waits for the response file; the daemon stand-in is "listening"
# while its pid file ($STANDIN_STATE_DIR/daemon-<port>.pid) names a live process. A daemon that dies
# (SIGKILL, abort) leaves in-flight requests unanswered, as a dead gRPC server would.
#
# Stand-in marker: each stand-in writes exactly ONE line to stderr when it starts, beginning with
# "[gpu-fleet stand-in]". Everything else (stdout, and stderr lines that the real binary also writes)
# is the real binary's output. The real tools never print that prefix, so it cannot be confused with them.

STANDIN_CURIO_COMMIT=e0294b0f948132d41e8f42f59fa949495d5fd3af

standin_banner() { # NAME
  printf '[gpu-fleet stand-in] %s: CPU stand-in replaying curio@%s output (worker-image/standin); no GPU is used, timings are simulated\n' \
    "$1" "${STANDIN_CURIO_COMMIT:0:8}" >&2
}

standin_state_dir() { printf '%s' "${STANDIN_STATE_DIR:-${TMPDIR:-/tmp}/cuzk-standin}"; }

# Real seconds for N simulated seconds (STANDIN_TIME_SCALE real seconds per simulated second).
standin_real_s() { awk -v s="$1" -v k="${STANDIN_TIME_SCALE:-1}" 'BEGIN { printf "%.6f", s * k }'; }

# Simulated seconds elapsed since EPOCHREALTIME value $1.
standin_sim_since() {
  awk -v a="$1" -v b="$EPOCHREALTIME" -v k="${STANDIN_TIME_SCALE:-1}" 'BEGIN { printf "%.6f", (b - a) / (k > 0 ? k : 1) }'
}

standin_child=""
standin_pause() { # interruptible sleep of N REAL seconds (TERM/INT are handled at once)
  sleep "$1" >/dev/null 2>&1 &  # an orphaned sleep must not hold our stdout open
  standin_child=$!
  wait "$standin_child" || true
  standin_child=""
}

standin_uuid() { cat /proc/sys/kernel/random/uuid; }

# tracing-subscriber 0.3.22 `fmt()` Full format (cuzk-daemon/src/main.rs:58-61, cuzk-bench/src/main.rs:463-468):
#   <RFC 3339 UTC, 6 fractional digits>Z <LEVEL right-aligned to 5> <target>: <message>[ <k>=<v>...]
# ANSI colour is on unless NO_COLOR is set and non-empty (tracing-subscriber >= 0.3.18, #2647); it does not
# check for a terminal. Colours as nu-ansi-term paints them: timestamp and target dimmed, level coloured,
# field names italic, "=" dimmed.
# Which levels are printed: both binaries build their filter with EnvFilter::try_from_default_env() (RUST_LOG),
# else from their own setting (cuzk-daemon/src/main.rs:52-58: --log-level or cuzk.toml [logging] level;
# cuzk-bench/src/main.rs main(): --log-level). The stand-ins read the plain-level form (`warn`, `info`, ...);
# a per-target directive list counts as info.
standin_level_rank() { # LEVEL -> REPLY (0 off .. 5 trace)
  case ${1,,} in
    off) REPLY=0 ;; error) REPLY=1 ;; warn) REPLY=2 ;; info) REPLY=3 ;; debug) REPLY=4 ;; trace) REPLY=5 ;; *) REPLY=3 ;;
  esac
}
standin_log_filter() { # CONFIGURED_LEVEL -> sets STANDIN_MAX_LEVEL
  standin_level_rank "${RUST_LOG:-${1:-info}}"
  STANDIN_MAX_LEVEL=$REPLY
}
STANDIN_MAX_LEVEL=3

standin_trace() { # LEVEL TARGET MESSAGE [k=v ...]
  local level=$1 target=$2 message=$3 now=$EPOCHREALTIME ts f out colour
  shift 3
  standin_level_rank "$level"
  ((REPLY <= STANDIN_MAX_LEVEL)) || return 0
  printf -v ts '%(%Y-%m-%dT%H:%M:%S)T.%sZ' "${now%.*}" "${now#*.}"
  if [[ -n ${NO_COLOR:-} ]]; then
    printf -v out '%s %5s %s: %s' "$ts" "$level" "$target" "$message"
    for f in "$@"; do out+=" $f"; done
  else
    case $level in
      ERROR) colour=31 ;; WARN) colour=33 ;; INFO) colour=32 ;; DEBUG) colour=34 ;; *) colour=35 ;;
    esac
    printf -v out '\e[2m%s\e[0m \e[%sm%5s\e[0m \e[2m%s\e[0m\e[2m:\e[0m %s' "$ts" "$colour" "$level" "$target" "$message"
    local field
    for f in "$@"; do
      printf -v field ' \e[3m%s\e[0m\e[2m=\e[0m%s' "${f%%=*}" "${f#*=}"
      out+=$field
    done
  fi
  printf '%s\n' "$out"
}

# A file written whole or not at all (the other stand-in polls for it).
standin_write_atomic() { # PATH CONTENT
  printf '%s\n' "$2" >"$1.tmp.$$" && mv -f "$1.tmp.$$" "$1"
}

# key=value lines -> the value of KEY
standin_field() { # FILE KEY
  sed -n "s/^$2=//p" "$1" | head -n 1
}

# cudaGetErrorString for the codes the stand-ins produce (CUDA 12 runtime).
standin_cuda_string() {
  case $1 in
    2) echo "out of memory" ;;
    3) echo "initialization error" ;;
    35) echo "CUDA driver version is insufficient for CUDA runtime version" ;;
    46) echo "CUDA-capable device(s) is/are busy or unavailable" ;;
    100) echo "no CUDA-capable device is detected" ;;
    209) echo "no kernel image is available for execution on the device" ;;
    214) echo "uncorrectable ECC error encountered" ;;
    222) echo "the provided PTX was compiled with an unsupported toolchain." ;;
    700) echo "an illegal memory access was encountered" ;;
    719) echo "unspecified launch failure" ;;
    999) echo "unknown error" ;;
    *) echo "unrecognized error code" ;;
  esac
}

# Microseconds since the epoch as an integer (no fork).
standin_us() { local n=${EPOCHREALTIME/[.,]/}; REPLY=$((10#$n)); }  # -> $REPLY

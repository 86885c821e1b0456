"""Exit statuses that are not a tool's own table: bash's 126/127, 128 + a signal (every Linux signal), and the
worker's own exit codes. Pure data; `signatures.py` decodes them, and the worker's table is also the source of
`worker-image/lib/exit-codes.sh` (`render_worker_exit_codes`, checked equal by tests/unit/test_code_tables.py):
one table for the scripts that exit with these codes and the judge that reads them.

Sources:
- bash: the GNU Bash manual, "Exit Status" (www.gnu.org/software/bash/manual/html_node/Exit-Status.html): "If a
  command is not found, the child process created to execute it returns a status of 127. If a command is found
  but is not executable, the return status is 126." and "When a command terminates on a fatal signal N, bash uses
  the value of 128+N as the exit status." Bash reports a job killed by a signal with strsignal's text
  (`<pid> Segmentation fault (core dumped) <command>`).
- signal numbers: torvalds/linux `arch/x86/include/uapi/asm/signal.h` at 1260ed77798502de9c98020040d2995008de10cc
  (1-31, the same as `include/uapi/asm-generic/signal.h`; SIGIOT = SIGABRT, SIGPOLL = SIGIO, SIGUNUSED = SIGSYS);
  texts: glibc's strsignal, bminor/glibc `sysdeps/generic/siglist.h` at 04e750e75b73957cf1c791535a3f4319534a52fc.
  Rust prints a child's death as `signal: N (SIGNAME)` (ExitStatus), coreutils `timeout` and our worker as exit
  128 + N.
- the worker's own codes: this table (worker-image/README.md "Exit codes" describes it for operators); their
  numbers follow sysexits.h (64 EX_USAGE .. 78 EX_CONFIG) and coreutils `timeout` (124). A failing tool's own code is
  passed through (curl 22, aria2c 3, cuzk-bench 1): those are read from the tool's own line, not from here.

Blame for a signal by who sent it or whose code raised it: a fault our binary raised itself (SIGSEGV, SIGBUS,
SIGABRT, SIGFPE, SIGILL, SIGSYS, an unhandled SIGUSR1/SIGALRM...) is our software; SIGKILL without a stop signal
before it is, on a rental, the OOM killer (configuration: host RAM); SIGTERM/SIGINT/SIGHUP/SIGQUIT say only that
someone stopped the process (generic: a stop from outside is the worker's own line, `received SIGTERM during
phase`, which decides: the marketplace); SIGXCPU/SIGXFSZ a container limit; SIGPWR the host's power; SIGPIPE and
the job-control signals say only that something around the process went first (unknown).
"""

from __future__ import annotations

from reconciler.domain.codes import Code, by_number

BASH_SOURCE = "GNU Bash manual, Exit Status: www.gnu.org/software/bash/manual/html_node/Exit-Status.html"
SIGNAL_SOURCE = ("torvalds/linux@1260ed77798502de9c98020040d2995008de10cc arch/x86/include/uapi/asm/signal.h, "
                 "bminor/glibc@04e750e75b73957cf1c791535a3f4319534a52fc sysdeps/generic/siglist.h")

#: The status bash gives a command killed by signal N (and coreutils timeout, and our worker, pass on).
SIGNAL_EXIT_BASE = 128

BASH_CODES: tuple[Code, ...] = (
    Code(126, "NOT_EXECUTABLE", "command found but not executable", "image", "permission-denied",
         "a script or binary in the image lacks its execute bit or cannot be run: our image"),
    Code(127, "NOT_FOUND", "command not found", "image", "command-not-found",
         "a program our scripts call is not in the image (or not on PATH): our image"),
)

_OUR_FAULT = "our binary raised it itself (or left it unhandled): our software"
_STOPPED = ("a stop: from outside the worker logs it (`received SIGTERM during phase ...`: the marketplace, which "
            "decides), but a process that died of it alone was stopped by whoever sent it (our own cleanup, a "
            "deadline): it names nobody")
_SIDE = "it says only that something around the process went first (a reader, a controlling terminal)"

#: Every signal 1-31 (signal number = exit status - 128).
SIGNALS: tuple[Code, ...] = (
    Code(1, "SIGHUP", "Hangup", "unknown", "signal-stopped", _STOPPED, generic=True),
    Code(2, "SIGINT", "Interrupt", "unknown", "signal-stopped", _STOPPED, generic=True),
    Code(3, "SIGQUIT", "Quit", "unknown", "signal-stopped", _STOPPED, generic=True),
    Code(4, "SIGILL", "Illegal instruction", "image", "cpu-instruction-set-missing",
         "our build used an instruction this CPU lacks (-march/target-cpu=native, AVX-512): our build, not a faulty "
         "CPU"),
    Code(5, "SIGTRAP", "Trace/breakpoint trap", "image", "fatal-signal", _OUR_FAULT),
    Code(6, "SIGABRT", "Aborted", "image", "process-aborted", f"{_OUR_FAULT} (abort(), a failed assertion)"),
    Code(7, "SIGBUS", "Bus error", "image", "bus-error",
         "our binary touched a mapping with nothing behind it (a truncated mmap'ed file, a full /dev/shm); a host "
         "memory fault logs a machine check, which outranks it"),
    Code(8, "SIGFPE", "Floating point exception", "image", "fatal-signal", f"{_OUR_FAULT} (an integer division "
         "by zero)"),
    Code(9, "SIGKILL", "Killed", "configuration", "process-sigkill",
         "nothing else sends SIGKILL unannounced on a rental: the kernel's OOM killer (a stop from outside sends "
         "SIGTERM first, which the worker logs): host RAM for the workload (pools[].min_host_ram_gb)"),
    Code(10, "SIGUSR1", "User defined signal 1", "image", "fatal-signal", _OUR_FAULT),
    Code(11, "SIGSEGV", "Segmentation fault", "image", "segfault", _OUR_FAULT),
    Code(12, "SIGUSR2", "User defined signal 2", "image", "fatal-signal", _OUR_FAULT),
    Code(13, "SIGPIPE", "Broken pipe", "unknown", "signal-ambiguous", _SIDE),
    Code(14, "SIGALRM", "Alarm clock", "image", "fatal-signal", _OUR_FAULT),
    Code(15, "SIGTERM", "Terminated", "unknown", "signal-stopped", _STOPPED, generic=True),
    Code(16, "SIGSTKFLT", "Stack fault", "image", "fatal-signal", _OUR_FAULT),
    Code(17, "SIGCHLD", "Child exited", "unknown", "signal-ambiguous", f"ignored by default: {_SIDE}"),
    Code(18, "SIGCONT", "Continued", "unknown", "signal-ambiguous", f"job control: {_SIDE}"),
    Code(19, "SIGSTOP", "Stopped (signal)", "unknown", "signal-ambiguous", f"job control: {_SIDE}"),
    Code(20, "SIGTSTP", "Stopped", "unknown", "signal-ambiguous", f"job control: {_SIDE}"),
    Code(21, "SIGTTIN", "Stopped (tty input)", "unknown", "signal-ambiguous", f"job control: {_SIDE}"),
    Code(22, "SIGTTOU", "Stopped (tty output)", "unknown", "signal-ambiguous", f"job control: {_SIDE}"),
    Code(23, "SIGURG", "Urgent I/O condition", "unknown", "signal-ambiguous", f"ignored by default: {_SIDE}"),
    Code(24, "SIGXCPU", "CPU time limit exceeded", "configuration", "container-limit",
         "the container's CPU-time limit (RLIMIT_CPU) was reached"),
    Code(25, "SIGXFSZ", "File size limit exceeded", "configuration", "container-limit",
         "the container's file-size limit (RLIMIT_FSIZE) was reached"),
    Code(26, "SIGVTALRM", "Virtual timer expired", "image", "fatal-signal", _OUR_FAULT),
    Code(27, "SIGPROF", "Profiling timer expired", "image", "fatal-signal", _OUR_FAULT),
    Code(28, "SIGWINCH", "Window changed", "unknown", "signal-ambiguous", f"ignored by default: {_SIDE}"),
    Code(29, "SIGIO", "I/O possible", "image", "fatal-signal", _OUR_FAULT),
    Code(30, "SIGPWR", "Power failure", "machine", "host-os-error", "the host signalled a power failure"),
    Code(31, "SIGSYS", "Bad system call", "image", "fatal-signal",
         "our binary made a system call the container's seccomp profile forbids: our software or how we run it"),
)

#: The worker's own exit codes (worker-image/lib/exit-codes.sh is generated from this): name (FLEET_EXIT_<name>),
#: code, what it means, blame, the signature of its message, why, and the messages the scripts fail with.
WORKER_EXITS: tuple[Code, ...] = (
    Code(64, "CONFIG", "missing or bad environment", "image", "worker-bad-environment",
         "the worker's environment is written by our provisioner from the spec (slots.worker_env): a bad value is "
         "ours to fix",
         prints=("missing required environment: %s", "%s must be a positive number of seconds, got '%s'",
                 "%s must be a positive integer, got '%s'", "%s must be integers, got '%s'",
                 "cannot size cuzk-daemon's memory budget: %s")),
    Code(65, "DATA", "a params file failed its checksum twice", "network", "checksum-mismatch",
         "a file arrived corrupt twice on this machine (the params policy strikes its network; the same file corrupt "
         "on every machine is the mirror, and the fleet says so)",
         prints=("checksum mismatch for %s after 2 downloads: blake2b-512 expected %s, got %s",)),
    Code(66, "NOINPUT", "the benchmark input (c1.json) is missing", "params", "bench-input-missing",
         "ship c1.json in the params mirror (params.base_url) or set FLEET_BENCH_C1",
         prints=("benchmark input (c1.json) missing: %s",)),
    Code(69, "UNAVAILABLE", "no params source", "configuration", "params-source-missing",
         "params.base_url is not set and the image has no curio to fetch them with",
         prints=("no params source: FLEET_PARAMS_BASE_URL is not set and curio is not installed",)),
    Code(70, "SOFTWARE", "a tool exited 0 without usable output", "image", "worker-tool-output-missing",
         "cuzk-bench or the daemon did not print what the worker reads (a throughput line, a [1/1] line): our build "
         "or our scripts' reading of it",
         prints=("cuzk-bench exited 0 but printed no throughput line (%s)",
                 "cuzk-bench batch (warm-up proof) exited 0 but printed no [1/1] line")),
    Code(75, "PROOF_FAILED", "the warm-up proof came back FAILED/CANCELLED/TIMEOUT/UNKNOWN", "unknown",
         "warmup-proof-failed", "the daemon's reason for the failed proof decides (its log is in the evidence); the "
         "label alone names nobody", prints=("the warm-up proof came back %s",)),
    Code(76, "MANIFEST", "the mirror's manifest is malformed or empty", "params", "params-manifest-bad",
         "the params mirror serves a bad manifest.txt: fix the mirror (params.base_url)",
         prints=("bad line %s in %s/manifest.txt (want '<b2sum hex>  <size>  <file name>'): %s",
                 "%s/manifest.txt lists no files")),
    Code(78, "BUDGET", "the daemon's memory budget cannot hold the SRS", "configuration", "memory-budget-blocks",
         "the pool's machines (or the container's memory limit) are too small for the workload",
         prints=("cuzk-daemon's memory budget cannot hold the SRS, so it would wait forever: %s",)),
    Code(124, "TIMEOUT", "a deadline passed (params, daemon readiness, warm-up, benchmark)", "unknown",
         "worker-deadline", "a deadline says something was slow or hung, not whether the machine, the mirror or our "
         "software was: the evidence before it, or the fleet, decides",
         prints=("params fetch exceeded FLEET_PARAMS_TIMEOUT_S=%ss %s",
                 "cuzk-daemon did not answer cuzk-bench status at %s within FLEET_DAEMON_WAIT_S=%ss",
                 "cuzk-bench preload -c %s did not finish within FLEET_WARMUP_TIMEOUT_S=%ss",
                 "the warm-up proof did not finish within FLEET_WARMUP_TIMEOUT_S=%ss",
                 "cuzk-bench did not finish within FLEET_BENCH_TIMEOUT_S=%ss: %s")),
)

BASH: dict[int, Code] = by_number(BASH_CODES)
SIGNAL: dict[int, Code] = by_number(SIGNALS)
WORKER_EXIT: dict[int, Code] = by_number(WORKER_EXITS)


def signal_of_exit(status: int) -> Code | None:
    """The signal an exit status 129-159 stands for (128 + N), else None."""
    return SIGNAL.get(status - SIGNAL_EXIT_BASE) if status > SIGNAL_EXIT_BASE else None


def render_worker_exit_codes() -> str:
    """worker-image/lib/exit-codes.sh: the worker's readonly FLEET_EXIT_* constants, from WORKER_EXITS."""
    out = ["# Generated from reconciler/domain/exit_statuses.py WORKER_EXITS: do not edit. Regenerate with",
           "#   .venv/bin/python -c 'from reconciler.domain.exit_statuses import render_worker_exit_codes as r; "
           "print(r(), end=\"\")' > worker-image/lib/exit-codes.sh",
           "# The worker's own exit codes (a failing tool's own code is passed through): code, meaning, and whom the",
           "# judge blames for it (its message decides: the signature named in the table).",
           "# shellcheck shell=bash disable=SC2034"]
    for c in WORKER_EXITS:
        out.append(f"readonly FLEET_EXIT_{c.name}={c.number}  # {c.text} (blame: {c.blame})")
    return "\n".join(out) + "\n"

"""Failure signatures: which line of a worker's log says who broke the benchmark, and why.

Used by `verdict.py` (blame and the root-cause line of every failed verdict) and, through the verdicts'
signature names, by `breaker.py`; the evidence scan picks its cause with `strongest_signature`. Pure data and
pure functions; the strings come from the real tools, each group citing its source (curio `extern/cuzk` and
`extern/supraseal-c2` at e0294b0f, sppark, NVIDIA's Xid catalogue, aria2c and curl exit codes, glibc, bash,
the kernel, Go crypto/x509, OpenSSL via curl, rustls, libstdc++); the two tables built whole live beside this
module (`cuda_errors.py`: every cudaError and CUresult code; `xid.py`: every Xid of NVIDIA's catalogue).
`tests/fixtures/tails/` holds whole real tails for every class, and test_signature_generalisation.py real
lines the tables were not written from.

How a tail is read (`logical_lines`):
1. Each line is cleaned: the worker's ring timestamp (`2026-12-03T06:40:00Z `), ANSI colour and the daemon's
   own tracing timestamp are stripped; a stream tag the worker adds (`cuzk-daemon: `, `tunnel: `) is kept
   and used to keep streams apart.
2. Multi-line reports are joined into one logical line, within one stream: a Rust panic (`thread '..'
   panicked at <file>:<line>:<col>:` with the message on the NEXT line, Rust >= 1.73), an anyhow chain
   (`Error: X`, blank, `Caused by:`, `    0: Y` ...; unnumbered with one cause), an aria2c exception and
   its `  -> [...]` causes, a C++ `terminate called after throwing an instance of 'T'` and its `what():`.
3. Noise never matches and is never a root cause: aria2c progress lines, cuzk's timing lines
   (`CUZK_TIMING:`, `CUZK_NTT_H:`, `TIMELINE,`, `FIN_TIMING`/`GPU_TIMING`, `pacer:`), per-proof result lines,
   Rust's backtrace hint; tunnel lines unless the tunnel itself is the failing phase.

Precedence: every signature has a priority (PRIORITY_*: how decisive its line is); the highest-priority match
anywhere in the evidence wins, the earliest line on a tie. Hardware first (Xid, NVML, GPU lost, a machine
check: a GPU fault cascades into software symptoms), then the dynamic loader and missing binaries (the
image cannot run at all), memory kills and disk (a daemon killed for memory is followed by "connection
refused", which must not outrank it), decoded CUDA errors (machine-class codes above the rest), TLS and
params set-up, our software and deaths by signal, network, a marketplace stop, an ambiguous Xid, a generic
panic, and last the cascade symptoms (our daemon not answering, an RPC that failed because the daemon died).
One signature needs two lines: cuzk's `cudaHostAlloc failed` warning and a later out-of-memory code are
pinned host memory (`PINNED_HOST_MEMORY`, applied by `refine`).

To extend: add a Signature at the right priority, a realistic line to tests/unit/test_signatures.py and,
for a new failure mode, a whole tail with its source to tests/fixtures/tails/.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from reconciler.domain import cuda_errors, xid
from reconciler.domain.verdicts import BLAMES

#: How much a signature's line says (issue 29 item 1). A specific line names the failure itself: a tool's own error
#: code with the description that goes with it, a kernel or driver line, a loader line, an errno. A generic line
#: is a wrapper's word that something failed ("Download aborted", "exited with code N", a tool's "unknown error"):
#: it is shown when nothing better was logged, but it never decides blame (`verdict.py` judges it `unknown`).
SPECIFIC = "specific"
GENERIC = "generic"
STRENGTHS = (SPECIFIC, GENERIC)


@dataclass(frozen=True)
class Signature:
    name: str
    blame: str
    priority: int
    pattern: re.Pattern[str]
    description: str
    #: For configuration/params blame: the spec setting to change (shown with the verdict).
    setting: str | None = None
    #: What a numeric code in the line means, when the line shows only the number (CUDA, aria2c, curl).
    explains: str | None = None
    #: Match the line with its stream tag only (a tagged line's body alone would lose `cuzk-daemon:` context).
    whole_line: bool = False
    #: Lower-case literals, one of which every match of `pattern` contains: a line that has none of them is
    #: not searched (tests/unit/test_signature_prefilter.py proves this from the parsed pattern).
    needs: tuple[str, ...] = ()
    #: SPECIFIC or GENERIC. Every generic signature ranks below every specific one (PRIORITY_GENERIC_BELOW), so
    #: the strongest line of the whole evidence is the most specific one, whatever its priority.
    strength: str = SPECIFIC

    def __post_init__(self) -> None:
        if self.blame not in BLAMES or self.blame == "none":
            raise ValueError(f"signature {self.name!r}: blame {self.blame!r} not a failure blame in {BLAMES}")
        if self.strength not in STRENGTHS:
            raise ValueError(f"signature {self.name!r}: strength {self.strength!r} not one of {STRENGTHS}")
        if (self.strength == GENERIC) != (self.priority < PRIORITY_GENERIC_BELOW):
            raise ValueError(f"signature {self.name!r}: a {self.strength} signature needs a priority "
                             f"{'below' if self.strength == GENERIC else 'of at least'} {PRIORITY_GENERIC_BELOW}, "
                             f"not {self.priority}")

    @property
    def generic(self) -> bool:
        return self.strength == GENERIC


def _sig(name: str, blame: str, priority: int, regex: str, description: str, *, needs: Iterable[str],
         setting: str | None = None, explains: str | None = None, whole_line: bool = False,
         flags: int = re.IGNORECASE, strength: str = SPECIFIC) -> Signature:
    return Signature(name, blame, priority, re.compile(regex, flags), description, setting, explains, whole_line,
                     tuple(dict.fromkeys(needs)), strength)


# How decisive a line is: the highest priority found anywhere in the evidence names the cause
# (`strongest_signature`). A decisive hardware line outranks what it causes downstream (a CUDA code, a panic,
# a daemon that stopped answering); a symptom (our daemon exited, a timeout) is the cause only when nothing
# more decisive was logged.
PRIORITY_HARDWARE = 100   # hardware Xid, NVML / nvidia-smi, GPU lost, the host's GPU runtime
PRIORITY_APPLICATION_XID = 95  # the driver names our process as the one that faulted the GPU
PRIORITY_LOADER = 92      # dynamic-loader failure, missing binary: the image cannot run at all
PRIORITY_MEMORY_KILL = 90  # OOM kill, disk full: the pool is sized wrong
PRIORITY_CUDA_CODE = 85   # a decoded cudaError
PRIORITY_PARAMS = 80      # the params set-up
PRIORITY_SOFTWARE = 70    # our scripts and binaries
PRIORITY_NETWORK = 60     # the machine's network while fetching
PRIORITY_MARKETPLACE = 55  # stopped from outside
PRIORITY_PANIC = 50       # a generic panic in our binaries
PRIORITY_SYMPTOM = 30     # cascade symptoms: our daemon gone, an RPC that failed because of it
PRIORITY_GENERIC_BELOW = 20  # every GENERIC signature (a wrapper's "failed") ranks below this, every SPECIFIC one not
PRIORITY_GENERIC = 10

# Settings named by configuration/params verdicts (fleet-spec/schema/fleet.schema.json).
SETTING_VRAM = "pools[].gpu_name (a GPU with more memory) or pools[].benchmark.concurrency"
SETTING_HOST_RAM = "pools[].min_host_ram_gb (and the daemon's [memory] total_budget)"
#: cudaHostAlloc pins HOST memory (page-locked RAM), not GPU memory. cuzk has no pinned-pool setting of its own:
#: the pool counts against [memory] total_budget, and `memory.pinned_budget` is deprecated and ignored (curio
#: e0294b0f extern/cuzk/cuzk-core/src/config.rs:76-80,115-119; pinned_pool.rs:57-68,194-206).
SETTING_PINNED_HOST = ("pools[].min_host_ram_gb (cudaHostAlloc pins host RAM, not GPU memory), the container's "
                       "locked-memory limit (docker --ulimit memlock=-1) and the daemon's [memory] total_budget")
SETTING_MIN_CUDA = ("pools[].min_cuda (offers' cuda_max_good must reach the CUDA version the image is built with; "
                    "or build the image for an older CUDA)")
SETTING_CA_BUNDLE = "worker-image/ (install ca-certificates: the image has no CA bundle for the mirror's TLS)"
SETTING_CPU_BASELINE = ("the image's build flags (a portable CPU baseline, no -march/target-cpu=native) or a pool "
                        "CPU filter: the binary uses instructions this CPU lacks")
SETTING_DISK = "pools[].disk_gb"
SETTING_MIRROR = "params.base_url (the mirror must serve every file of the manifest)"
SETTING_PARAMS_SET = "params (sector_size / base_url): the params dir lacks a file the proof needs"
SETTING_BENCH_INPUT = "params.base_url (ship c1.json in the mirror) or the worker's FLEET_BENCH_C1"

# --- decoding tables ------------------------------------------------------------------------------------
#: cudaError_t codes with a signature of their own: code -> (enum name, cudaGetErrorString, blame, signature
#: name, setting). Every other code of the whole table (`cuda_errors.CUDA_ERRORS`) is decoded by the class
#: signatures `cuda-gpu-fault` (machine) and `cuda-software-error` (image).
#: sppark reports them negated (`sppark::Error #-2`, sppark util/exception.cuh:12-21) in builds without
#: TAKE_RESPONSIBILITY_FOR_ERROR_MESSAGE, else as `<expr>@<file>:<line> failed: "<text>"`.
CUDA_OWN_SIGNATURES: dict[int, tuple[str, str, str, str, str | None]] = {
    2: ("cudaErrorMemoryAllocation", "out of memory", "configuration", "cuda-out-of-memory", SETTING_VRAM),
    3: ("cudaErrorInitializationError", "initialization error", "machine", "cuda-init-error", None),
    46: ("cudaErrorDevicesUnavailable", "CUDA-capable device(s) is/are busy or unavailable", "machine",
         "cuda-devices-unavailable", None),
    100: ("cudaErrorNoDevice", "no CUDA-capable device is detected", "machine", "cuda-no-device", None),
    209: ("cudaErrorNoKernelImageForDevice", "no kernel image is available for execution on the device", "image",
          "cuda-no-kernel-image", None),
    214: ("cudaErrorECCUncorrectable", "uncorrectable ECC error encountered", "machine", "gpu-ecc", None),
    222: ("cudaErrorUnsupportedPtxVersion", "the provided PTX was compiled with an unsupported toolchain.", "image",
          "cuda-unsupported-ptx", None),
    700: ("cudaErrorIllegalAddress", "an illegal memory access was encountered", "image", "cuda-illegal-address",
          None),
}

#: The whole NVIDIA Xid catalogue by class (`xid.py`: which Xid says what about whom).
XID_APPLICATION = xid.xids_of(xid.APPLICATION)
XID_ECC = xid.xids_of(xid.MEMORY)
XID_FELL_OFF_BUS = xid.xids_of(xid.BUS)
XID_GSP_TIMEOUT = xid.xids_of(xid.GSP)
XID_HARDWARE = xid.xids_of(xid.HARDWARE)
XID_AMBIGUOUS = xid.xids_of(xid.AMBIGUOUS)

#: CUDA runtime codes decoded by the class signatures (the whole enum less those with their own signature).
CUDA_GPU_FAULT = tuple(c for c in cuda_errors.codes_with_blame("machine") if c not in CUDA_OWN_SIGNATURES)
CUDA_SOFTWARE = tuple(c for c in cuda_errors.codes_with_blame("image") if c not in CUDA_OWN_SIGNATURES)

#: aria2c EXIT STATUS (aria2 manual) grouped by meaning.
ARIA2_NOT_FOUND = (3, 4)
ARIA2_DISK_FULL = (9,)
ARIA2_DNS = (19,)
ARIA2_NETWORK = (2, 5, 6, 8, 22)
#: aria2c's codes that say only that it stopped: 1 "an unknown error occurred" (also every socket error it does
#: not classify: the cause is in its `-> [...]` lines), 7 "unfinished downloads" (it was stopped by a signal).
ARIA2_GENERIC = (1, 7)
ARIA2_CHECKSUM = (32,)
ARIA2_MEANING = {1: "unknown error", 2: "timeout", 3: "resource not found", 4: "too many resources not found",
                 5: "download too slow", 6: "network problem", 7: "unfinished downloads", 8: "no resume support",
                 9: "not enough disk space", 19: "name resolution failed", 22: "bad HTTP response",
                 24: "HTTP authorization failed", 28: "bad or unrecognized option",
                 29: "server overloaded or in maintenance", 32: "checksum validation failed"}
#: curl EXIT CODES (curl man page) grouped by meaning.
CURL_NOT_FOUND = (22,)
CURL_DNS = (6,)
CURL_CONNECT = (7,)
CURL_TIMEOUT = (28,)
CURL_DISK = (23,)
CURL_NETWORK = (16, 18, 35, 52, 55, 56, 92)
CURL_MEANING = {2: "failed to initialize", 3: "URL using bad/illegal format or missing URL",
                6: "couldn't resolve host", 7: "failed to connect", 16: "HTTP/2 error", 18: "partial file",
                35: "SSL connect error",
                22: "HTTP error (-f)", 23: "write error", 28: "operation timed out", 52: "empty reply",
                55: "send failure", 56: "receive failure", 60: "peer certificate cannot be authenticated",
                77: "problem with the CA cert (path? access rights?)", 92: "HTTP/2 stream error"}


def _codes(codes: Iterable[int]) -> str:
    return "(?:" + "|".join(str(c) for c in codes) + r")\b"


# `NVRM: Xid (PCI:0000:01:00): 79, ...` and the older `NVRM: Xid (0000:01:00): 31, ...` (no `PCI:`).
_XID = r"\bXid(?: \((?:PCI:)?[0-9a-fA-F:.]+\))?:?\s+"


def _xid(codes: Iterable[int]) -> str:
    return _XID + _codes(codes)


# The `needs` of the shared pieces: what every match of `_xid`, `_aria2`, `_curl` and `_cuda` contains.
_XID_NEEDS = ("xid",)
_ARIA2_NEEDS = ("errorcode=", "exit code ")
_CURL_NEEDS = ("curl: (", "exit code ")


def _cuda_needs(code: int) -> tuple[str, ...]:
    enum, text, *_ = CUDA_OWN_SIGNATURES[code]
    driver = cuda_errors.DRIVER_ERROR_NAMES.get(code)
    return f"sppark::error #-{code}", enum.lower(), text.lower(), *((driver.lower(),) if driver else ())


def _aria2(codes: Iterable[int]) -> str:
    # aria2c's own line (`errorCode=3`) or the worker's account (`aria2c failed to download URL (exit code 3)`).
    return rf"(?:\berrorCode=|\baria2c\b.*\bexit code ){_codes(codes)}"


def _curl(codes: Iterable[int]) -> str:
    return rf"(?:^curl: \(|\bcurl exit code |\bcurl\b.*\bexit code ){_codes(codes)}"


def _cuda(code: int) -> str:
    enum, text, *_ = CUDA_OWN_SIGNATURES[code]
    driver = cuda_errors.DRIVER_ERROR_NAMES.get(code)
    return (rf"sppark::Error #-{code}\b|failed: \"{re.escape(text)}\"|\b{enum}\b|{re.escape(text)}"
            + (rf"|\b{driver}\b" if driver else ""))


def _cuda_class(codes: Sequence[int], names: Sequence[str] = (),
                driver_codes: Sequence[int] = ()) -> tuple[str, tuple[str, ...]]:
    """(regex, needs) for a class of CUDA codes: sppark's negated code, the enum name, the driver API's name
    (`CUDA_ERROR_...`), and the runtime's text where the table has it (quoted by sppark or after PyTorch's
    `CUDA error: `; bare when it is distinctive)."""
    enums = [cuda_errors.CUDA_ERRORS[c].name for c in codes] + list(names)
    texts = [t for c in codes if (t := cuda_errors.CUDA_ERRORS[c].text)]
    drivers = [cuda_errors.DRIVER_ERROR_NAMES[c].removeprefix("CUDA_ERROR_") for c in driver_codes]
    regex = (rf"sppark::Error #-(?:{'|'.join(str(c) for c in codes)})\b"
             rf"|\bcudaError(?:{'|'.join(e.removeprefix('cudaError') for e in enums)})\b")
    needs = ["sppark::error #-", "cudaerror"]
    if drivers:
        regex += rf"|\bCUDA_ERROR_(?:{'|'.join(drivers)})\b"
        needs.append("cuda_error_")
    if texts:
        quoted = "|".join(re.escape(t) for t in texts)
        regex += rf"|failed: \"(?:{quoted})\"|CUDA error: (?:{quoted})"
        needs += ['failed: "', "cuda error: "]
        distinctive = [t for t in texts if len(t) > 20]
        if distinctive:
            regex += "|" + "|".join(re.escape(t) for t in distinctive)
            needs += [t.lower() for t in distinctive]
    return regex, tuple(needs)


#: Driver API codes decoded by the class signatures (those with a signature of their own, and 214 in gpu-ecc,
#: are decoded there).
_OWN_DRIVER = (*CUDA_OWN_SIGNATURES, 214)
_CUDA_GPU_FAULT = _cuda_class(CUDA_GPU_FAULT, driver_codes=[
    c for c in cuda_errors.driver_codes_with_blame("machine") if c not in _OWN_DRIVER])
_CUDA_DRIVER_TOO_OLD = _cuda_class([c for c in cuda_errors.codes_with_blame("configuration")
                                    if c not in CUDA_OWN_SIGNATURES])
_CUDA_SOFTWARE = _cuda_class(CUDA_SOFTWARE, cuda_errors.CUDA_13_NAMES, driver_codes=[
    c for c in cuda_errors.driver_codes_with_blame("image") if c not in _OWN_DRIVER])


def _cuda_sigs(priority: int) -> list[Signature]:
    out = []
    for code, (enum, text, blame, name, setting) in CUDA_OWN_SIGNATURES.items():
        if blame == "machine":
            continue  # in the hardware group, at hardware priority
        out.append(_sig(name, blame, priority, _cuda(code), f"CUDA error {code} ({enum}): {text}",
                        needs=_cuda_needs(code), setting=setting, explains=f"{enum} ({code}): {text}"))
    return out


def _exit_code(code: int) -> str:
    # The worker's account of a cuzk process (`cuzk-daemon exited (code 139) ...`, `cuzk-bench exited with code
    # 139 ...`), a shell's `exit code 139`, Rust's `signal: 11`: 128 + the signal number.
    return rf"\bexited (?:with |\()code {code}\b|\bexit code {code}\b|\bsignal: {code - 128}\b"


def _exit_code_needs(code: int) -> tuple[str, ...]:
    return f"code {code}", f"signal: {code - 128}"

# What our own daemon looks like from the bench or the worker (loopback or the daemon named).
_OUR_DAEMON = r"(?:127\.0\.0\.1|localhost|\[::1\]|:9820\b|unix://|cuzk|daemon)"

SIGNATURES: tuple[Signature, ...] = tuple(sorted((
    # --- 100: GPU hardware, host driver and runtime: the machine ------------------------------------
    _sig("gpu-fell-off-bus", "machine", 100, rf"fallen off the bus|{_xid(XID_FELL_OFF_BUS)}",
         "the GPU disappeared from PCIe (Xid 79): hardware or power", needs=("fallen off the bus", *_XID_NEEDS)),
    _sig("gpu-ecc", "machine", 100,
         rf"uncorrectable ECC|double bit error|ECC_UNCORRECTABLE|cudaErrorECCUncorrectable|sppark::Error #-214\b"
         rf"|{_xid(XID_ECC)}",
         "GPU memory errors (Xid 48/63/64/92/94/95, uncorrectable ECC): the GPU needs reset or service",
         needs=("uncorrectable ecc", "double bit error", "ecc_uncorrectable", "cudaerroreccuncorrectable",
                "sppark::error #-214", *_XID_NEEDS)),
    _sig("gpu-gsp-timeout", "machine", 100, rf"{_xid(XID_GSP_TIMEOUT)}|waiting for RPC response from GPU\d* GSP",
         "the GPU's GSP firmware stopped answering or failed (Xid 119/120): driver or hardware",
         needs=(*_XID_NEEDS, "waiting for rpc response from gpu")),
    _sig("gpu-xid-hardware", "machine", PRIORITY_HARDWARE, _xid(XID_HARDWARE),
         "an NVIDIA Xid the catalogue files as fatal to the GPU (reset the GPU, reboot, check mechanicals, NVLink): "
         "hardware or driver", needs=_XID_NEEDS),
    _sig("host-memory-hardware-error", "machine", PRIORITY_HARDWARE,
         r"hardware memory corruption|\bMemory failure: 0x[0-9a-f]+|\[Hardware Error\]|Machine check events logged",
         "the host's RAM or CPU reported a hardware error (machine check / memory failure: the kernel sends SIGBUS "
         "to the process using the page)",
         needs=("hardware memory corruption", "memory failure: 0x", "[hardware error]", "machine check events logged")),
    _sig("gpu-lost", "machine", 100, r"GPU is lost|GPU has been lost",
         "the driver lost the GPU (nvidia-smi): reboot or service", needs=("is lost", "has been lost")),
    _sig("nvidia-driver-unreachable", "machine", 100,
         r"couldn't communicate with the NVIDIA driver"
         r"|Failed to initialize NVML: (?:Unknown Error|GPU access blocked|Driver Not Loaded|Insufficient Permissions)"
         r"|Unable to determine the device handle for GPU\S*: Unknown Error",
         "the host's NVIDIA driver is not loaded or not reachable from the container",
         needs=("couldn't communicate with the nvidia driver", "failed to initialize nvml: ",
                "unable to determine the device handle for gpu")),
    _sig("nvidia-driver-mismatch", "machine", 100, r"Driver/library version mismatch",
         "the host's kernel driver and user-space NVIDIA libraries differ (upgraded without reboot)",
         needs=("driver/library version mismatch",)),
    _sig("nvidia-no-device", "machine", 100, r"^(?:fleet: nvidia-smi failed: )?No devices were found",
         "nvidia-smi sees no GPU in the container", needs=("no devices were found",)),
    _sig("cuda-no-device", "machine", 100,
         rf"{_cuda(100)}|No CUDA devices available|CUDA_ERROR_NO_DEVICE|No CUDA GPUs are available",
         "the container sees no usable GPU (cudaErrorNoDevice / supraseal's ngpus() == 0)",
         explains="cudaErrorNoDevice (100): no CUDA-capable device is detected",
         needs=(*_cuda_needs(100), "no cuda devices available", "cuda_error_no_device",
                "no cuda gpus are available")),
    _sig("cuda-init-error", "machine", 100, _cuda(3), "CUDA could not initialise the driver",
         explains="cudaErrorInitializationError (3): initialization error", needs=_cuda_needs(3)),
    _sig("cuda-devices-unavailable", "machine", 100, _cuda(46),
         "the GPU is busy or unavailable (exclusive mode held by another process)",
         explains="cudaErrorDevicesUnavailable (46): device busy or unavailable", needs=_cuda_needs(46)),
    _sig("nvidia-libs-missing", "machine", 100,
         r"lib(?:nvidia-ml|cuda)\.so(?:\.\d+)*: cannot open shared object file|/dev/nvidia\w*: No such file"
         r"|couldn't find libnvidia-ml\.so|\bnvidia-smi: (?:command )?not found",
         "the host's container runtime did not inject the NVIDIA driver libraries, tools (nvidia-smi) or devices",
         needs=("cannot open shared object file", "/dev/nvidia", "couldn't find libnvidia-ml.so",
                "nvidia-smi: ")),
    # The kernel driver could not bring the GPU up (NVRM: `RmInitAdapter failed!`, older drivers
    # `rm_init_adapter failed for device bearing minor number N`): the GPU or its host.
    _sig("gpu-init-failed", "machine", PRIORITY_HARDWARE,
         r"RmInitAdapter failed|rm_init_adapter failed|NVIDIA probe routine failed|None of the NVIDIA devices were "
         r"initialized",
         "the host's NVIDIA driver could not initialise the GPU (RmInitAdapter failed): hardware, power or driver",
         needs=("rminitadapter failed", "rm_init_adapter failed", "nvidia probe routine failed",
                "none of the nvidia devices were initialized")),
    _sig("host-no-gpu-runtime", "machine", 100,
         r"could not select device driver .* with capabilities: \[\[gpu\]\]|nvidia-container-cli: initialization error",
         "the host's docker has no working NVIDIA container runtime",
         needs=("could not select device driver", "nvidia-container-cli: initialization error")),
    # --- 95: application Xids: our software faulted the GPU ------------------------------------------
    _sig("gpu-xid-application", "image", 95, _xid(XID_APPLICATION),
         "NVIDIA Xid 13/31/43: an application fault (NVIDIA: restart the application) - our software",
         needs=_XID_NEEDS),
    _sig("cuda-gpu-fault", "machine", PRIORITY_CUDA_CODE + 2, _CUDA_GPU_FAULT[0],
         "a CUDA error that says the GPU, its driver or the host's CUDA set-up failed (719 launch failure and 999 "
         "unknown are how a GPU that fell off the bus shows without a kernel log); the same code on distinct "
         "machines with one image is the breaker's to judge (breaker.symptom_only)", needs=_CUDA_GPU_FAULT[1]),
    # --- 92: the image cannot run at all: dynamic loader, missing binary --------------------------------
    _sig("loader-version-missing", "image", PRIORITY_LOADER,
         r"version [`'\u2018]?(?:GLIBC_|GLIBCXX_|CXXABI_|GCC_)[\d.]+'? not found",
         "a binary in the image was built against a newer glibc/libstdc++ than the image ships (glibc's loader: "
         "version `GLIBC_x' not found)", needs=("glibc", "cxxabi_", "gcc_")),
    _sig("shared-library-missing", "image", PRIORITY_LOADER, r"error while loading shared libraries",
         "a library our binaries need is missing from the image", needs=("error while loading shared libraries",)),
    _sig("loader-symbol-missing", "image", PRIORITY_LOADER, r"symbol lookup error: .*undefined symbol",
         "a binary in the image was linked against another version of a library than the image ships (glibc's "
         "loader: symbol lookup error ... undefined symbol)", needs=("symbol lookup error: ",)),
    _sig("binary-not-installed", "image", PRIORITY_LOADER, r"is not installed in this image",
         "the worker found no cuzk binary in the image (worker-image/entrypoint.sh)",
         needs=("is not installed in this image",)),
    _sig("command-not-found", "image", PRIORITY_LOADER, r"\S+: (?:command )?not found\s*$|: command not found\b",
         "a program our scripts call is not in the image", needs=("not found",)),
    # runc reports a missing interpreter or loader of the entrypoint as `exec <path>: no such file or directory`.
    _sig("exec-format-error", "image", PRIORITY_LOADER,
         r"exec format error|cannot execute binary file|^exec \S+: no such file or directory",
         "a binary in the image was built for another platform or its interpreter/loader is missing",
         needs=("exec format error", "cannot execute binary file", ": no such file or directory")),
    # --- 90: memory kills and disk: the pool is sized wrong for the workload --------------------------
    _sig("host-out-of-memory", "configuration", 90,
         r"Out of memory: Kill(?:ed)? process|Memory cgroup out of memory|invoked oom-killer|\boom_kill [1-9]\d*"
         r"|memory allocation of \d+ bytes failed|Cannot allocate memory|std::bad_alloc|runtime: out of memory"
         r"|\bMemoryError\b",
         "host RAM exhausted: the kernel OOM killer, the cgroup limit, or a failed allocation",
         setting=SETTING_HOST_RAM,
         needs=("out of memory", "oom", "memory allocation of ", "cannot allocate memory", "std::bad_alloc",
                "memoryerror")),
    _sig("process-killed", "configuration", 90,
         r"^(?:\S+: )?(?:line \d+: )?\s*\d+ Killed\s+.*cuzk|^Killed\s+.*cuzk|\bcuzk[\w-]* .*\bkilled by signal 9\b",
         "our cuzk process was SIGKILLed (bash job notification): the OOM killer, host RAM for the workload",
         setting=SETTING_HOST_RAM, needs=("killed",)),
    _sig("srs-memory-budget", "configuration", 90, r"insufficient memory budget for SRS",
         "the daemon's memory budget cannot hold the SRS (curio srs_manager.rs:190-199)",
         setting=SETTING_HOST_RAM, needs=("insufficient memory budget for srs",)),
    _sig("memory-budget-blocks", "configuration", 90, r"acquire request exceeds total budget",
         "the daemon's memory budget is smaller than one request (the SRS): it would wait forever "
         "(curio cuzk-core memory.rs:188-192)",
         setting=SETTING_HOST_RAM, needs=("acquire request exceeds total budget",)),
    _sig("disk-full", "configuration", 90,
         rf"No space left on device|Disk quota exceeded|\bENOSPC\b|{_aria2(ARIA2_DISK_FULL)}|{_curl(CURL_DISK)}",
         "the instance disk filled up (params are ~53 GiB for 32GiB sectors, PCE data ~25 GiB more)",
         setting=SETTING_DISK,
         needs=("no space left on device", "disk quota exceeded", "enospc", *_ARIA2_NEEDS, *_CURL_NEEDS)),
    # --- 85: decoded CUDA errors (out of memory -> configuration; kernels/PTX/faults -> image) ---------
    *_cuda_sigs(PRIORITY_CUDA_CODE),
    # The host's driver is older than the CUDA our image was built with (35, 36; nvidia-container-cli refuses
    # such a container with `requirement error: unsatisfied condition: cuda>=12.4`): neither the machine (its
    # driver is what the offer said) nor a bug in our image, but the pool admitting offers below the image's CUDA.
    _sig("cuda-driver-too-old-for-image", "configuration", PRIORITY_CUDA_CODE,
         _CUDA_DRIVER_TOO_OLD[0] + r"|unsatisfied condition: cuda>=",
         "the host's NVIDIA driver is older than the CUDA runtime in our image (cudaErrorInsufficientDriver 35 / "
         "cudaErrorCallRequiresNewerDriver 36)", setting=SETTING_MIN_CUDA,
         needs=(*_CUDA_DRIVER_TOO_OLD[1], "unsatisfied condition: cuda>=")),
    _sig("cuda-software-error", "image", PRIORITY_CUDA_CODE, _CUDA_SOFTWARE[0],
         "a CUDA error our software caused (an invalid call, a kernel fault, a missing kernel or PTX for this GPU)",
         needs=_CUDA_SOFTWARE[1]),
    # --- 81: TLS to the params mirror, by cause -------------------------------------------------------
    # Go crypto/x509 (x509.go CertificateInvalidError.Error), OpenSSL X509_verify_cert_error_string as curl
    # prints it (`curl: (60) SSL certificate problem: ...`), rustls CertificateError (Debug), GnuTLS verify
    # status (aria2c's TLS on Debian/Ubuntu). The table order decides on one line: clock first.
    _sig("tls-clock-behind", "machine", PRIORITY_PARAMS + 1,
         r"current time \S+ is before \S+|certificate is not yet valid|\bNotValidYet\b|not yet activated"
         r"|uses not yet valid certificate",
         "the machine's clock is before the certificate's start (notBefore): the host clock is wrong",
         needs=("current time ", "certificate is not yet valid", "notvalidyet", "not yet activated",
                "uses not yet valid certificate")),
    _sig("tls-certificate-expired", "params", PRIORITY_PARAMS + 1,
         r"current time \S+ is after \S+|certificate has expired|invalid peer certificate: Expired\b"
         r"|uses expired certificate",
         "the params mirror's TLS certificate has expired (or the machine's clock is far ahead)",
         setting=SETTING_MIRROR,
         needs=("current time ", "certificate has expired", "invalid peer certificate: expired",
                "uses expired certificate")),
    _sig("tls-unknown-authority", "image", PRIORITY_PARAMS + 1,
         r"certificate signed by unknown authority|unable to get local issuer certificate|failed to load system roots"
         r"|error setting certificate (?:verify locations|file)|\bUnknownIssuer\b|issuer is not known"
         r"|not signed by known authorities|certificate issuer is unknown|self[- ]signed certificate"
         r"|^curl: \(77\)|\bcurl\b.*\bexit code 77\b",
         "the image cannot verify the mirror's TLS certificate: no CA bundle (ca-certificates) in our image",
         setting=SETTING_CA_BUNDLE,
         needs=("certificate signed by unknown authority", "unable to get local issuer certificate",
                "failed to load system roots", "error setting certificate ", "unknownissuer", "issuer is not known",
                "not signed by known authorities", "certificate issuer is unknown", "signed certificate",
                "curl: (77)",
                "exit code 77")),
    _sig("tls-hostname-mismatch", "configuration", PRIORITY_PARAMS + 1,
         r"x509: certificate is valid for .*, not \S+|no alternative certificate subject name matches"
         r"|\bNotValidForName\b|does not match target host name",
         "the mirror's certificate is for another host name: params.base_url names the wrong host",
         setting=SETTING_MIRROR,
         needs=("x509: certificate is valid for ", "no alternative certificate subject name matches",
                "notvalidforname", "does not match target host name")),
    # --- 80: params set-up --------------------------------------------------------------------------
    # HTTP statuses from the params mirror (curl -f: `The requested URL returned error: N`; aria2c: `status=N`
    # in its exception, exit 24 for authorization; wget `ERROR N: `; Python urllib `HTTP Error N: `). Before
    # params-not-found: on one `curl: (22) ... returned error: 403` line the status decides.
    _sig("params-mirror-denied", "configuration", PRIORITY_PARAMS,
         r"returned error: 40[13]\b|\bstatus=40[13]\b|ERROR 40[13]: |HTTP Error 40[13]\b"
         r"|\berrorCode=24\b|\baria2c\b.*\bexit code 24\b",
         "the params mirror refused us (HTTP 401/403): our configuration (params.base_url, its credentials)",
         setting=SETTING_MIRROR, explains="aria2c 24: HTTP authorization failed",
         needs=("returned error: 40", "status=40", "error 40", "http error 40", "errorcode=24", "exit code 24")),
    _sig("params-mirror-unavailable", "params", PRIORITY_PARAMS,
         r"returned error: (?:429|50[234])\b|\bstatus=(?:429|50[234])\b|ERROR 429: |ERROR 50[234]: "
         r"|HTTP Error (?:429|50[234])\b|\berrorCode=29\b|\baria2c\b.*\bexit code 29\b",
         "the params mirror is overloaded, rate-limiting or down (HTTP 429/502/503/504): the mirror, not the machine",
         setting=SETTING_MIRROR, explains="aria2c 29: server overloaded or in maintenance",
         needs=("returned error: ", "status=", "error 429: ", "error 50", "http error ", "errorcode=29",
                "exit code 29")),
    _sig("params-not-found", "params", PRIORITY_PARAMS,
         rf"{_aria2(ARIA2_NOT_FOUND)}|{_curl(CURL_NOT_FOUND)}|returned error: 404\b|\bstatus=404\b|ERROR 404: "
         rf"|HTTP Error 404\b",
         "the params mirror does not serve a file (HTTP 404): the mirror or params.base_url",
         setting=SETTING_MIRROR, explains="aria2c 3 / curl 22: resource not found",
         needs=(*_ARIA2_NEEDS, *_CURL_NEEDS, "returned error: 404", "status=404", "error 404", "http error 404")),
    _sig("srs-param-file-missing", "params", 80, r"SRS param file not found",
         "the daemon cannot find the SRS .params file for the proof (curio srs_manager.rs:173-178)",
         setting=SETTING_PARAMS_SET, needs=("srs param file not found",)),
    _sig("bench-input-missing", "params", 80,
         r"benchmark input (?:\(c1\.json\) )?missing|failed to read \S*c1\.json|--c1 required",
         "the benchmark's c1.json is missing or unreadable", setting=SETTING_BENCH_INPUT,
         needs=("benchmark input ", "failed to read ", "--c1 required")),
    # The daemon's only word when the container sees no GPU: its nvidia-smi probe fails (cuzk-core engine.rs:1180),
    # then supraseal's SRS load fails on ngpus() == 0 and shows only as `failed to load SRS` (groth16_srs.cuh:173-174).
    # Above that configuration reading: on a GPU rental a missing nvidia-smi is the host's runtime, not our sizing.
    _sig("gpu-not-visible", "machine", 76, r"nvidia-smi not available, defaulting to single GPU",
         "the daemon cannot run nvidia-smi: the host's NVIDIA runtime gives the container no GPU tools or devices",
         needs=("nvidia-smi not available, defaulting to single gpu",)),
    _sig("srs-load-failed", "configuration", 75, r"failed to load SRS from",
         "supraseal could not load the SRS into pinned host RAM (groth16_srs.cuh:268-271)",
         setting=SETTING_HOST_RAM, needs=("failed to load srs from",)),
    # --- 70: our software ----------------------------------------------------------------------------
    # Process deaths by signal: bash's job notice (`<pid> Segmentation fault (core dumped) <cmd>`, strsignal
    # text), Rust's ExitStatus (`signal: 11 (SIGSEGV)`), the worker's `exited (code 128+N)`.
    _sig("cpu-instruction-set-missing", "image", PRIORITY_SOFTWARE + 2,
         rf"\bIllegal instruction\b(?! was encountered)|\bSIGILL\b|illegal hardware instruction|{_exit_code(132)}",
         "a binary in the image used a CPU instruction this machine's CPU lacks (SIGILL): our build assumed an "
         "instruction set (-march/target-cpu=native, AVX-512, ADX); the CPU is not faulty, and any machine of "
         "that CPU generation fails the same way", setting=SETTING_CPU_BASELINE,
         needs=("illegal instruction", "sigill", "illegal hardware instruction", *_exit_code_needs(132))),
    _sig("segfault", "image", PRIORITY_SOFTWARE, rf"Segmentation fault|SIGSEGV|segfault at|{_exit_code(139)}",
         "a binary in the image crashed (SIGSEGV)",
         needs=("segmentation fault", "sigsegv", "segfault at", *_exit_code_needs(139))),
    _sig("bus-error", "image", PRIORITY_SOFTWARE, rf"\bBus error\b|\bSIGBUS\b|{_exit_code(135)}",
         "a binary in the image touched a mapping with nothing behind it (SIGBUS: a truncated memory-mapped "
         "file, a full /dev/shm or disk under a mapping): our software or its container set-up; a host memory "
         "fault is logged as a machine check / memory failure, which outranks this",
         needs=("bus error", "sigbus", *_exit_code_needs(135))),
    _sig("process-aborted", "image", PRIORITY_SOFTWARE - 2,
         rf"terminate called after throwing an instance of|\bAborted\s+\(core dumped\)|\bSIGABRT\b"
         rf"|has overflowed its stack|stack smashing detected|double free or corruption|free\(\): invalid pointer"
         rf"|malloc\(\): corrupted|{_exit_code(134)}",
         "a binary in the image aborted (SIGABRT; after `terminate called after throwing`, an uncaught C++ "
         "exception): our software; a CUDA code or std::bad_alloc in the same evidence names the cause",
         needs=("terminate called after throwing an instance of", "(core dumped)", "sigabrt",
                "has overflowed its stack", "stack smashing detected", "double free or corruption",
                "free(): invalid pointer", "malloc(): corrupted", *_exit_code_needs(134))),
    _sig("script-error", "image", 70,
         r"syntax error near unexpected token|syntax error: unexpected|unbound variable|bad substitution"
         r"|unexpected end of file|SyntaxError:|Traceback \(most recent call last\)|\bjq: error\b",
         "a shell, jq or Python script in the image failed",
         needs=("syntax error", "unbound variable", "bad substitution", "unexpected end of file", "syntaxerror:",
                "traceback (most recent call last)", "jq: error")),
    _sig("bench-usage-error", "image", 70, r"unknown proof type:|error: unexpected argument|error: invalid value",
         "our worker called cuzk-bench with arguments it does not accept",
         needs=("unknown proof type:", "error: unexpected argument", "error: invalid value")),
    _sig("daemon-config-error", "image", 70, r"failed to load config from|TOML parse error",
         "the daemon rejected the cuzk.toml our worker wrote",
         needs=("failed to load config from", "toml parse error")),
    _sig("permission-denied", "image", 70, r"Permission denied",
         "a script or file in the image is not executable/readable", needs=("permission denied",)),
    # --- 65: proofs that did not verify (verdict.py decides: intermittent -> machine, all -> image) -----
    _sig("proof-self-check", "image", 65, r"self-check FAILED|self-check failed|self-check error",
         "a proof failed cuzk's PoRep self-check (wrong c1.json for --sector-num/--miner-id if every proof "
         "fails; a flaky GPU if only some do)", needs=("self-check ",)),
    # Our downloader invocations (aria2 manual EXIT STATUS 28; curl man page EXIT CODES 2, 3).
    _sig("downloader-usage-error", "image", PRIORITY_SOFTWARE, rf"{_aria2((28,))}|{_curl((2,))}",
         "our fetch script called aria2c/curl with an option it does not accept (aria2c 28, curl 2)",
         explains="aria2c 28: bad or unrecognized option / curl 2: failed to initialize",
         needs=(*_ARIA2_NEEDS, *_CURL_NEEDS)),
    _sig("params-url-malformed", "configuration", PRIORITY_PARAMS, _curl((3,)),
         "the params URL is malformed (curl 3): params.base_url", setting=SETTING_MIRROR,
         explains="curl 3: URL using bad/illegal format or missing URL", needs=_CURL_NEEDS),
    # --- 60: the machine's network while fetching ----------------------------------------------------
    _sig("checksum-mismatch", "network", 60,
         rf"checksum mismatch|hash mismatch|blake2b\b.*(?:mismatch|does not match)|{_aria2(ARIA2_CHECKSUM)}",
         "a downloaded file is corrupt (a corrupt transfer; repeated params failures mark the machine bad)",
         needs=("checksum mismatch", "hash mismatch", "blake2b", *_ARIA2_NEEDS)),
    _sig("dns-failure", "network", 60,
         rf"Could not resolve host|Temporary failure in name resolution|Name or service not known|no such host"
         rf"|Name resolution for \S+ failed|{_aria2(ARIA2_DNS)}|{_curl(CURL_DNS)}",
         "the machine cannot resolve names", explains="aria2c 19 / curl 6: name resolution failed",
         needs=("could not resolve host", "temporary failure in name resolution", "name or service not known",
                "no such host", "name resolution for ", *_ARIA2_NEEDS, *_CURL_NEEDS)),
    _sig("connection-reset", "network", 60, r"Connection reset by peer|Network problem has occurred",
         "the machine's connection dropped", needs=("connection reset by peer", "network problem has occurred")),
    _sig("network-timeout", "network", 60,
         rf"Connection timed out|Operation timed out|Network is unreachable|{_curl(CURL_TIMEOUT)}",
         "the machine's network stalled", explains="curl 28: operation timed out",
         needs=("connection timed out", "operation timed out", "network is unreachable", *_CURL_NEEDS)),
    _sig("connection-failed", "network", 60,
         rf"{_curl(CURL_CONNECT)}|^(?!.*{_OUR_DAEMON}).*(?:connection refused|Couldn't connect to server)",
         "a remote server refused or could not be reached (a params mirror, not our daemon)",
         explains="curl 7: failed to connect", whole_line=True,
         needs=(*_CURL_NEEDS, "connection refused", "couldn't connect to server")),
    _sig("download-failed-network", "network", 60,
         rf"{_aria2(ARIA2_NETWORK)}|{_curl(CURL_NETWORK)}",
         "the download failed on the network (aria2c 2/5/6/8/22, curl 16/18/35/52/55/56/92)",
         explains="aria2c/curl network failure", needs=(*_ARIA2_NEEDS, *_CURL_NEEDS)),
    # The worker's own deadline: it says the fetch was slow, not whether the machine's network or the mirror was.
    # The fleet decides (the same mirror slow on K machines, the same machine slow twice: domain/correlation.py).
    _sig("params-too-slow", "unknown", 60, r"params fetch exceeded FLEET_PARAMS_TIMEOUT_S",
         "the params fetch did not finish before its deadline: the machine's network or the mirror was too slow",
         needs=("params fetch exceeded fleet_params_timeout_s",)),
    # --- generic: a wrapper's word that a download stopped; shown when nothing better was logged -------------
    _sig("download-failed-generic", "unknown", PRIORITY_GENERIC,
         rf"Download aborted|download failed|{_aria2(ARIA2_GENERIC)}",
         "a download stopped without saying why (aria2c's `Download aborted`, its exit 1 `unknown error` or 7 "
         "`unfinished downloads`): the cause, if any, is another line", strength=GENERIC,
         needs=("download aborted", "download failed", *_ARIA2_NEEDS)),
    # --- 55: the marketplace or host stopped the worker -----------------------------------------------
    _sig("process-sigkill", "configuration", PRIORITY_MARKETPLACE - 1, rf"\bSIGKILL\b|{_exit_code(137)}",
         "a process was SIGKILLed (exit 137) with no kernel line saying why: on a rental nearly always the OOM "
         "killer (a marketplace stop sends SIGTERM first, logged as worker-stopped, which outranks this)",
         setting=SETTING_HOST_RAM, needs=("sigkill", *_exit_code_needs(137))),
    _sig("worker-stopped", "marketplace", 55, r"received SIG(?:TERM|INT|HUP) during phase|worker stopped by SIG",
         "the container was stopped from outside (the marketplace or the host)",
         needs=("received sig", "worker stopped by sig")),
    # --- 52: an Xid that does not say who faulted (NONFATAL engine exceptions): never decisive ---------
    _sig("gpu-xid-ambiguous", "unknown", PRIORITY_PANIC + 2, _xid(XID_AMBIGUOUS),
         "an NVIDIA Xid the driver recovered by tearing the channel down (copy engine, PBDMA, idle timeout, "
         "preemptive cleanup): our kernel or the GPU; only correlation across machines tells",
         needs=_XID_NEEDS),
    # --- 50: any other panic in our binaries ---------------------------------------------------------
    _sig("rust-panic", "image", 50, r"thread '[^']*' panicked at|panicked with message",
         "a binary in the image panicked", needs=("panicked",)),
    # --- 30: cascade symptoms: our daemon is gone; anything more specific above is the cause -----------
    _sig("daemon-connection-refused", "image", 30,
         rf"^(?=.*(?:connection refused|tcp connect error|failed to connect to daemon))(?=.*{_OUR_DAEMON})",
         "the benchmark could not reach our own cuzk daemon (it did not start or crashed)", whole_line=True,
         needs=("connection refused", "tcp connect error", "failed to connect to daemon")),
    _sig("daemon-rpc-failed", "image", 30, r"(?:Prove|PreloadSRS|GetStatus|GetMetrics) RPC failed",
         "an RPC to our daemon failed (the daemon died or returned an error)", needs=("rpc failed",)),
), key=lambda s: -s.priority))


#: Decided from two lines of one evidence: cuzk's pinned pool warns `cudaHostAlloc failed size_gib=.. cuda_err=2`
#: (curio e0294b0f extern/cuzk/cuzk-core/src/pinned_pool.rs:57-68, 194-206) and falls back; when the attempt
#: then fails on `sppark::Error #-2` / cudaErrorMemoryAllocation, the allocation that failed is pinned HOST
#: memory (host RAM, the container's memlock limit), not GPU memory. Alone the warning is no failure (a healthy
#: run may log it), so it is not in SIGNATURES: `refine` turns a cuda-out-of-memory match into this one.
PINNED_HOST_MEMORY = _sig(
    "pinned-host-memory", "configuration", PRIORITY_CUDA_CODE + 1, r"\bcudaHostAlloc failed",
    "pinned host memory could not be allocated (cudaHostAlloc: page-locked host RAM), then CUDA reported out of "
    "memory: host RAM or the container's locked-memory limit, not the GPU's memory",
    setting=SETTING_PINNED_HOST, explains="cudaErrorMemoryAllocation (2) from cudaHostAlloc: pinned host memory",
    needs=("cudahostalloc failed",))
_REFINED_BY = {"cuda-out-of-memory": PINNED_HOST_MEMORY}


@dataclass(frozen=True)
class SignatureMatch:
    signature: Signature
    line: str
    index: int = 0

    @property
    def name(self) -> str:
        return self.signature.name

    @property
    def blame(self) -> str:
        return self.signature.blame

    @property
    def priority(self) -> int:
        return self.signature.priority

    @property
    def decisive(self) -> bool:
        """Whether this line may decide blame: a SPECIFIC signature (a GENERIC one is only the best line shown)."""
        return not self.signature.generic

    def text(self) -> str:
        """The line, with the meaning of a bare numeric code appended (`sppark::Error #-2 [= ...: out of memory]`,
        `aria2c failed ... (exit code 7) [= aria2c 7: unfinished downloads]`)."""
        meaning = code_meaning(self.line) or self.signature.explains
        if meaning and _BARE_CODE.search(self.line) and meaning.split(": ", 1)[-1].lower() not in self.line.lower():
            return f"{self.line} [= {meaning}]"
        return self.line


_BARE_CODE = re.compile(r"sppark::Error #-?\d+|\bexit code \d+|^curl: \(\d+\)|\berrorCode=\d+\s*$")
_SPPARK_CODE = re.compile(r"sppark::Error #-(\d+)")
_CUDA_ENUM = re.compile(r"\b(cudaError[A-Za-z]+)\b")
_CUDA_DRIVER = re.compile(r"\bCUDA_ERROR_[A-Z_]+\b")
_TOOL_CODE = re.compile(r"\b(aria2c|curl)\b.*?\bexit code (\d+)|^(curl): \((\d+)\)")


def code_meaning(line: str) -> str | None:
    """What a numeric error code in `line` means: a negated cudaError_t from sppark, an aria2c or curl exit code."""
    m = _SPPARK_CODE.search(line)
    if m and int(m.group(1)) in cuda_errors.CUDA_ERRORS:
        return cuda_errors.CUDA_ERRORS[int(m.group(1))].meaning()
    m = _CUDA_ENUM.search(line)
    if m and m.group(1) in cuda_errors.BY_NAME:
        return cuda_errors.BY_NAME[m.group(1)].meaning()
    m = _CUDA_DRIVER.search(line)
    if m and m.group(0) in cuda_errors.DRIVER_BY_NAME:
        code = cuda_errors.DRIVER_BY_NAME[m.group(0)]
        runtime = cuda_errors.CUDA_ERRORS.get(code)
        return f"{m.group(0)} ({code})" + (f" = {runtime.meaning()}" if runtime else "")
    m = _TOOL_CODE.search(line)
    if m:
        tool, code = (m.group(1), int(m.group(2))) if m.group(1) else (m.group(3), int(m.group(4)))
        table = ARIA2_MEANING if tool == "aria2c" else CURL_MEANING
        if code in table:
            return f"{tool} {code}: {table[code]}"
    return None


# --- reading a tail -------------------------------------------------------------------------------------

#: Terminal sequences (CSI colour, OSC ended by BEL or ST), raw as in a file or a fixture, or as the controller
#: stores them: escaped at ingest into visible text (`\x1b[31m`, domain/redact.py's escape_controls).
_ANSI = re.compile(r"(?:\x1b\[|\x9b)[0-9;?]*+[A-Za-z]|\x1b\][^\x07\x1b]*+(?:\x07|\x1b\\)"
                   r"|\\(?:x1b\[|x9b)[0-9;?]*+[A-Za-z]|\\x1b\][^\\]*+(?:\\x07|\\x1b\\)")
_RING_TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d) ?")
_TAG = re.compile(r"^(cuzk-daemon|cuzk-bench(?: status)?|tunnel): ?")
_TRACING_TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z\s+(?=(?:TRACE|DEBUG|INFO|WARN|ERROR)\b)")
_PANIC_HEAD = re.compile(r"thread '[^']*' panicked at \S+:\d+:\d+:\s*$")
_CAUSED_BY = re.compile(r"^\s*Caused by:\s*$")
_CAUSE = re.compile(r"^\s+(?:\d+: )?(\S.*)$")
_ARIA2_CAUSE = re.compile(r"^\s+-> \[")
_TERMINATE = "terminate called after throwing an instance of"
_WHAT = re.compile(r"^\s*what\(\):\s*(.*)$")
_NOISE = re.compile(
    r"^\[#[0-9a-f]+ .*\]$"                       # aria2c progress: [#26a862 38GiB/56GiB(67%) CN:16 DL:408MiB ETA:46s]
    r"|^\s*(?:CUZK_TIMING|CUZK_NTT_H):|^TIMELINE,"   # supraseal-c2 / cuzk-core timing on stderr
    r"|^(?:TRACE|DEBUG|INFO)\s+\S+: (?:FIN_TIMING|GPU_TIMING|pacer:)"
    r"|^\s*\[\d+/\d+\] (?:COMPLETED|FAILED|CANCELLED|TIMEOUT|UNKNOWN) "  # per-proof lines: counted, not causes
    r"|^note: run with `RUST_BACKTRACE=1`")
_TUNNEL = re.compile(r"^(?:fleet: )?tunnel: ")


@dataclass(frozen=True)
class LogicalLine:
    """One cleaned (and possibly joined) line: `text` as shown, `tag` the stream it came from."""

    text: str
    tag: str = ""
    noise: bool = False
    tunnel: bool = False


def clean_line(raw: str) -> tuple[str, str]:
    """(tag, body): ring timestamp, ANSI colour, CR and the daemon's own timestamp removed."""
    line = _ANSI.sub("", raw.replace("\r", "").replace("\\x0d", "")).rstrip("\n")
    line = _RING_TS.sub("", line, count=1)
    tag = ""
    m = _TAG.match(line)
    if m:
        tag, line = m.group(1), line[m.end():]
    line = _TRACING_TS.sub("", line, count=1)
    return tag, line


def read_tail(lines: Iterable[str]) -> list[LogicalLine]:
    """Clean and join a tail into logical lines (see the module docstring)."""
    return list(_read_tail(lines if isinstance(lines, tuple) else tuple(lines)))


@lru_cache(maxsize=256)
def _read_tail(lines: tuple[str, ...]) -> tuple[LogicalLine, ...]:
    # Remembered: the judge reads one attempt's tail several times (classify, error_line, the evidence).
    items = [clean_line(raw) for raw in lines]
    used: set[int] = set()
    out: list[LogicalLine] = []
    for i, (tag, body) in enumerate(items):
        if i in used:
            continue
        if _PANIC_HEAD.search(body):
            j = _next_in_stream(items, used, i + 1, tag, skip_blank=False)
            if j is not None and items[j][1].strip():
                body = f"{body.rstrip()} {items[j][1].strip()}"
                used.add(j)
        elif body.startswith("Error: "):
            j = _next_in_stream(items, used, i + 1, tag, skip_blank=True)
            if j is not None and _CAUSED_BY.match(items[j][1]):
                chain = [i for i in range(i + 1, j + 1) if items[i][0] == tag]  # blanks and `Caused by:`
                causes: list[str] = []
                for k in range(j + 1, len(items)):
                    if items[k][0] != tag:
                        continue  # another stream interleaved: keep it, keep reading ours
                    m = _CAUSE.match(items[k][1])
                    if not m:
                        break
                    chain.append(k)
                    if not causes or causes[-1] != m.group(1).strip():
                        causes.append(m.group(1).strip())
                used.update(chain)
                body = " | ".join([body, *causes])
        elif body.startswith(_TERMINATE):
            # libstdc++'s terminate handler: the exception's type, then `  what():  <message>` on the next line.
            j = _next_in_stream(items, used, i + 1, tag, skip_blank=True)
            if j is not None and (m := _WHAT.match(items[j][1])):
                body = f"{body.rstrip()} what(): {m.group(1).strip()}"
                used.add(j)
        elif body.lstrip().startswith("Exception: ["):
            k = i + 1
            while k < len(items) and items[k][0] == tag and _ARIA2_CAUSE.match(items[k][1]):
                body += " | " + items[k][1].strip()
                used.add(k)
                k += 1
        text = f"{tag}: {body.strip()}" if tag else body.strip()
        out.append(LogicalLine(text=text, tag=tag, noise=bool(_NOISE.search(body.strip())) or not body.strip(),
                               tunnel=tag == "tunnel" or bool(_TUNNEL.match(body))))
    return tuple(out)


def _next_in_stream(items: list[tuple[str, str]], used: set[int], start: int, tag: str, *,
                    skip_blank: bool) -> int | None:
    for j in range(start, min(len(items), start + 50)):
        if j in used or items[j][0] != tag:
            continue
        if skip_blank and not items[j][1].strip():
            continue
        return j
    return None


def logical_lines(lines: Iterable[str]) -> list[str]:
    """The cleaned, joined lines of a tail (noise included), as text."""
    return [line.text for line in read_tail(lines)]


def classify(lines: Iterable[str], table: Sequence[Signature] = SIGNATURES, *,
             include_tunnel: bool = False) -> SignatureMatch | None:
    """The highest-priority signature found anywhere in `lines` (earliest line on a tie, then the earlier
    signature of `table`, which is taken in priority order).

    Noise never matches; tunnel lines only with `include_tunnel` (when the tunnel is the failing phase)."""
    matcher = _SIGNATURES_MATCHER if table is SIGNATURES else _Matcher(table)
    first = _first_signature if table is SIGNATURES else matcher.first
    best: SignatureMatch | None = None
    read = _read_tail(lines if isinstance(lines, tuple) else tuple(lines))
    for i, ln in enumerate(read):
        if ln.noise or (ln.tunnel and not include_tunnel):
            continue
        k = first(ln.text, len(ln.tag) + 2 if ln.tag else 0)
        # A later line wins only with a strictly higher priority: on a tie the earlier line stays.
        if k is not None and (best is None or matcher.table[k].priority > best.signature.priority):
            best = SignatureMatch(matcher.table[k], ln.text, i)
    return refine(best, read, include_tunnel=include_tunnel)


def refine(match: SignatureMatch | None, read: Sequence[LogicalLine], *,
           include_tunnel: bool = False) -> SignatureMatch | None:
    """The match, or the two-line signature it is part of (`PINNED_HOST_MEMORY`): the earliest usable line of
    `read` the refining signature matches becomes the shown cause. One more pass, only on a failure's match."""
    refined = _REFINED_BY.get(match.signature.name) if match is not None else None
    if refined is None:
        return match
    for i, ln in enumerate(read):
        if not ln.noise and (include_tunnel or not ln.tunnel) and refined.pattern.search(ln.text):
            return SignatureMatch(refined, ln.text, i)
    return match


def strongest_signature(lines: Iterable[str], *, include_tunnel: bool = False) -> SignatureMatch | None:
    """The most decisive signature line of the whole evidence (log ring, failure tails, GPU probe, in any
    order the caller joins them): the highest `priority` anywhere, the earliest line on a tie. `index` counts
    logical lines of `lines` (multi-line reports joined). The same answer as `classify` over the default table."""
    return classify(lines, include_tunnel=include_tunnel)


def signature_named(name: str) -> Signature | None:
    """The table entry a recorded verdict's `signature` names (None for a name no longer in the table)."""
    return _BY_NAME.get(name)


#: Non-ASCII letters that `re` matches to an ASCII letter case-insensitively (İ ı ſ K): a line holding one can
#: match a signature without containing its `needs` once lower-cased, so it skips the prefilter.
FOLDS_TO_ASCII = "\u0130\u0131\u017f\u212a"
_FOLDING = re.compile(f"[{FOLDS_TO_ASCII}]")


_NEEDLE_KEY = 4


class _Matcher:
    """A table's signatures in priority order, with the prefilter: per line, only the signatures one of whose
    `needs` occurs in the lower-cased line are searched (the rest cannot match: see `Signature.needs`)."""

    def __init__(self, table: Sequence[Signature]) -> None:
        self.table: tuple[Signature, ...] = tuple(sorted(table, key=lambda s: -s.priority))
        self._always = tuple(k for k, sig in enumerate(self.table) if not sig.needs)
        by_needle: dict[str, list[int]] = {}
        for k, sig in enumerate(self.table):
            for needle in sig.needs:
                by_needle.setdefault(needle, []).append(k)
        # Needles grouped by their first few characters: a group is tested only when its key is in the line
        # (a needle is in the line only if its prefix is), which skips most needles on most lines.
        groups: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
        for needle, ks in by_needle.items():
            groups.setdefault(needle[:_NEEDLE_KEY], []).append((needle, tuple(ks)))
        self._groups = tuple((key, tuple(items)) for key, items in groups.items())
        self._steps = tuple((sig.pattern.search, not sig.whole_line) for sig in self.table)

    def first(self, text: str, body_at: int) -> int | None:
        """The index in `table` of the first signature matching the line `text` (whose tag, if any, ends at
        `body_at`: a signature that is not `whole_line` is also tried on the body alone)."""
        if text.isascii() or not _FOLDING.search(text):
            lower = text.lower()
            ks: Iterable[int] = sorted({k for key, items in self._groups if key in lower
                                        for needle, ks in items if needle in lower for k in ks}
                                       .union(self._always))
        else:
            ks = range(len(self.table))
        body = text[body_at:] if body_at else None
        for k in ks:
            search, on_body = self._steps[k]
            if search(text) or (body is not None and on_body and search(body)):
                return k
        return None


_SIGNATURES_MATCHER = _Matcher(SIGNATURES)
_BY_NAME = {sig.name: sig for sig in (*SIGNATURES, *_REFINED_BY.values())}
#: Log lines repeat across reports once timestamps are stripped (the same params, daemon and bench lines on
#: every machine): each distinct line is matched once. Pure: the answer depends on the line alone.
_first_signature = lru_cache(maxsize=1 << 14)(_SIGNATURES_MATCHER.first)


def clear_line_memo() -> None:
    """Forget the remembered tails and line matches (tests: a cold start gives the same answers)."""
    _first_signature.cache_clear()
    _read_tail.cache_clear()


_ERRORISH = re.compile(r"\b(?:error|errors|failed|failure|fatal|panicked|exception|denied|refused|killed|abort(?:ed)?"
                       r"|cannot|could not|unable|timed out|exceeded)\b", re.IGNORECASE)


def error_line(lines: Iterable[str], *, include_tunnel: bool = False) -> str | None:
    """Without a signature: the last line that reads like an error (never noise or a tunnel line), else the
    last meaningful line."""
    usable = [ln for ln in _read_tail(lines if isinstance(lines, tuple) else tuple(lines))
              if not ln.noise and (include_tunnel or not ln.tunnel)]
    for ln in reversed(usable):
        if _ERRORISH.search(ln.text) and not re.search(r"\b(?:INFO|DEBUG|TRACE)\b", ln.text[:40]):
            return ln.text
    return usable[-1].text if usable else None

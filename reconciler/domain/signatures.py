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
from typing import Any

from reconciler.domain import cuda_errors, xid
from reconciler.domain.aria2_codes import ARIA2, ARIA2_CODES
from reconciler.domain.codes import Code, numbers_of
from reconciler.domain.curl_codes import CURL, CURL_CODES
from reconciler.domain.errnos import ERRNO, ERRNO_CODES
from reconciler.domain.exit_statuses import BASH, BASH_CODES, SIGNAL, SIGNAL_EXIT_BASE, SIGNALS
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
    #: For a class of codes whose members differ in cause (ambiguous errnos, signals), the table (`decode`'s kind:
    #: "errno", "signal") whose code a verdict's signature names too (`os-error-ambiguous:EAGAIN`), so the breaker
    #: never correlates two different errnos as one failure.
    per_code: str = ""

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
         flags: int = re.IGNORECASE, strength: str = SPECIFIC, per_code: str = "") -> Signature:
    return Signature(name, blame, priority, re.compile(regex, flags), description, setting, explains, whole_line,
                     tuple(dict.fromkeys(needs)), strength, per_code)


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
SETTING_CONTAINER_LIMIT = ("the container's limits where the worker starts (worker-image/entrypoint.sh `ulimit -n`) "
                           "or its run options (docker --ulimit nofile/fsize/cpu)")
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


def _alt(*parts: str) -> str:
    """Regex alternatives, the empty ones left out (an empty alternative would match every line)."""
    return "|".join(p for p in parts if p)


class _Forms:
    """A regex fragment and the `needs` that every match of it contains."""

    def __init__(self, regex: str = "", needs: Iterable[str] = ()) -> None:
        self.regex = regex
        self.needs = tuple(needs)

    def __or__(self, other: _Forms) -> _Forms:
        return _Forms(_alt(self.regex, other.regex), (*self.needs, *other.needs))


def _tool_codes(signature: str) -> _Forms:
    """aria2c's and curl's codes the tables (aria2_codes.py, curl_codes.py) give to `signature`."""
    aria2 = numbers_of(ARIA2_CODES, signature)
    curl = numbers_of(CURL_CODES, signature)
    return (_Forms(_aria2(aria2), _ARIA2_NEEDS) if aria2 else _Forms()) | \
        (_Forms(_curl(curl), _CURL_NEEDS) if curl else _Forms())


#: glibc texts too routine in healthy logs to be a cause by themselves (`stty: 'standard input': Inappropriate
#: ioctl for device`, `kill: (42) - No such process`, a non-blocking connect's EINPROGRESS): only their numeric forms.
_ERRNO_NOT_BARE = frozenset({"ENOTTY", "ESRCH", "ECHILD", "EINPROGRESS", "EALREADY", "EEXIST"})
#: A glibc text shorter than this is matched only in its numeric forms (`Bad address`, `File exists`).
_BARE_TEXT_MIN = 14


def _errno_forms(signature: str) -> _Forms:
    """Every form of the errnos errnos.py gives to `signature`: Rust's `<text> (os error N)` and `Os { code: N,`,
    Python's `[Errno N]`, aria2c's `errNum=N` (src/AbstractDiskWriter.cc), the errno's name, and (for a decisive
    blame) glibc's text as bash, coreutils and Go print it."""
    codes = [c for c in ERRNO_CODES if c.signature == signature]
    if not codes:
        return _Forms()
    nums = "|".join(str(c.number) for c in codes)
    names = "|".join(c.name for c in codes)
    forms = _Forms(rf"\(os error (?:{nums})\)|\bOs \{{ code: (?:{nums}),|\[Errno (?:{nums})\]|\berrNum=(?:{nums})\b"
                   rf"|(?-i:\b(?:{names})\b)",
                   ("(os error ", "os { code: ", "[errno ", "errnum=", *(c.name.lower() for c in codes)))
    bare = [c.text for c in codes if c.blame != "unknown" and len(c.text) >= _BARE_TEXT_MIN
            and c.name not in _ERRNO_NOT_BARE]
    if bare:
        forms = forms | _Forms("|".join(_whole_text(t) for t in bare), (t.lower() for t in bare))
    return forms


def _whole_text(text: str) -> str:
    """`text` as a regex that does not match the start of a longer errno text (ENODEV's `No such device` is not
    ENXIO's `No such device or address`, EMFILE's `Too many open files` not ENFILE's `... in system`)."""
    longer = [c.text[len(text):] for c in ERRNO_CODES if c.text != text and c.text.lower().startswith(text.lower())]
    return re.escape(text) + (f"(?!{'|'.join(re.escape(rest) for rest in longer)})" if longer else "")


def _exit_statuses(statuses: Iterable[int]) -> _Forms:
    """A process's exit status as wrappers report it: `exited with code N`, `exited (code N)`, `exit code N`."""
    statuses = list(statuses)
    return _Forms("|".join(rf"\bexited (?:with |\()code {n}\b|\bexit code {n}\b" for n in statuses),
                  (f"code {n}" for n in statuses))


#: strsignal texts decisive enough to stand alone (the short ones and "Terminated" appear in ordinary lines).
_SIGNAL_BARE = frozenset({"SIGFPE", "SIGTRAP", "SIGSYS", "SIGUSR1", "SIGUSR2", "SIGVTALRM", "SIGPROF", "SIGXCPU",
                          "SIGXFSZ"})


def _signal_forms(signature: str) -> _Forms:
    """Every form of the signals exit_statuses.py gives to `signature`: the name (`SIGSEGV`), Rust's `signal: N`,
    `killed by signal N`, the exit status 128 + N, and bash's job notice with glibc's strsignal text
    (`line 225:   812 Floating point exception (core dumped) cuzk-daemon`)."""
    codes = [c for c in SIGNALS if c.signature == signature]
    if not codes:
        return _Forms()
    nums = "|".join(str(c.number) for c in codes)
    names = "|".join(c.name for c in codes)
    texts = "|".join(re.escape(c.text) for c in codes)
    forms = _Forms(rf"(?-i:\b(?:{names})\b)|\bsignal: (?:{nums})\b|\bkilled by signal (?:{nums})\b"
                   rf"|^(?:\S+: )?(?:line \d+: )?\s*\d+ (?:{texts})\b",
                   ("signal: ", "killed by signal ", *(c.name.lower() for c in codes),
                    *(c.text.lower() for c in codes)))
    bare = [c.text for c in codes if c.name in _SIGNAL_BARE]
    if bare:
        forms = forms | _Forms("|".join(re.escape(t) for t in bare), (t.lower() for t in bare))
    return forms | _exit_statuses(SIGNAL_EXIT_BASE + c.number for c in codes)


def _table_forms(signature: str) -> _Forms:
    """Every code the tables give to `signature`: aria2c, curl, errno, signal, bash's 126/127."""
    bash = [c.number for c in BASH_CODES if c.signature == signature]
    return _tool_codes(signature) | _errno_forms(signature) | _signal_forms(signature) | _exit_statuses(bash)


def _tsig(name: str, blame: str, priority: int, regex: str, description: str, *, needs: Iterable[str] = (),
          **kwargs: Any) -> Signature:
    """A signature whose regex and needs are completed with every form of the codes the tables give it."""
    forms = _Forms(regex, needs) | _table_forms(name)
    return _sig(name, blame, priority, forms.regex, description, needs=forms.needs, **kwargs)


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



# What our own daemon looks like from the bench or the worker (loopback or the daemon named).
_OUR_DAEMON = r"(?:127\.0\.0\.1|localhost|\[::1\]|:9820\b|unix://|cuzk|daemon)"
#: A line about reaching our daemon (its socket, `failed to connect to daemon at/via`): an errno there is
#: the daemon's symptom, not the network's or a missing file's. Loopback alone is not enough (a test mirror, a local
#: proxy run on 127.0.0.1 too), and the daemon's own lines (`cuzk-daemon: ...`) are causes, not symptoms.
_OUR_DAEMON_NAMED = r"(?:unix://|\bto daemon\b|\bdaemon (?:at|via)\b|cuzk\.sock\b)"


def _nsig(name: str, blame: str, priority: int, regex: str, description: str, *, needs: Iterable[str] = (),
          ours: str = _OUR_DAEMON_NAMED, **kwargs: Any) -> Signature:
    """A signature whose errnos are the daemon's symptom on a line about our own daemon (`_OUR_DAEMON_NAMED`: a
    network errno, a socket file missing): aria2c's and curl's codes for it, and its own text and errnos on any
    other line."""
    tools = _tool_codes(name)
    body = _Forms(regex, needs) | _errno_forms(name)
    return _sig(name, blame, priority, _alt(tools.regex, rf"^(?!.*{ours}).*(?:{body.regex})"),
                description, needs=(*tools.needs, *body.needs), whole_line=True, **kwargs)

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
    _tsig("host-memory-hardware-error", "machine", PRIORITY_HARDWARE,
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
    _tsig("command-not-found", "image", PRIORITY_LOADER, r"\S+: (?:command )?not found\s*$|: command not found\b",
         "a program our scripts call is not in the image", needs=("not found",)),
    # runc reports a missing interpreter or loader of the entrypoint as `exec <path>: no such file or directory`.
    _tsig("exec-format-error", "image", PRIORITY_LOADER,
         r"exec format error|cannot execute binary file|^exec \S+: no such file or directory",
         "a binary in the image was built for another platform or its interpreter/loader is missing",
         needs=("exec format error", "cannot execute binary file", ": no such file or directory")),
    # --- 90: memory kills and disk: the pool is sized wrong for the workload --------------------------
    _tsig("host-out-of-memory", "configuration", 90,
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
    _sig("memory-budget-blocks", "configuration", 90,
         r"acquire request exceeds total budget|memory budget cannot hold the SRS",
         "the daemon's memory budget is smaller than one request (the SRS): it would wait forever "
         "(curio cuzk-core memory.rs:188-192)",
         setting=SETTING_HOST_RAM, needs=("acquire request exceeds total budget", "memory budget cannot hold the srs")),
    _tsig("disk-full", "configuration", 90, "",
          "the instance disk filled up (params are ~53 GiB for 32GiB sectors, PCE data ~25 GiB more)",
          setting=SETTING_DISK),
    _tsig("container-limit", "configuration", PRIORITY_MEMORY_KILL - 2, "",
          "a per-process limit of the container was reached (open files, file size, CPU time)",
          setting=SETTING_CONTAINER_LIMIT),
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
    _tsig("tls-unknown-authority", "image", PRIORITY_PARAMS + 1,
         r"certificate signed by unknown authority|unable to get local issuer certificate|failed to load system roots"
         r"|error setting certificate (?:verify locations|file)|\bUnknownIssuer\b|issuer is not known"
         r"|not signed by known authorities|certificate issuer is unknown|self[- ]signed certificate",
         "the image cannot verify the mirror's TLS certificate: no CA bundle (ca-certificates) in our image",
         setting=SETTING_CA_BUNDLE,
         needs=("certificate signed by unknown authority", "unable to get local issuer certificate",
                "failed to load system roots", "error setting certificate ", "unknownissuer", "issuer is not known",
                "not signed by known authorities", "certificate issuer is unknown", "signed certificate")),
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
    _tsig("params-mirror-denied", "configuration", PRIORITY_PARAMS,
          r"returned error: 40[13]\b|\bstatus=40[13]\b|ERROR 40[13]: |HTTP Error 40[13]\b",
          "the params mirror refused us (HTTP 401/403): our configuration (params.base_url, its credentials)",
          setting=SETTING_MIRROR, needs=("returned error: 40", "status=40", "error 40", "http error 40")),
    _tsig("params-mirror-unavailable", "params", PRIORITY_PARAMS,
          r"returned error: (?:429|50[234])\b|\bstatus=(?:429|50[234])\b|ERROR 429: |ERROR 50[234]: "
          r"|HTTP Error (?:429|50[234])\b",
          "the params mirror is overloaded, rate-limiting or down (HTTP 429/502/503/504): the mirror, not the machine",
          setting=SETTING_MIRROR, needs=("returned error: ", "status=", "error 429: ", "error 50", "http error ")),
    _tsig("params-not-found", "params", PRIORITY_PARAMS,
          r"returned error: 404\b|\bstatus=404\b|ERROR 404: |HTTP Error 404\b",
          "the params mirror does not serve a file (HTTP 404): the mirror or params.base_url",
          setting=SETTING_MIRROR, needs=("returned error: 404", "status=404", "error 404", "http error 404")),
    _tsig("params-mirror-unsupported", "params", PRIORITY_PARAMS, "",
          "the params mirror cannot serve byte ranges: our fetch resumes downloads (aria2c --continue, curl -C -)",
          setting=SETTING_MIRROR),
    # The worker's own params failures (exit_statuses.WORKER_EXITS): no source at all, a bad manifest.
    _sig("params-source-missing", "configuration", PRIORITY_PARAMS,
         r"no params source: FLEET_PARAMS_BASE_URL is not set",
         "no params source: params.base_url is not set and the image has no curio to fetch them with",
         setting=SETTING_MIRROR, needs=("no params source: fleet_params_base_url is not set",)),
    _sig("params-manifest-bad", "params", PRIORITY_PARAMS,
         r"\bbad line \S+ in \S*manifest\.txt\b|manifest\.txt lists no files",
         "the params mirror serves a malformed or empty manifest.txt", setting=SETTING_MIRROR,
         needs=("bad line ", "manifest.txt lists no files")),
    # Below the statuses: a code that says only that the mirror answered wrongly; a status beside it decides.
    _tsig("params-mirror-http-error", "params", PRIORITY_PARAMS - 2, "",
          "the params mirror answered an HTTP error status (curl -f exit 22; the status, when printed, decides)",
          setting=SETTING_MIRROR),
    _tsig("params-mirror-bad-response", "params", PRIORITY_PARAMS - 2, "",
          "the params mirror answered something the downloader could not use (a bad or unexpected HTTP answer, a "
          "redirect loop, an FTP/TFTP error)", setting=SETTING_MIRROR),
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
    _tsig("host-os-error", "machine", 75, "",
          "the host's kernel reported its storage, a device or its power failing (errnos.py: EIO, EUCLEAN, "
          "ESTALE, ENODEV, ...; SIGPWR): only the machine's owner can fix it"),
    _sig("srs-load-failed", "configuration", 75, r"failed to load SRS from",
         "supraseal could not load the SRS into pinned host RAM (groth16_srs.cuh:268-271)",
         setting=SETTING_HOST_RAM, needs=("failed to load srs from",)),
    # --- 70: our software ----------------------------------------------------------------------------
    # Process deaths by signal: bash's job notice (`<pid> Segmentation fault (core dumped) <cmd>`, strsignal
    # text), Rust's ExitStatus (`signal: 11 (SIGSEGV)`), the worker's `exited (code 128+N)`.
    _tsig("cpu-instruction-set-missing", "image", PRIORITY_SOFTWARE + 2,
          r"\bIllegal instruction\b(?! was encountered)|illegal hardware instruction",
          "a binary in the image used a CPU instruction this machine's CPU lacks (SIGILL): our build assumed an "
          "instruction set (-march/target-cpu=native, AVX-512, ADX); the CPU is not faulty, and any machine of "
          "that CPU generation fails the same way", setting=SETTING_CPU_BASELINE,
          needs=("illegal instruction", "illegal hardware instruction")),
    _tsig("segfault", "image", PRIORITY_SOFTWARE, r"Segmentation fault|segfault at",
          "a binary in the image crashed (SIGSEGV)", needs=("segmentation fault", "segfault at")),
    _tsig("bus-error", "image", PRIORITY_SOFTWARE, r"\bBus error\b",
          "a binary in the image touched a mapping with nothing behind it (SIGBUS: a truncated memory-mapped "
          "file, a full /dev/shm or disk under a mapping): our software or its container set-up; a host memory "
          "fault is logged as a machine check / memory failure, which outranks this", needs=("bus error",)),
    _tsig("process-aborted", "image", PRIORITY_SOFTWARE - 2,
          r"terminate called after throwing an instance of|\bAborted\s+\(core dumped\)"
          r"|has overflowed its stack|stack smashing detected|double free or corruption|free\(\): invalid pointer"
          r"|malloc\(\): corrupted",
          "a binary in the image aborted (SIGABRT; after `terminate called after throwing`, an uncaught C++ "
          "exception): our software; a CUDA code or std::bad_alloc in the same evidence names the cause",
          needs=("terminate called after throwing an instance of", "(core dumped)",
                 "has overflowed its stack", "stack smashing detected", "double free or corruption",
                 "free(): invalid pointer", "malloc(): corrupted")),
    # Any other signal our binary raised itself (SIGFPE, SIGTRAP, SIGSYS, an unhandled SIGUSR1/SIGALRM ...).
    _tsig("fatal-signal", "image", PRIORITY_SOFTWARE - 2, "",
          "a binary in the image died of a signal its own code raised or left unhandled (exit_statuses.SIGNALS)"),
    _sig("script-error", "image", 70,
         r"syntax error near unexpected token|syntax error: unexpected|unbound variable|bad substitution"
         r"|unexpected end of file|SyntaxError:|\bjq: error\b",
         "a shell, jq or Python script in the image failed",
         needs=("syntax error", "unbound variable", "bad substitution", "unexpected end of file", "syntaxerror:",
                "jq: error")),
    _sig("bench-usage-error", "image", 70, r"unknown proof type:|error: unexpected argument|error: invalid value",
         "our worker called cuzk-bench with arguments it does not accept",
         needs=("unknown proof type:", "error: unexpected argument", "error: invalid value")),
    _sig("daemon-config-error", "image", 70, r"failed to load config from|TOML parse error",
         "the daemon rejected the cuzk.toml our worker wrote",
         needs=("failed to load config from", "toml parse error")),
    _tsig("permission-denied", "image", 70, r"Permission denied",
          "a script or file in the image is not executable/readable, or a call its container does not allow",
          needs=("permission denied",)),
    # The worker's own failures (exit_statuses.WORKER_EXITS): a bad environment, a tool's output missing.
    _sig("worker-bad-environment", "image", 70,
         r"\bmissing required environment: |\b[A-Z][A-Z0-9_/]+ must be (?:a positive (?:number of seconds|integer)"
         r"|integers|serve or exit)\b|cannot size cuzk-daemon's memory budget",
         "the worker's environment, written by our provisioner from the spec, is missing or bad: ours to fix",
         needs=("missing required environment: ", " must be ", "cannot size cuzk-daemon's memory budget")),
    _sig("worker-tool-output-missing", "image", 70, r"\bexited 0 but printed no\b",
         "cuzk-bench exited 0 without the line the worker reads (a throughput line, a [1/1] line): our build or "
         "our scripts' reading of it", needs=("exited 0 but printed no",)),
    # --- 65: proofs that did not verify (verdict.py decides: intermittent -> machine, all -> image) -----
    _sig("proof-self-check", "image", 65, r"self-check FAILED|self-check failed|self-check error",
         "a proof failed cuzk's PoRep self-check (wrong c1.json for --sector-num/--miner-id if every proof "
         "fails; a flaky GPU if only some do)", needs=("self-check ",)),
    # Our downloader invocations and the features of aria2c/curl our fetch never uses (aria2_codes, curl_codes).
    _tsig("downloader-usage-error", "image", PRIORITY_SOFTWARE, "",
          "our fetch script called aria2c/curl in a way it refuses (a bad option, a feature the worker never uses)"),
    _tsig("params-url-malformed", "configuration", PRIORITY_PARAMS, "",
          "the params URL is malformed or names a scheme/path this downloader cannot use: params.base_url",
          setting=SETTING_MIRROR),
    # The params directory could not be written or read; the errno in aria2c's cause decides (disk, EACCES, EIO).
    _tsig("params-dir-error", "unknown", PRIORITY_NETWORK + 2, "",
          "the downloader could not open, create, write or read a file of the params directory; the errno in its "
          "cause line says why (a full disk, a permission, an I/O error)"),
    # --- 60: the machine's network while fetching ----------------------------------------------------
    _tsig("checksum-mismatch", "network", 60, r"checksum mismatch|hash mismatch|blake2b\b.*(?:mismatch|does not match)",
          "a downloaded file is corrupt (a corrupt transfer; repeated params failures mark the machine bad)",
          needs=("checksum mismatch", "hash mismatch", "blake2b")),
    _tsig("dns-failure", "network", 60,
          r"Could not resolve host|Temporary failure in name resolution|Name or service not known|no such host"
          r"|Name resolution for \S+ failed|Failed to resolve the hostname",
          "the machine cannot resolve names",
          needs=("could not resolve host", "temporary failure in name resolution", "name or service not known",
                 "no such host", "name resolution for ", "failed to resolve the hostname")),
    # The network errnos name the network only when the line is not about our own daemon (then they are a symptom
    # of the daemon: daemon-connection-refused).
    _nsig("connection-reset", "network", 60, r"Network problem has occurred",
          "the machine's connection dropped", needs=("network problem has occurred",)),
    _nsig("network-timeout", "network", 60, r"Operation timed out|\bi/o timeout\b|TLS handshake timeout",
          "the machine's network stalled (Go's net package: `i/o timeout`, `TLS handshake timeout`)",
          needs=("operation timed out", "i/o timeout", "tls handshake timeout")),
    _nsig("network-unreachable", "network", 60, "",
          "the machine has no working route or address to the server (network unreachable, no route to host)"),
    # A refusal on loopback is our daemon's (as it always was): a params mirror is never on the rented machine.
    _nsig("connection-failed", "network", 60, r"Couldn't connect to server",
          "a remote server refused or could not be reached (a params mirror, not our daemon)",
          needs=("couldn't connect to server",), ours=_OUR_DAEMON),
    _tsig("download-failed-network", "network", 60, "",
          "the download failed on the network (aria2c_codes / curl_codes: a dropped or broken transfer)"),
    # Slow: the machine's network or the mirror; the fleet decides (domain/correlation.py): the worker's own
    # deadline and aria2c's --lowest-speed-limit (5).
    _tsig("params-too-slow", "unknown", 60, r"params fetch exceeded FLEET_PARAMS_TIMEOUT_S",
          "the params fetch did not finish before its deadline: the machine's network or the mirror was too slow",
          needs=("params fetch exceeded fleet_params_timeout_s",)),
    # --- 55: the marketplace or host stopped the worker -----------------------------------------------
    _tsig("process-sigkill", "configuration", PRIORITY_MARKETPLACE - 1, "",
          "a process was SIGKILLed (exit 137) with no kernel line saying why: on a rental nearly always the OOM "
          "killer (a marketplace stop sends SIGTERM first, logged as worker-stopped, which outranks this)",
          setting=SETTING_HOST_RAM),
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
    # A Python exception a script of ours raised: its own line (`KeyError: 'x'`), below every errno, HTTP status
    # or tool code the same exception carries (`OSError: [Errno 5] ...` is the host's disk).
    _sig("python-exception", "image", 44, r"^(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception): ",
         "a Python script in the image raised an exception no more specific line explains",
         needs=("error", "exception"), flags=0),
    # A call of our software the kernel refused for its arguments or our own state (errnos.py: EINVAL, EBADF,
    # ENOENT, EADDRINUSE, ...): below every line that says more.
    _nsig("software-os-error", "image", 45, "",
          "the kernel refused a call of our software (errnos.py: a missing file it expected, a bad argument or "
          "descriptor, an address in use, an unsupported operation)"),
    # --- 32-40: specific lines that name nobody: recognised and shown; the other lines, or the fleet, decide ---
    _tsig("tls-verify-failed", "unknown", 40, "",
          "the mirror's TLS certificate did not verify (curl 60); its cause, when printed, decides"),
    _sig("warmup-proof-failed", "unknown", 38, r"\bthe warm-up proof came back\b",
         "the warm-up proof did not complete (exit 75): the daemon's reason for it decides",
         needs=("the warm-up proof came back",)),
    _sig("worker-deadline", "unknown", 37, r"\bdid not (?:finish|answer cuzk-bench status at \S+) within FLEET_\w+_S=",
         "one of the worker's deadlines passed (daemon readiness, warm-up, benchmark): slow or hung, not who",
         needs=("did not finish", "did not answer cuzk-bench status at ")),
    # Above a generic panic: a panic that carries such an errno (`OS can't spawn worker thread: Resource temporarily
    # unavailable (os error 11)`) is how Rust reports the errno, not a bug of its own.
    _tsig("os-error-ambiguous", "unknown", PRIORITY_PANIC + 1, "",
          "an errno more than one owner raises (errnos.py: EAGAIN, EBUSY, EPIPE, EROFS, ...)", per_code="errno"),
    _tsig("signal-ambiguous", "unknown", 34, "",
          "a signal that says only that something around the process went first (SIGPIPE, job control)",
          per_code="signal"),
    # --- 30: cascade symptoms: our daemon is gone; anything more specific above is the cause -----------
    _sig("daemon-connection-refused", "image", 30,
         rf"^(?=.*(?:connection refused|connection reset|broken pipe|tcp connect error|failed to connect to daemon"
         rf"|\(os error (?:2|32|104|111)\)))(?=.*{_OUR_DAEMON})",
         "the benchmark could not reach, or lost, our own cuzk daemon (it did not start or crashed)",
         whole_line=True,
         needs=("connection refused", "connection reset", "broken pipe", "tcp connect error",
                "failed to connect to daemon", "(os error ")),
    _sig("daemon-rpc-failed", "image", 30, r"(?:Prove|PreloadSRS|GetStatus|GetMetrics) RPC failed",
         "an RPC to our daemon failed (the daemon died or returned an error)", needs=("rpc failed",)),
    # --- generic: a wrapper's word that something stopped; shown when nothing better was logged -----------
    _tsig("download-failed-generic", "unknown", PRIORITY_GENERIC, r"Download aborted|download failed",
          "a download stopped without saying why (aria2c's `Download aborted`, its exit 1 `unknown error` or 7 "
          "`unfinished downloads`): the cause, if any, is another line", strength=GENERIC,
          needs=("download aborted", "download failed")),
    _sig("python-traceback", "unknown", PRIORITY_GENERIC, r"^Traceback \(most recent call last\):",
         "a Python program raised an exception; its last line says which (a traceback cut short says nothing)",
         strength=GENERIC, needs=("traceback (most recent call last):",)),
    _tsig("signal-stopped", "unknown", PRIORITY_GENERIC, "",
          "a process was stopped by SIGTERM/SIGINT/SIGHUP/SIGQUIT (exit 143/130/129/131): who sent it is another "
          "line (the worker's `received SIGTERM during phase` is the marketplace's stop)", strength=GENERIC),
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

    @property
    def key(self) -> str:
        """The signature a verdict records: the name, and for a `per_code` class the code decoded from the line
        (`os-error-ambiguous:EAGAIN`), so different causes of one class never correlate as one failure."""
        if self.signature.per_code and (found := decode(self.line, (self.signature.per_code,))) is not None:
            return f"{self.signature.name}:{found[1].name}"
        return self.signature.name

    def text(self) -> str:
        """The line, with the meaning of a bare numeric code appended (`sppark::Error #-2 [= ...: out of memory]`,
        `aria2c failed ... (exit code 7) [= aria2c 7 IN_PROGRESS: ...]`, `exited with code 139 [= SIGSEGV ...]`)."""
        meaning = code_meaning(self.line) or self.signature.explains
        if meaning and _BARE_CODE.search(self.line) and meaning.split(": ", 1)[-1].lower() not in self.line.lower():
            return f"{self.line} [= {meaning}]"
        return self.line


_BARE_CODE = re.compile(r"sppark::Error #-?\d+|\bexit(?:ed with)? code \d+|\bexited \(code \d+\)|^curl: \(\d+\)"
                        r"|\berrorCode=\d+\s*$|\bsignal: \d+\s*$|\bkilled by signal \d+")
_SPPARK_CODE = re.compile(r"sppark::Error #-(\d+)")
_CUDA_ENUM = re.compile(r"\b(cudaError[A-Za-z]+)\b")
_CUDA_DRIVER = re.compile(r"\bCUDA_ERROR_[A-Z_]+\b")
_ARIA2_CODE = re.compile(r"\berrorCode=(\d+)|\baria2c\b.*?\bexit code (\d+)")
_CURL_CODE = re.compile(r"^curl: \((\d+)\)|\bcurl exit code (\d+)|\bcurl\b.*?\bexit code (\d+)")
_ERRNO_CODE = re.compile(r"\(os error (\d+)\)|\bOs \{ code: (\d+),|\[Errno (\d+)\]|\berrNum=(\d+)"
                         r"|\b(E[A-Z0-9]{2,14})\b")
_SIGNAL_CODE = re.compile(r"\b(SIG[A-Z0-9]{2,7})\b|\bsignal: (\d+)\b|\bkilled by signal (\d+)")
_EXIT_STATUS = re.compile(r"\bexited (?:with |\()code (\d+)\b|\bexit code (\d+)\b")
_ERRNO_BY_NAME = {c.name: c for c in ERRNO_CODES}
_SIGNAL_BY_NAME = {c.name: c for c in SIGNALS}


def _number(m: re.Match[str]) -> int:
    return int(next(g for g in m.groups() if g is not None))


_KINDS = ("aria2c", "curl", "errno", "signal", "bash")


def decode(line: str, kinds: Sequence[str] = _KINDS) -> tuple[str, Code] | None:
    """The first tool code `line` carries, from the whole tables: aria2c's, curl's, an errno in any of its forms, a
    signal (by name, Rust's `signal: N`, an exit status 128 + N), bash's 126/127; as (`aria2c`/`curl`/`errno`/
    `signal`/`bash`, the table entry). `kinds`: only these tables."""
    if "aria2c" in kinds and (m := _ARIA2_CODE.search(line)) and _number(m) in ARIA2:
        return "aria2c", ARIA2[_number(m)]
    if "curl" in kinds and (m := _CURL_CODE.search(line)) and _number(m) in CURL:
        return "curl", CURL[_number(m)]
    for m in _ERRNO_CODE.finditer(line) if "errno" in kinds else ():
        code = _ERRNO_BY_NAME.get(m.group(5)) if m.group(5) else ERRNO.get(_number(m))
        if code is not None:
            return "errno", code
    for m in _SIGNAL_CODE.finditer(line) if "signal" in kinds else ():
        code = _SIGNAL_BY_NAME.get(m.group(1)) if m.group(1) else SIGNAL.get(_number(m))
        if code is not None:
            return "signal", code
    if ("signal" in kinds or "bash" in kinds) and (m := _EXIT_STATUS.search(line)) is not None:
        status = _number(m)
        if status in BASH and "bash" in kinds:
            return "bash", BASH[status]
        if "signal" in kinds and status > SIGNAL_EXIT_BASE and (status - SIGNAL_EXIT_BASE) in SIGNAL:
            return "signal", SIGNAL[status - SIGNAL_EXIT_BASE]
    return None


def code_meaning(line: str) -> str | None:
    """What an error code in `line` means: a negated cudaError_t from sppark, a CUDA enum or driver name, or a code
    of the whole tables (`decode`): aria2c's, curl's, an errno, a signal, bash's 126/127."""
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
    found = decode(line)
    if found is None:
        return None
    tool, entry = found
    if tool == "signal":
        return f"{entry.name} ({SIGNAL_EXIT_BASE} + {entry.number}): {entry.text}"
    if tool == "errno":
        return f"{entry.name} ({entry.number}): {entry.text}"
    return f"{tool} {entry.number} {entry.name}: {entry.text}"


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

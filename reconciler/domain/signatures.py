"""Failure signatures: which line of a worker's log tail says who broke the benchmark.

Used by `verdict.py` to assign blame to a failed instance (machine / image / network / unknown) and by
`breaker.py`, which correlates failures by signature name across machines. Pure data and one pure function.

Precedence is the table order, and the first signature that matches ANY line wins:
1. Hardware/driver signatures come first. A GPU fault cascades into software symptoms (the daemon dies,
   the bench then prints "connection refused", a script prints a traceback), so when both kinds appear the
   hardware line is the cause. If our image itself provokes CUDA errors everywhere, the circuit breaker
   (same digest + same signature on K machines) catches it and stops marking machines bad.
   Exception: "CUDA driver version is insufficient" is listed before the generic CUDA error: the image was
   built for a newer driver than the spec's `min_cuda` lets in, which is our fault, not the host's.
2. Network signatures next: a failed or corrupt download cascades into missing files and tracebacks.
   A checksum mismatch counts as network: aria2 resumes (`--continue`) partial files, and a corrupt
   transfer is the common cause; a bad disk that corrupts every fetch still gets the machine excluded by
   the params-failed policy (bad on the second params failure, see verdict.py).
3. Software signatures (our image: scripts, binaries, the local cuzk daemon).
4. Ambiguous signatures (disk full, host OOM): recognised so the breaker can correlate them, but
   blamed "unknown", which never marks a machine bad: our spec (disk_gb, concurrency) may be the cause.

To extend: add a Signature to SIGNATURES at the right precedence and a realistic log line to
tests/unit/test_signatures.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

SIGNATURE_BLAMES = ("machine", "image", "network", "unknown")


@dataclass(frozen=True)
class Signature:
    name: str
    blame: str
    pattern: re.Pattern[str]
    description: str

    def __post_init__(self) -> None:
        if self.blame not in SIGNATURE_BLAMES:
            raise ValueError(f"signature {self.name!r}: blame {self.blame!r} not in {SIGNATURE_BLAMES}")


def _sig(name: str, blame: str, regex: str, description: str) -> Signature:
    return Signature(name, blame, re.compile(regex, re.IGNORECASE), description)


#: "Xid 79", "NVRM: Xid (PCI:0000:01:00): 79, pid=..." -> the number after it is the fault code.
_XID = r"\bXid(?: \(PCI:[0-9a-f:.]+\))?:?\s+"
_LOOPBACK = r"(?:127\.0\.0\.1|localhost|\[::1\]|:9820\b|cuzk|daemon)"

SIGNATURES: tuple[Signature, ...] = (
    # --- 1. machine: GPU hardware and host driver -----------------------------------------------------
    _sig("gpu-fell-off-bus", "machine", rf"fallen off the bus|{_XID}79\b",
         "the GPU disappeared from PCIe (Xid 79): hardware or power"),
    _sig("gpu-ecc", "machine",
         rf"uncorrectable ECC|ECC error|ECC_UNCORRECTABLE|cudaErrorECCUncorrectable|{_XID}(?:48|63|64|94|95)\b",
         "uncorrectable GPU memory error"),
    _sig("gpu-xid", "machine", rf"{_XID}\d+",
         "the NVIDIA kernel driver logged an Xid fault"),
    _sig("gpu-oom", "machine",
         r"CUDA out of memory|CUDA error: out of memory|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY"
         r"|out of memory \(CUDA\)|failed to allocate .* on (?:the )?(?:GPU|device)",
         "GPU memory exhausted: another tenant on the GPU or less VRAM than the model has"),
    _sig("cuda-runtime-too-new", "image",
         r"CUDA driver version is insufficient for CUDA runtime version|cudaErrorInsufficientDriver"
         r"|CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
         "our image needs a newer driver than the spec's min_cuda admits (fix the image or min_cuda)"),
    _sig("no-cuda-device", "machine",
         r"no CUDA-capable device is detected|CUDA_ERROR_NO_DEVICE|cudaErrorNoDevice|No devices were found",
         "the container sees no GPU"),
    _sig("nvidia-driver-unreachable", "machine",
         r"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"
         r"|Failed to initialize NVML: (?:Unknown Error|GPU access blocked|Driver Not Loaded)",
         "the host's NVIDIA driver is not loaded or not reachable from the container"),
    _sig("nvidia-driver-mismatch", "machine", r"Driver/library version mismatch",
         "the host's kernel driver and user-space NVIDIA libraries differ (host upgraded without reboot)"),
    _sig("nvidia-libs-missing", "machine",
         r"lib(?:nvidia-ml|cuda)\.so(?:\.\d+)*: cannot open shared object file|/dev/nvidia\w*: No such file",
         "the host's container runtime did not inject the NVIDIA driver libraries or devices"),
    _sig("cuda-error", "machine",
         r"CUDA error\b|CUDA_ERROR_\w+|\bcudaError\w+|an illegal memory access was encountered",
         "a CUDA call failed on this GPU"),
    # --- 2. network: fetching params ------------------------------------------------------------------
    _sig("checksum-mismatch", "network",
         r"checksum mismatch|hash mismatch|blake2b\b.*(?:mismatch|does not match|invalid)|Checksum error",
         "a downloaded file is corrupt (counted as network; repeated params failures mark the machine bad)"),
    _sig("download-error", "network", r"\berrorCode=\d+|download aborted|Download (?:failed|error)",
         "aria2c or the params fetcher gave up on a download"),
    _sig("dns-failure", "network",
         r"Could not resolve host|Temporary failure in name resolution|Name or service not known"
         r"|no such host",
         "the machine cannot resolve names"),
    _sig("connection-timeout", "network",
         r"Connection timed out|Operation timed out|connect(?:ion)? timeout|Network is unreachable"
         r"|Connection reset by peer",
         "the machine's network dropped or stalled a connection"),
    _sig("remote-connection-refused", "network", rf"^(?!.*{_LOOPBACK}).*connection refused",
         "a remote server refused the connection (a params mirror, not our daemon)"),
    # --- 3. image: our scripts, binaries and the local daemon ------------------------------------------
    _sig("daemon-connection-refused", "image", rf"(?=.*connection refused)(?=.*{_LOOPBACK})",
         "the benchmark could not reach our own cuzk daemon (it did not start or crashed at startup)"),
    _sig("command-not-found", "image", r"\S+: (?:command )?not found\s*$|: command not found\b",
         "a program our scripts call is not in the image"),
    _sig("exec-format-error", "image", r"exec format error|cannot execute binary file",
         "a binary in the image was built for another platform"),
    _sig("permission-denied", "image", r"Permission denied",
         "a script or file in the image is not executable/readable"),
    _sig("script-syntax-error", "image",
         r"syntax error near unexpected token|syntax error: unexpected|unbound variable|bad substitution"
         r"|unexpected end of file|SyntaxError:",
         "a shell or Python script in the image does not parse or uses an unset variable"),
    _sig("jq-error", "image", r"\bjq: error\b",
         "our jq filter failed on the bench output or config"),
    _sig("python-traceback", "image", r"Traceback \(most recent call last\)",
         "a Python script in the image raised"),
    _sig("rust-panic", "image", r"thread '[^']*' panicked at",
         "a binary in the image panicked"),
    _sig("missing-file", "image", r"No such file or directory",
         "a file our scripts expect is missing from the image or was never produced"),
    # --- 4. ambiguous: recognised, blamed unknown --------------------------------------------------------
    _sig("disk-full", "unknown", r"No space left on device|Disk quota exceeded",
         "the instance disk filled up (the spec's disk_gb, or the host)"),
    _sig("host-oom", "unknown", r"Out of memory: Killed process|oom-kill|\bKilled\s+\S*cuzk|Cannot allocate memory",
         "host RAM exhausted (the host, or the spec's concurrency)"),
)


@dataclass(frozen=True)
class SignatureMatch:
    signature: Signature
    line: str

    @property
    def name(self) -> str:
        return self.signature.name

    @property
    def blame(self) -> str:
        return self.signature.blame


_CHAIN_CONTINUATION = re.compile(r"^\s*Caused by:\s*$|^\s+\d+: ")


def logical_lines(lines: Iterable[str]) -> list[str]:
    """Join Rust error chains into their head line.

    cuzk-bench reports errors anyhow-style over several lines (`Error: failed to connect to daemon at
    http://127.0.0.1:9820`, blank, `Caused by:`, `    1: tcp connect error: Connection refused`). Judged
    line by line, the last line alone looks like a remote server refusing us; joined, it is our own daemon.
    """
    out: list[str] = []
    last_text = -1  # index in `out` of the last non-blank line
    for raw in lines:
        line = raw.rstrip("\r\n")
        if last_text >= 0 and _CHAIN_CONTINUATION.match(line):
            out[last_text] += " | " + line.strip()
            del out[last_text + 1:]  # blank lines inside the chain
            continue
        out.append(line)
        if line.strip():
            last_text = len(out) - 1
    return out


def classify(lines: Iterable[str], table: Sequence[Signature] = SIGNATURES) -> SignatureMatch | None:
    """The highest-precedence signature found in `lines`, with the first (logical) line it matched."""
    lines = logical_lines(lines)
    for sig in table:
        for line in lines:
            if sig.pattern.search(line):
                return SignatureMatch(sig, line.strip())
    return None

"""Failure signatures: every table entry is matched by realistic log lines, precedence is as documented,
and a healthy benchmark log matches nothing."""

from __future__ import annotations

import pytest

from reconciler.domain.signatures import SIGNATURES, classify, logical_lines

#: Realistic lines (dmesg, nvidia-smi, cuzk, aria2c, bash, jq, Python) for every signature in the table.
EXAMPLES: dict[str, list[str]] = {
    "gpu-fell-off-bus": [
        "[ 8123.456789] NVRM: Xid (PCI:0000:01:00): 79, pid=2741, GPU has fallen off the bus.",
        "Xid 79",
        "Unable to determine the device handle for GPU 0000:01:00.0: GPU is lost.  GPU has fallen off the bus",
    ],
    "gpu-ecc": [
        "CUDA error 214: uncorrectable ECC error encountered",
        "NVRM: Xid (PCI:0000:3b:00): 48, pid=912, An uncorrectable double bit error (DBE) has been detected",
        "Error: CudaError(CUDA_ERROR_ECC_UNCORRECTABLE)",
    ],
    "gpu-xid": [
        "[  512.000001] NVRM: Xid (PCI:0000:41:00): 13, pid=3310, Graphics Exception: ESR 0x50",
        "NVRM: Xid (PCI:0000:81:00): 31, pid=88, Ch 00000010, intr 10000000. MMU Fault",
    ],
    "gpu-oom": [
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "Error: cudaErrorMemoryAllocation: out of memory while allocating NTT buffers",
        "thread 'main' panicked at 'CUDA_ERROR_OUT_OF_MEMORY', supraseal-c2/src/lib.rs:82:9",
        "RuntimeError: CUDA error: out of memory",
    ],
    "cuda-runtime-too-new": [
        "CUDA error 35: CUDA driver version is insufficient for CUDA runtime version",
        "cuzk-daemon: init failed: cudaErrorInsufficientDriver",
    ],
    "no-cuda-device": [
        "CUDA error 100: no CUDA-capable device is detected",
        "No devices were found",
        "Error: GPU init: CUDA_ERROR_NO_DEVICE",
    ],
    "nvidia-driver-unreachable": [
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
        "latest NVIDIA driver is installed and running.",
        "Failed to initialize NVML: Unknown Error",
    ],
    "nvidia-driver-mismatch": [
        "Failed to initialize NVML: Driver/library version mismatch",
    ],
    "nvidia-libs-missing": [
        "nvidia-smi: error while loading shared libraries: libnvidia-ml.so.1: cannot open shared object file: "
        "No such file or directory",
        "mknod: /dev/nvidia0: No such file or directory",
    ],
    "cuda-error": [
        "CUDA error 999: unknown error",
        "Error: CudaError(CUDA_ERROR_ILLEGAL_ADDRESS) at cuzk/src/prover.rs:211",
        "GPU kernel failed: an illegal memory access was encountered",
        "cudaErrorLaunchFailure: unspecified launch failure",
    ],
    "checksum-mismatch": [
        "ERROR: checksum mismatch for v28-stacked-proof-of-replication-merkletree-poseidon_hasher-8-8-0-sha256_"
        "hasher-82a357d2f2ca81dc61bb45f4a762807aedee1b0a53fd6c4e77b46a01bfef7820.params",
        "blake2b of /var/tmp/filecoin-proof-parameters/v28-proof-of-spacetime.vk does not match the manifest",
    ],
    "download-error": [
        "02/12 18:03:11 [ERROR] CUID#7 - Download aborted. URI=https://proofs.filecoin.io/v28-stacked.params",
        "Exception: [AbstractCommand.cc:351] errorCode=1 URI=https://proofs.filecoin.io/v28-stacked.params",
        "download aborted",
    ],
    "dns-failure": [
        "curl: (6) Could not resolve host: proofs.filecoin.io",
        "Temporary failure in name resolution",
        "dial tcp: lookup proofs.filecoin.io on 8.8.8.8:53: no such host",
    ],
    "connection-timeout": [
        "curl: (28) Failed to connect to proofs.filecoin.io port 443 after 130012 ms: Connection timed out",
        "socket error: Connection reset by peer",
        "connect: Network is unreachable",
    ],
    "remote-connection-refused": [
        "curl: (7) Failed to connect to params-mirror.internal port 8080 after 3 ms: Connection refused",
    ],
    "daemon-connection-refused": [
        "cuzk-bench: connection refused",
        "Error: connection refused (os error 111) connecting to 127.0.0.1:9820",
        "Error: transport error: tcp connect error: Connection refused (os error 111) [::1]:9820",
    ],
    "command-not-found": [
        "/opt/fleet/benchmark.sh: line 31: cuzk-bench: command not found",
        "sh: 1: aria2c: not found",
    ],
    "exec-format-error": [
        "exec /usr/local/bin/cuzk-daemon: exec format error",
        "bash: /usr/local/bin/cuzk-bench: cannot execute binary file: Exec format error",
    ],
    "permission-denied": [
        "/opt/fleet/entrypoint.sh: line 12: /opt/fleet/benchmark.sh: Permission denied",
    ],
    "script-syntax-error": [
        "/opt/fleet/benchmark.sh: line 57: syntax error near unexpected token `fi'",
        "/opt/fleet/entrypoint.sh: line 8: FLEET_TOKEN: unbound variable",
        "SyntaxError: '(' was never closed",
    ],
    "jq-error": [
        "jq: error (at <stdin>:14): Cannot index string with string \"throughput\"",
    ],
    "python-traceback": [
        "Traceback (most recent call last):",
    ],
    "rust-panic": [
        "thread 'main' panicked at cuzk-bench/src/main.rs:140:37:",
    ],
    "missing-file": [
        "Error: cannot open /opt/fleet/c1.json: No such file or directory (os error 2)",
        "cp: cannot stat '/opt/fleet/cuzk.toml': No such file or directory",
    ],
    "disk-full": [
        "02/12 18:20:01 [ERROR] CUID#12 - write error: No space left on device",
    ],
    "host-oom": [
        "/opt/fleet/benchmark.sh: line 40:  4242 Killed                  cuzk-bench batch -t porep -c 10 -j 2",
        "Out of memory: Killed process 4242 (cuzk-daemon) total-vm:140000000kB",
    ],
}

#: cuzk-bench, cuzk-daemon and aria2c output of a healthy run: nothing in it is a failure signature.
HEALTHY_LOG = [
    "[#26a862 38GiB/56GiB(67%) CN:16 DL:408MiB ETA:46s]",
    "02/12 18:05:40 [NOTICE] Download complete: /var/tmp/filecoin-proof-parameters/v28-stacked.params",
    "cuzk-daemon: listening on 127.0.0.1:9820",
    "GPU 0: NVIDIA RTX PRO 4000 Blackwell (UUID: GPU-2b1c6f3e-0000-4a2b-9c1d-8e7f6a5b4c3d)",
    "  [1/10] ok — 118.2s",
    "  [2/10] ok — 121.0s",
    "=== Batch Summary ===",
    "completed:     10",
    "failed:        0",
    "throughput:    0.497 proofs/min (120.7s/proof)",
]


def test_every_signature_has_examples() -> None:
    names = [s.name for s in SIGNATURES]
    assert len(names) == len(set(names)), "signature names must be unique (the breaker correlates by name)"
    assert set(EXAMPLES) == set(names)


@pytest.mark.parametrize(("name", "line"), [(n, line) for n, lines in EXAMPLES.items() for line in lines])
def test_realistic_line_matches_its_signature(name: str, line: str) -> None:
    match = classify([line])
    assert match is not None, f"{line!r} matched nothing"
    assert match.name == name
    assert match.line == line.strip()


def test_healthy_benchmark_log_matches_nothing() -> None:
    assert classify(HEALTHY_LOG) is None
    assert classify([]) is None


def test_hardware_beats_the_software_symptoms_it_causes() -> None:
    # The GPU falls off the bus mid-run: the daemon dies, the bench then cannot reach it.
    tail = [
        "  [3/10] ok — 119.8s",
        "NVRM: Xid (PCI:0000:01:00): 79, pid=2741, GPU has fallen off the bus.",
        "cuzk-bench: connection refused",
        "Traceback (most recent call last):",
    ]
    match = classify(tail)
    assert match is not None and match.name == "gpu-fell-off-bus" and match.blame == "machine"


def test_daemon_refusal_is_image_but_remote_refusal_is_network() -> None:
    local = classify(["Error: connection refused (os error 111) 127.0.0.1:9820"])
    remote = classify(["curl: (7) Failed to connect to 10.0.0.5 port 80: Connection refused"])
    assert local is not None and local.blame == "image"
    assert remote is not None and remote.blame == "network"


def test_network_beats_the_missing_file_it_causes() -> None:
    tail = [
        "Exception: [AbstractCommand.cc:351] errorCode=1 URI=https://proofs.filecoin.io/v28.params",
        "Error: cannot open /var/tmp/filecoin-proof-parameters/v28.params: No such file or directory",
    ]
    match = classify(tail)
    assert match is not None and match.name == "download-error" and match.blame == "network"


def test_driver_too_old_for_our_image_is_not_the_machines_fault() -> None:
    match = classify(["CUDA error 35: CUDA driver version is insufficient for CUDA runtime version"])
    assert match is not None and match.blame == "image"


def test_pci_bus_number_is_not_read_as_an_xid_code() -> None:
    match = classify(["NVRM: Xid (PCI:0000:79:00): 13, pid=1, Graphics Exception"])
    assert match is not None and match.name == "gpu-xid"


def test_a_404_page_text_is_not_command_not_found() -> None:
    assert classify(["Error: resource not found in manifest"]) is None


def test_cuzk_bench_multiline_error_chain_is_our_daemon_not_the_network() -> None:
    # What cuzk-bench prints (anyhow error chain) when our own daemon is not listening: the refusal is on
    # a continuation line without the address, which alone would read as a remote server refusing.
    tail = [
        "=== Batch Benchmark ===",
        "Error: failed to connect to daemon at http://127.0.0.1:9820",
        "",
        "Caused by:",
        "    0: transport error",
        "    1: tcp connect error: Connection refused (os error 111)",
    ]
    match = classify(tail)
    assert match is not None
    assert (match.name, match.blame) == ("daemon-connection-refused", "image")
    assert match.line.startswith("Error: failed to connect to daemon") and "Connection refused" in match.line


def test_error_chain_joining_leaves_unrelated_lines_alone() -> None:
    joined = logical_lines(["Error: x", "", "Caused by:", "    0: y", "next"])
    assert joined == ["Error: x | Caused by: | 0: y", "next"]
    assert logical_lines(["  [1/4] ok — 70.3s", "", "=== Batch Summary ==="]) == \
        ["  [1/4] ok — 70.3s", "", "=== Batch Summary ==="]

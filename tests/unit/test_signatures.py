"""Failure signatures: every table entry is matched by real log lines, tails are cleaned and joined before
matching (worker timestamps, ANSI colour, multi-line panics and anyhow chains), codes are decoded (CUDA,
Xid, aria2c, curl), precedence is as documented, and a healthy benchmark log matches nothing.

Whole tails with their sources live in tests/fixtures/tails/ (tests/unit/test_tails_corpus.py); these are
single lines and small joins, the unit level of the same strings.
"""

from __future__ import annotations

import pytest

from reconciler.domain.signatures import (
    CUDA_OWN_SIGNATURES,
    SIGNATURES,
    XID_APPLICATION,
    XID_ECC,
    classify,
    clean_line,
    code_meaning,
    error_line,
    logical_lines,
    read_tail,
)
from reconciler.domain.verdicts import BLAMES

PANIC = "thread 'tokio-runtime-worker' panicked at /build/curio/extern/supraseal-c2/src/lib.rs:316:9:"

#: Real lines (curio e0294b0f, sppark, NVIDIA driver, aria2c, curl, glibc, bash, kernel) for every signature.
EXAMPLES: dict[str, list[str]] = {
    "gpu-fell-off-bus": [
        "[ 8123.456789] NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.",
    ],
    "gpu-ecc": [
        "NVRM: Xid (PCI:0000:3b:00): 48, pid=912, name=cuzk-daemon, An uncorrectable double bit error (DBE) has "
        "been detected on GPU in the framebuffer at partition 6, subpartition 0.",
        "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
        "NVRM: Xid (PCI:0000:10:1c): 95, pid=1896, name=cuzk-daemon, Uncontained: LTC TAG (0x2,0x0). RST: Yes",
        "sppark::Error #-214",
    ],
    "gpu-gsp-timeout": [
        "NVRM: Xid (PCI:0000:01:00): 119, pid=812, name=cuzk-daemon, Timeout after 6s of waiting for RPC response "
        "from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20800a4c 0x4).",
    ],
    "gpu-lost": ["Unable to determine the device handle for GPU0000:01:00.0: GPU is lost.  Reboot the system"],
    "nvidia-driver-unreachable": [
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
        "latest NVIDIA driver is installed and running.",
        "Failed to initialize NVML: Unknown Error",
    ],
    "nvidia-driver-mismatch": ["Failed to initialize NVML: Driver/library version mismatch"],
    "nvidia-no-device": ["No devices were found", "fleet: nvidia-smi failed: No devices were found"],
    "cuda-no-device": [
        "RuntimeError: No CUDA GPUs are available",
        "sppark::Error #-100", "No CUDA devices available",
        'cudaGetDeviceCount(&n)@sppark/util/all_gpus.cpp:12 failed: "no CUDA-capable device is detected"'],
    "cuda-init-error": ["sppark::Error #-3"],
    "cuda-devices-unavailable": ["sppark::Error #-46"],
    "nvidia-libs-missing": [
        "/opt/fleet/entrypoint.sh: line 140: nvidia-smi: command not found",
        "cuzk-daemon: error while loading shared libraries: libcuda.so.1: cannot open shared object file: No such "
        "file or directory",
        "nvidia-smi: error while loading shared libraries: libnvidia-ml.so.1: cannot open shared object file",
        "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the NVIDIA Display "
        "Driver is properly installed and present in your system.",
    ],
    "host-no-gpu-runtime": [
        'docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].'],
    "gpu-xid-application": [
        "[  512.000001] NVRM: Xid (PCI:0000:41:00): 13, pid=3310, name=cuzk-daemon, Graphics SM Warp Exception",
        "NVRM: Xid (PCI:0000:81:00): 31, pid=88, name=cuzk-daemon, Ch 00000010, intr 10000000. MMU Fault",
        "NVRM: Xid (PCI:0000:81:00): 43, pid=88, name=cuzk-daemon, Ch 00000010",
    ],
    "host-out-of-memory": [
        "fatal error: runtime: out of memory",
        "[ 8123.440211] Out of memory: Killed process 812 (cuzk-daemon) total-vm:412339812kB, anon-rss:130872112kB",
        "Memory cgroup out of memory: Killed process 812 (cuzk-daemon) total-vm:412339812kB",
        "oom_kill 1",
        "memory allocation of 68719476736 bytes failed",
        "/opt/fleet/benchmark.sh: fork: Cannot allocate memory",
    ],
    "process-killed": [
        '/opt/fleet/entrypoint.sh: line 225:   812 Killed                  cuzk-daemon --config "$FLEET_CONF"',
        "bash: line 1:  4242 Killed                  cuzk-bench batch -t porep -c 10 -j 2",
    ],
    "memory-budget-blocks": [
        "2026-12-03T07:40:02.004211Z  WARN cuzk_core::memory: acquire request exceeds total budget — will block until "
        "possible amount_gib=200 total_gib=40"],
    "gpu-not-visible": [
        "2026-12-03T07:40:00.120044Z  WARN cuzk_core::engine: nvidia-smi not available, defaulting to single GPU "
        "(ordinal 0)"],
    "srs-memory-budget": [
        "ERROR cuzk_core::engine: Phase 7: C1 parse/SRS load failed error=insufficient memory budget for SRS "
        "porep-32g (44 GiB), available: 21 GiB, total: 62 GiB"],
    "disk-full": [
        "Error: ENOSPC: no space left on device, write",
        "Exception: [AbstractCommand.cc:403] errorCode=9 Failed to write into the file x.params, cause: No space "
        "left on device",
        "curl: (23) Failure writing output to destination, passed 16384 returned 4294967295",
        "fleet: ERROR: aria2c failed to download https://m/x.params (exit code 9)",
    ],
    "cuda-out-of-memory": ["sppark::Error #-2",
                           'cudaMalloc(&cache.ptr, sz_bytes)@cuda/groth16_cuda.cu:182 failed: "out of memory"'],
    "cuda-driver-too-old-for-image": [
        "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.4, "
        "please update your driver to a newer version, or use an earlier cuda container", "sppark::Error #-36",
        "sppark::Error #-35", "CUDA driver version is insufficient for CUDA runtime version"],
    "cuda-no-kernel-image": ["sppark::Error #-209", "no kernel image is available for execution on the device"],
    "cuda-unsupported-ptx": ["sppark::Error #-222", "the provided PTX was compiled with an unsupported toolchain."],
    "cuda-illegal-address": ["sppark::Error #-700", "an illegal memory access was encountered"],
    "params-not-found": [
        "Exception: [AbstractCommand.cc:351] errorCode=3 URI=https://m/v28.params",
        "curl: (22) The requested URL returned error: 404",
        "curl: (78) Remote file not found",  # CURLE_REMOTE_FILE_NOT_FOUND, lib/strerror.c
    ],
    "srs-param-file-missing": [
        "ERROR cuzk_core::engine: Phase 7: C1 parse/SRS load failed error=SRS param file not found for Porep32G: "
        "/data/zk/params/v28-stacked-proof-of-replication.params"],
    "bench-input-missing": ["Error: --c1 required for PoRep proof type",
                            "fleet: ERROR: benchmark input (c1.json) missing: set FLEET_BENCH_C1"],
    "srs-load-failed": ["ERROR cuzk_core::engine: Phase 7: C1 parse/SRS load failed error=failed to load SRS from "
                        "/data/zk/params/v28.params"],
    "segfault": ["/opt/fleet/entrypoint.sh: line 225:   812 Segmentation fault      (core dumped) cuzk-daemon"],
    "command-not-found": ["/opt/fleet/benchmark.sh: line 31: cuzk-bench: command not found",
                          "sh: 1: aria2c: not found"],
    "shared-library-missing": [
        "cuzk-daemon: error while loading shared libraries: libcudart.so.12: cannot open shared object file"],
    "exec-format-error": [
        "exec /opt/fleet/entrypoint.sh: no such file or directory",
        "exec /usr/local/bin/cuzk-daemon: exec format error"],
    "script-error": ["/opt/fleet/benchmark.sh: line 57: syntax error near unexpected token `fi'",
                     "/opt/fleet/entrypoint.sh: line 8: FLEET_TOKEN: unbound variable",
                     'jq: error (at <stdin>:14): Cannot index string with string "throughput"'],
    "python-exception": ["KeyError: 'throughput'", "json.decoder.JSONDecodeError: Expecting value: line 1 column 1"],
    "python-traceback": ["Traceback (most recent call last):"],
    "bench-usage-error": ["Error: unknown proof type: porep-c3. Use: porep, snap, wpost, winning"],
    "daemon-config-error": ['Error: failed to load config from "/var/lib/fleet/cuzk.toml"'],
    "permission-denied": ["/opt/fleet/entrypoint.sh: line 12: /opt/fleet/benchmark.sh: Permission denied"],
    "proof-self-check": [
        "ERROR cuzk_core::engine: Phase 7: PoRep proof self-check FAILED — proof will NOT be returned to caller "
        "job_id=0b6f7c3e proof_len=1920 sector=1 miner=1000"],
    "checksum-mismatch": ["fleet: ERROR: checksum mismatch for v28.params after 2 downloads: blake2b-512 expected a"],
    "dns-failure": [
        "Exception: [AbstractCommand.cc:351] errorCode=19 Name resolution for m.example failed:Temporary failure in "
        "name resolution",
        "curl: (6) Could not resolve host: params.example.com"],
    "connection-reset": ["Exception: [AbstractCommand.cc:351] errorCode=6 Network problem has occurred. "
                         "cause:Connection reset by peer"],
    "network-timeout": ["curl: (28) Operation timed out after 600000 milliseconds with 1 out of 2 bytes received"],
    "connection-failed": [
        "curl: (7) Failed to connect to params.example.com port 443 after 41 ms: Couldn't connect to server"],
    "download-failed-network": ["fleet: ERROR: aria2c failed to download https://m/v28.params (exit code 6)"],
    "download-failed-generic": ["12/03 06:05:01 [ERROR] CUID#7 - Download aborted. URI=https://m/v28.params",
                                "fleet: ERROR: aria2c failed to download https://m/v28.params (exit code 7)",
                                "fleet: ERROR: aria2c failed to download https://m/v28.params (exit code 1)"],
    "params-too-slow": ["fleet: ERROR: params fetch exceeded FLEET_PARAMS_TIMEOUT_S=3600s while downloading x"],
    "worker-stopped": ["fleet: received SIGTERM during phase benchmark"],
    "rust-panic": [f"{PANIC} b_g2_msm caught exception"],
    "daemon-connection-refused": ["Error: failed to connect to daemon at http://127.0.0.1:9820 | transport error",
                                  "cuzk-bench: connection refused"],
    "daemon-rpc-failed": ["Error: Prove RPC failed"],
    # issue 23: the tables built whole (cuda_errors.py, xid.py) and the classes beside them.
    "gpu-xid-hardware": [
        "NVRM: Xid (PCI:0000:01:00): 62, pid=812, name=cuzk-daemon, 2a7c(1d8c) 00000000 00000000",
        "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"],
    "host-memory-hardware-error": [
        "[ 9120.331002] Memory failure: 0x2f1a3c: Sending SIGBUS to cuzk-daemon:812 due to hardware memory corruption",
        "[    0.512345] mce: [Hardware Error]: Machine check events logged"],
    "cuda-gpu-fault": [
        "sppark::Error #-719", "sppark::Error #-999",
        '========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API '
        "call to cudaDeviceSynchronize.",
        "RuntimeError: CUDA error: unspecified launch failure"],
    "cuda-software-error": ["sppark::Error #-716", "cudaErrorInvalidValue",
                            'cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, s)@sppark/util/gpu_t.cuh:201 failed: '
                            '"an illegal instruction was encountered"'],
    "loader-version-missing": [
        "/usr/local/bin/cuzk-daemon: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.39' not found (required by "
        "/usr/local/bin/cuzk-daemon)"],
    "binary-not-installed": ["fleet: ERROR: cuzk-bench is not installed in this image (not on PATH)"],
    "tls-clock-behind": [
        "aria2c: SSL/TLS handshake failure: The certificate chain uses not yet valid certificate.",
        "Get \"https://params.example.com/manifest.txt\": tls: failed to verify certificate: x509: certificate has "
        "expired or is not yet valid: current time 2020-01-01T00:00:12Z is before 2026-10-03T00:00:00Z",
        "curl: (60) SSL certificate problem: certificate is not yet valid"],
    "tls-certificate-expired": [
        "aria2c: SSL/TLS handshake failure: The certificate chain uses expired certificate.",
        "x509: certificate has expired or is not yet valid: current time 2023-01-28T09:08:05+01:00 is after "
        "2023-01-08T09:42:48Z", "curl: (60) SSL certificate problem: certificate has expired"],
    "tls-unknown-authority": [
        "curl: (60) SSL certificate problem: self-signed certificate in certificate chain",
        "The certificate is NOT trusted. The certificate issuer is unknown.",
        "x509: certificate signed by unknown authority",
        "curl: (60) SSL certificate problem: unable to get local issuer certificate",
        "Error: invalid peer certificate: UnknownIssuer",
        "curl: (77) error setting certificate verify locations:  CAfile: /etc/ssl/certs/ca-certificates.crt  "
        "CApath: none"],
    "tls-hostname-mismatch": [
        "x509: certificate is valid for *.cdn.example.net, cdn.example.net, not params.example.com",
        "curl: (60) SSL: no alternative certificate subject name matches target host name 'params.example.com'"],
    "params-mirror-denied": ["curl: (22) The requested URL returned error: 403",
                             "curl: (22) The requested URL returned error: 401"],
    "params-mirror-unavailable": ["curl: (22) The requested URL returned error: 503",
                                  "fleet: ERROR: aria2c failed to download https://m/v28.params (exit code 29)"],
    "cpu-instruction-set-missing": [
        '/opt/fleet/entrypoint.sh: line 225:   812 Illegal instruction     (core dumped) cuzk-daemon --config '
        '"$FLEET_CONF"',
        "fleet: ERROR: cuzk-daemon exited (code 132) before answering cuzk-bench status",
        "fleet: cuzk-daemon exited with code 132 (killed by SIGILL)"],
    "bus-error": ["/opt/fleet/entrypoint.sh: line 225:   812 Bus error               (core dumped) cuzk-daemon"],
    "process-aborted": [
        "*** stack smashing detected ***: terminated",
        "thread 'tokio-runtime-worker' has overflowed its stack",
        "terminate called after throwing an instance of 'std::runtime_error'",
        "/opt/fleet/benchmark.sh: line 60:  4242 Aborted                 (core dumped) cuzk-bench"],
    "process-sigkill": ["fleet: ERROR: cuzk-bench exited with code 137 after 0 of 10 proofs (0 failed)"],
    "gpu-xid-ambiguous": ["NVRM: Xid (PCI:0000:01:00): 45, pid=15041, name=cuzk-daemon, Ch 00000006"],
    "gpu-init-failed": [
        "NVRM: The NVIDIA probe routine failed for 1 device(s).",
        "[   12.345678] NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (0x31:0xffff:2358)",
        "NVRM: rm_init_adapter failed for device bearing minor number 0"],
    "downloader-usage-error": ["fleet: ERROR: aria2c failed to download https://m/v28.params (exit code 28)"],
    "params-url-malformed": ["curl: (3) URL using bad/illegal format or missing URL"],
    "loader-symbol-missing": ["cuzk-daemon: symbol lookup error: /usr/local/bin/cuzk-daemon: undefined symbol: "
                              "cudaGetDriverEntryPointByVersion, version libcudart.so.12"],
    # issue 29: the code tables whole (aria2_codes, curl_codes, errnos, exit_statuses) and the classes they fill.
    "container-limit": [
        "Error: failed to open /data/zk/params/v28.params | Too many open files (os error 24)",  # Rust io::Error
        "/opt/fleet/entrypoint.sh: line 225:   812 File size limit exceeded (core dumped) cuzk-daemon"],
    "host-os-error": [
        "Error: failed to read /var/tmp/filecoin-proof-parameters/v28.params | Input/output error (os error 5)",
        "cp: error reading '/data/zk/params/v28.params': Input/output error",  # coreutils + glibc strerror(EIO)
        "OSError: [Errno 117] Structure needs cleaning: '/data/zk/params'"],  # Python OSError str()
    "network-unreachable": [
        'Get "https://params.example.com/manifest.txt": dial tcp 203.0.113.7:443: connect: network is unreachable',
        "Error: error sending request | No route to host (os error 113)"],
    "fatal-signal": [
        "/opt/fleet/entrypoint.sh: line 225:   812 Floating point exception (core dumped) cuzk-daemon",
        "fleet: cuzk-daemon exited with code 136 (killed by SIGFPE)"],
    "signal-ambiguous": ["fleet: cuzk-daemon exited with code 141 (killed by SIGPIPE)"],
    "signal-stopped": ["fleet: ERROR: cuzk-bench exited with code 143 after 3 of 10 proofs (0 failed)"],
    "os-error-ambiguous": ["Error: failed to spawn prover thread | Resource temporarily unavailable (os error 11)",
                           "Error: failed to open /data/zk/params | Read-only file system (os error 30)"],
    "software-os-error": ["Error: failed to bind 0.0.0.0:9820 | Address already in use (os error 98)",
                          "Error: Invalid argument (os error 22)"],
    "params-mirror-unsupported": [
        "fleet: ERROR: aria2c failed to download https://m/v28.params (exit code 8)",
        "curl: (33) HTTP server does not seem to support byte ranges. Cannot resume."],  # curl lib/http.c
    "params-mirror-bad-response": [
        "fleet: ERROR: aria2c failed to download https://m/v28.params (exit code 22)",
        "curl: (47) Maximum (50) redirects followed"],  # curl lib/http.c failf
    "params-mirror-http-error": ["fleet: ERROR: could not download https://m/manifest.txt (curl exit code 22)"],
    "params-dir-error": ["fleet: ERROR: aria2c failed to download https://m/v28.params (exit code 17)"],
    "params-source-missing": [
        "fleet: ERROR: no params source: FLEET_PARAMS_BASE_URL is not set and curio is not installed"],
    "params-manifest-bad": ["fleet: ERROR: https://m/manifest.txt lists no files"],
    "tls-verify-failed": ["fleet: ERROR: could not download https://m/manifest.txt (curl exit code 60)"],
    "warmup-proof-failed": ["fleet: ERROR: warm-up failed: the warm-up proof came back FAILED"],
    "worker-deadline": ["fleet: ERROR: cuzk-daemon did not answer cuzk-bench status at http://127.0.0.1:9820 within "
                        "FLEET_DAEMON_WAIT_S=300s"],
    "worker-bad-environment": ["fleet: ERROR: FLEET_BENCH_PROOFS must be a positive integer, got 'ten'"],
    "worker-tool-output-missing": ["fleet: ERROR: cuzk-bench exited 0 but printed no throughput line (10 of 10 proofs "
                                   "completed, 0 failed)"],
}

#: cuzk-bench, cuzk-daemon and aria2c output of a healthy run (real formats): nothing in it is a failure.
HEALTHY_LOG = [
    "2026-12-03T06:05:02Z [#26a862 38GiB/56GiB(67%) CN:16 DL:408MiB ETA:46s]",
    "2026-12-03T06:05:40Z 12/03 06:05:40 [NOTICE] Download complete: /data/zk/params/v28-stacked.params",
    "2026-12-03T06:20:01Z cuzk-daemon: 2026-12-03T06:20:01.102260Z  INFO cuzk_daemon: cuzk-daemon ready, serving on "
    "127.0.0.1:9820",
    "2026-12-03T06:20:09Z cuzk-daemon: 2026-12-03T06:20:09.004211Z  WARN cuzk_core::pinned_pool: cudaHostAlloc "
    "failed size_gib=12.0 cuda_err=2",
    "CUZK_TIMING: gpu_tid=0 tail_msm_ms=311 gpu_total_ms=9107",
    "=== Batch Benchmark ===",
    "  [1/10] COMPLETED — 118.2s (prove=38411 ms, queue=3 ms)",
    "  [2/10] COMPLETED — 121.0s (prove=38390 ms, queue=2 ms)",
    "=== Batch Summary ===",
    "completed:     10",
    "failed:        0",
    "throughput:    0.497 proofs/min (120.7s/proof)",
]


def test_every_signature_has_examples_and_a_registered_blame() -> None:
    names = [s.name for s in SIGNATURES]
    assert len(names) == len(set(names)), "signature names must be unique (the breaker correlates by name)"
    assert set(EXAMPLES) == set(names)
    assert all(s.blame in BLAMES for s in SIGNATURES)
    assert [s.priority for s in SIGNATURES] == sorted((s.priority for s in SIGNATURES), reverse=True)
    configured = [s for s in SIGNATURES if s.blame in ("configuration", "params")]
    assert configured and all(s.setting for s in configured), "a configuration fault must say what to change"


@pytest.mark.parametrize(("name", "line"), [(n, line) for n, lines in EXAMPLES.items() for line in lines])
def test_real_line_matches_its_signature(name: str, line: str) -> None:
    match = classify([line])
    assert match is not None, f"{line!r} matched nothing"
    assert match.name == name


def test_healthy_benchmark_log_matches_nothing() -> None:
    assert classify(HEALTHY_LOG) is None
    assert classify([]) is None


def test_worker_timestamps_ansi_and_the_daemons_own_timestamp_are_stripped() -> None:
    raw = ("2026-12-03T07:05:00Z cuzk-daemon: \x1b[2m2026-12-03T07:05:00.118802Z\x1b[0m \x1b[31mERROR\x1b[0m "
           "\x1b[2mcuzk_core::engine\x1b[0m\x1b[2m:\x1b[0m boom")
    assert clean_line(raw) == ("cuzk-daemon", "ERROR cuzk_core::engine: boom")
    assert clean_line("2026-12-03T07:05:00Z fleet: x") == ("", "fleet: x")


def test_a_two_line_rust_panic_is_joined_per_stream() -> None:
    # Rust >= 1.73 prints the message on the line after `panicked at`; another stream may interleave.
    tail = [f"2026-12-03T06:31:40Z cuzk-daemon: {PANIC}", "2026-12-03T06:31:40Z fleet: waiting",
            "2026-12-03T06:31:40Z cuzk-daemon: sppark::Error #-2"]
    lines = logical_lines(tail)
    assert lines == [f"cuzk-daemon: {PANIC} sppark::Error #-2", "fleet: waiting"]
    match = classify(tail)
    assert match is not None and match.name == "cuda-out-of-memory" and match.blame == "configuration"
    assert match.text().endswith("[= cudaErrorMemoryAllocation (2): out of memory]")


def test_an_anyhow_chain_with_timestamps_is_joined_and_is_our_daemon() -> None:
    # The worker prefixes every ring line (blank ones too) with its timestamp; the refusal alone is remote.
    tail = ["2026-12-02T18:23:00Z Error: failed to connect to daemon at http://127.0.0.1:9820",
            "2026-12-02T18:23:00Z ", "2026-12-02T18:23:00Z Caused by:", "2026-12-02T18:23:00Z     0: transport error",
            "2026-12-02T18:23:00Z     1: tcp connect error", "2026-12-02T18:23:00Z     2: tcp connect error",
            "2026-12-02T18:23:00Z     3: Connection refused (os error 111)", "2026-12-02T18:23:00Z next"]
    assert logical_lines(tail) == ["Error: failed to connect to daemon at http://127.0.0.1:9820 | transport error | "
                                   "tcp connect error | Connection refused (os error 111)", "next"]
    match = classify(tail)
    assert match is not None and (match.name, match.blame) == ("daemon-connection-refused", "image")
    # One cause prints unnumbered (anyhow): still joined.
    assert logical_lines(["Error: failed to read /x/c1.json", "", "Caused by:",
                          "    No such file or directory (os error 2)"]) == [
        "Error: failed to read /x/c1.json | No such file or directory (os error 2)"]


def test_memory_kill_outranks_the_connection_refused_that_follows() -> None:
    tail = ['/opt/fleet/entrypoint.sh: line 225:   812 Killed                  cuzk-daemon --config x',
            "Error: failed to connect to daemon at http://127.0.0.1:9820", "", "Caused by:",
            "    0: transport error", "    1: Connection refused (os error 111)"]
    match = classify(tail)
    assert match is not None and (match.name, match.blame) == ("process-killed", "configuration")
    assert match.signature.setting is not None and "min_host_ram_gb" in match.signature.setting


def test_hardware_beats_the_software_symptoms_it_causes() -> None:
    tail = ["  [3/10] COMPLETED — 119.8s (prove=38411 ms, queue=3 ms)",
            "NVRM: Xid (PCI:0000:01:00): 13, pid=2741, name=cuzk-daemon, Graphics SM Warp Exception",
            "NVRM: Xid (PCI:0000:01:00): 79, pid=2741, GPU has fallen off the bus.",
            "/opt/fleet/entrypoint.sh: line 225:   812 Segmentation fault      (core dumped) cuzk-daemon",
            "cuzk-bench: connection refused"]
    match = classify(tail)
    assert match is not None and match.name == "gpu-fell-off-bus" and match.blame == "machine"


@pytest.mark.parametrize("xid", [*XID_APPLICATION, *XID_ECC, 79, 119])
def test_xid_by_class(xid: int) -> None:
    match = classify([f"NVRM: Xid (PCI:0000:01:00): {xid}, pid=1, name=cuzk-daemon, text"])
    assert match is not None
    assert match.blame == ("image" if xid in XID_APPLICATION else "machine")


def test_pci_bus_number_is_not_read_as_an_xid_code_and_unknown_xids_are_not_guessed() -> None:
    match = classify(["NVRM: Xid (PCI:0000:79:00): 13, pid=1, Graphics Exception"])
    assert match is not None and match.name == "gpu-xid-application"
    # 45 is in the catalogue now (issue 23: the whole table), as an ambiguous Xid: blame unknown, not guessed.
    ambiguous = classify(["NVRM: Xid (PCI:0000:01:00): 45, pid=1, Ch 00000010"])
    assert ambiguous is not None and ambiguous.blame == "unknown"
    # A number outside the catalogue (it ends at 162) and the test-only Xids are never a cause.
    for code in (163, 999, 14, 106, 107):
        assert classify([f"NVRM: Xid (PCI:0000:01:00): {code}, pid=1, Ch 00000010"]) is None


@pytest.mark.parametrize("code", sorted(CUDA_OWN_SIGNATURES))
def test_cuda_codes_decode_in_both_forms(code: int) -> None:
    enum, text, blame, name, _ = CUDA_OWN_SIGNATURES[code]
    bare = classify([f"sppark::Error #-{code}"])
    worded = classify([f'cudaMalloc(&p, n)@sppark/util/gpu_t.cuh:73 failed: "{text}"'])
    assert bare is not None and worded is not None
    assert bare.name == worded.name == name and bare.blame == worded.blame == blame
    assert code_meaning(f"sppark::Error #-{code}") == f"{enum} ({code}): {text}"


@pytest.mark.parametrize(("line", "blame"), [
    ("fleet: ERROR: aria2c failed to download https://m/x (exit code 3)", "params"),
    ("fleet: ERROR: aria2c failed to download https://m/x (exit code 9)", "configuration"),
    ("fleet: ERROR: aria2c failed to download https://m/x (exit code 19)", "network"),
    ("fleet: ERROR: aria2c failed to download https://m/x (exit code 1)", "unknown"),  # generic: "unknown error"
    ("fleet: ERROR: aria2c failed to download https://m/x (exit code 6)", "network"),
    ("fleet: ERROR: aria2c failed to download https://m/x (exit code 7)", "unknown"),  # generic: stopped by a signal
    ("fleet: ERROR: could not download https://m/manifest.txt (curl exit code 22)", "params"),
    ("fleet: ERROR: could not download https://m/manifest.txt (curl exit code 6)", "network"),
    ("fleet: ERROR: curl failed to download https://m/x (exit code 23)", "configuration"),
    ("fleet: ERROR: curl failed to download https://m/x (exit code 28)", "network"),
])
def test_downloader_exit_codes_by_meaning(line: str, blame: str) -> None:
    match = classify([line])
    assert match is not None and match.blame == blame
    assert "[= " in match.text()  # the bare code is explained


def test_progress_timing_and_tunnel_lines_are_never_causes() -> None:
    tail = ["[#26a862 38GiB/56GiB(67%) CN:16 DL:408MiB ETA:46s]", "CUZK_TIMING: gpu_tid=0 tail_msm_ms=1",
            "TIMELINE,1234,GPU_START,job,0", "tunnel: ssh: connect to host b.example port 22: Connection refused",
            "fleet: tunnel: ssh to fleet@b.example exited with code 255; restarting in 15s"]
    assert classify(tail) is None
    assert error_line(tail) is None
    tunnel = classify(tail, include_tunnel=True)
    assert tunnel is not None and tunnel.name == "connection-failed"
    assert all(line.noise or line.tunnel for line in read_tail(tail))


def test_the_daemon_refusal_is_image_but_a_remote_refusal_is_network() -> None:
    local = classify(["Error: connection refused (os error 111) 127.0.0.1:9820"])
    remote = classify(["curl: (7) Failed to connect to 10.0.0.5 port 80: Connection refused"])
    assert local is not None and local.blame == "image"
    assert remote is not None and remote.blame == "network"


def test_a_404_page_text_is_not_command_not_found() -> None:
    assert classify(["Error: resource not found in manifest"]) is None


def test_error_line_prefers_the_last_error_over_progress() -> None:
    assert error_line(["fleet: params: downloading x", "Error: empty response", "[#1 1GiB/2GiB(50%) CN:1]"]) == \
        "Error: empty response"


def test_strongest_signature_takes_the_most_decisive_line_of_the_whole_evidence() -> None:
    from reconciler.domain.signatures import (
        PRIORITY_HARDWARE,
        PRIORITY_SYMPTOM,
        signature_named,
        strongest_signature,
    )
    evidence = ["Failed to initialize NVML: Driver/library version mismatch",
                *[f"[#26a862 {i}GiB/56GiB(1%) CN:16 DL:408MiB ETA:46s]" for i in range(200)],
                "Error: failed to connect to daemon at http://127.0.0.1:9820 | transport error"]
    match = strongest_signature(evidence)
    assert match is not None and match.name == "nvidia-driver-mismatch" and match.index == 0
    assert match.priority == PRIORITY_HARDWARE
    symptom = strongest_signature(evidence[1:])
    assert symptom is not None and symptom.priority == PRIORITY_SYMPTOM
    assert signature_named("nvidia-driver-mismatch") is match.signature and signature_named("no-such") is None
    assert strongest_signature([]) is None


def test_pinned_host_memory_is_configuration_and_never_advises_a_bigger_gpu() -> None:
    from reconciler.domain.signatures import SETTING_PINNED_HOST, signature_named
    warning = ("cuzk-daemon: 2026-12-03T07:40:00.120044Z  WARN cuzk_core::pinned_pool: cudaHostAlloc failed "
               "size_gib=4.0 cuda_err=2")
    match = classify([warning, "cuzk-daemon: Error: sppark::Error #-2"])
    assert match is not None and match.name == "pinned-host-memory" and match.blame == "configuration"
    assert match.signature.setting == SETTING_PINNED_HOST and "min_host_ram_gb" in SETTING_PINNED_HOST
    assert "memlock" in SETTING_PINNED_HOST and "GPU with more memory" not in SETTING_PINNED_HOST
    assert "cudaHostAlloc failed" in match.line and match.index == 0
    assert signature_named("pinned-host-memory") is match.signature
    # The warning alone is not a failure (the pool falls back); GPU out of memory alone stays GPU memory.
    assert classify([warning]) is None
    gpu = classify(["sppark::Error #-2"])
    assert gpu is not None and gpu.name == "cuda-out-of-memory"


@pytest.mark.parametrize("code", sorted(__import__("reconciler.domain.cuda_errors", fromlist=["x"]).CUDA_ERRORS))
def test_every_cuda_runtime_code_decodes_by_number_and_by_name_with_its_blame(code: int) -> None:
    from reconciler.domain.cuda_errors import CUDA_ERRORS as TABLE
    err = TABLE[code]
    bare, named = classify([f"sppark::Error #-{code}"]), classify([f"CUDA call failed: {err.name}"])
    if err.blame == "none":  # cudaErrorNotReady: a query's answer, decoded but never a cause
        assert bare is None and named is None and code_meaning(f"sppark::Error #-{code}") == err.meaning()
        return
    assert bare is not None and named is not None and bare.name == named.name
    assert bare.blame == err.blame and named.blame == err.blame
    assert code_meaning(f"sppark::Error #-{code}") == err.meaning() and err.name in bare.text()
    if err.text:
        worded = classify([f'cudaDeviceSynchronize()@sppark/util/gpu_t.cuh:90 failed: "{err.text}"'])
        assert worded is not None and worded.blame == err.blame


@pytest.mark.parametrize("code", range(1, 163))
def test_every_catalogued_xid_has_its_class(code: int) -> None:
    from reconciler.domain.xid import XIDS
    match = classify([f"NVRM: Xid (PCI:0000:3b:00): {code}, pid=812, name=cuzk-daemon, details"])
    expected = XIDS[code].blame
    assert (match.blame if match else None) == expected
    if match is not None:
        assert match.priority == {"machine": 100, "image": 95, "unknown": 52}[expected]


@pytest.mark.parametrize("code", sorted(__import__("reconciler.domain.cuda_errors", fromlist=["x"]).DRIVER_ERROR_NAMES))
def test_every_driver_api_code_decodes_by_name_with_its_blame(code: int) -> None:
    from reconciler.domain.cuda_errors import DRIVER_ERROR_NAMES, driver_blame
    name = DRIVER_ERROR_NAMES[code]
    match = classify([f"Error: DriverError({name}, \"\")"])
    blame = driver_blame(code)
    assert (match.blame if match else "none") == blame, (name, match and match.name)
    meaning = code_meaning(name)
    assert meaning is not None and meaning.startswith(f"{name} ({code})")

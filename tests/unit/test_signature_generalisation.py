"""The judging generalises: real failure lines the tables were NOT written from (other Xids, other codes,
other tools' phrasings of the same cause) get the right blame (issue 23 item 10).

Every line is a real public string (or the real format with our program's name in it), cited next to it. None
of them appears in test_signatures.py's EXAMPLES or in tests/fixtures/tails/ (checked below), so a table
that only matched its own examples fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.domain.signatures import classify
from tests.unit.test_signatures import EXAMPLES

TAILS = Path(__file__).resolve().parents[1] / "fixtures" / "tails"

#: (line, blame, source)
FRESH: list[tuple[str, str, str]] = [
    # --- Xids in other formats and other codes ------------------------------------------------------------
    ("XID 48 An uncorrectable double bit error (DBE) has been detected on GPU (0000:3b:00.0)", "machine",
     "NVIDIA docs, Dynamic Page Retirement > Visibility: 'XID 48 An uncorrectable double bit error (DBE) has been "
     "detected on GPU (<id>)'"),
    ("XID 64 Dynamic Page Retirement: Fatal error, unable to retire page (0x00000000deadb000)", "machine",
     "NVIDIA docs, Dynamic Page Retirement > Visibility: 'XID 64 Dynamic Page Retirement: Fatal error, unable to "
     "retire page (<address>)'"),
    ("NVRM: Xid (PCI:0000:01:00): 119, pid=15041, name=cuzk-daemon, Timeout after 45s of waiting for RPC response "
     "from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL)", "machine",
     "NVIDIA/open-gpu-kernel-modules#1045: 'Xid 119 (\"Timeout after 45s of waiting for RPC response from GPU0 "
     "GSP\")'"),
    ("NVRM: Xid (PCI:0000:41:00): 109, pid=3310, name=cuzk-daemon, Ch 00000010, errorString CTX SWITCH TIMEOUT",
     "machine", "NVIDIA Xid catalogue: 109 ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR, RESET_GPU"),
    ("NVRM: Xid (PCI:0000:41:00): 69, pid=3310, name=cuzk-daemon, Class Error: ChId 0010, Class 0000c7c0",
     "image", "NVIDIA Xid catalogue: 69 ROBUST_CHANNEL_GR_CLASS_ERROR (illegal class/method from the application)"),
    # --- CUDA codes in other tools' formats ----------------------------------------------------------------
    ('CUDA error at /build/curio/extern/supraseal-c2/cuda/groth16_cuda.cu:1044 code=999(cudaErrorUnknown) '
     '"cudaDeviceSynchronize()"', "machine",
     "NVIDIA/cuda-samples Common/helper_cuda.h check(): 'CUDA error at %s:%d code=%d(%s) \"%s\"'"),
    ("CUDA error at groth16_cuda.cu:988 code=214(cudaErrorECCUncorrectable) \"cudaStreamSynchronize(s)\"", "machine",
     "NVIDIA/cuda-samples Common/helper_cuda.h check() format, code 214"),
    ("CUDA error at msm.cuh:301 code=701(cudaErrorLaunchOutOfResources) \"cudaGetLastError()\"", "image",
     "NVIDIA/cuda-samples Common/helper_cuda.h check() format, code 701 (our launch asked too much)"),
    ("[rank0]: RuntimeError: CUDA error: unknown error", "machine",
     "liunian-Jay/MU-GOT#7 (PyTorch 'CUDA error: ' + cudaGetErrorString(999))"),
    ('Exception in thread "main" jcuda.CudaException: CUDA_ERROR_LAUNCH_FAILED', "machine",
     "jcuda/jcuda JCudaDriver: throw new CudaException(CUresult.stringFor(result)) (driver API name of 719)"),
    ('Exception in thread "main" jcuda.CudaException: CUDA_ERROR_NO_BINARY_FOR_GPU', "image",
     "jcuda/jcuda CudaException with the driver API name of 209 (no kernel for this GPU in our build)"),
    # --- TLS by cause, other clients -----------------------------------------------------------------------
    ("SSL certificate problem: certificate is not yet valid", "machine",
     "curl/curl#12516 title 'SSL certificate problem: certificate is not yet valid' (a wrong host clock)"),
    ("x509: certificate has expired or is not yet valid: current time 2021-04-26T10:18:22+02:00 is after "
     "2021-04-07T03:12:06Z", "params", "yashbhutwala/kubectl-df-pv#20 (Go crypto/x509, a certificate past notAfter)"),
    ("RuntimeError: invalid peer certificate contents: invalid peer certificate: UnknownIssuer, error sending request "
     "for url (https://params.example.com/v28/manifest.txt): error trying to connect: invalid peer certificate "
     "contents: invalid peer certificate: UnknownIssuer", "image",
     "biliup/biliup-rs#49 (reqwest + rustls without the roots it needs)"),
    ("Get \"https://proofs.filecoin.io/v28.vk\": tls: failed to verify certificate: x509: certificate signed by "
     "unknown authority", "image", "Go crypto/x509 UnknownAuthorityError.Error()"),
    # --- loader ----------------------------------------------------------------------------------------------
    ("./httpjail-0.4.1-linux-x86_64/httpjail: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.32' not found "
     "(required by ./httpjail-0.4.1-linux-x86_64/httpjail)", "image", "coder/httpjail#73"),
    ("./sqlitestudio: /lib/x86_64-linux-gnu/libm.so.6: version 'GLIBC_2.29' not found (required by "
     "/home/mudgen/Desktop/sqlite/SQLiteStudio/lib/libsqlite3.so)", "image",
     "pawelsalawa/letos#4448 (straight quotes)"),
    # --- process deaths ----------------------------------------------------------------------------------------
    ("zsh: illegal hardware instruction  ./cuzk-bench batch -t porep", "image",
     "zsh's job report for SIGILL ('illegal hardware instruction')"),
    ("error: process didn't exit successfully: `target/release/cuzk-bench` (signal: 4, SIGILL: illegal instruction)",
     "image", "cargo's report of a child killed by SIGILL"),
    ("terminate called after throwing an instance of 'std::logic_error'", "image",
     "libstdc++ verbose terminate handler, quoted in a public test file ('std::logic_error' ... Aborted (core "
     "dumped))"),
    ("{1}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 0", "machine",
     "linux drivers/acpi/apei/ghes.c: HW_ERR \"Hardware error from APEI Generic Hardware Error Source: %d\""),
    ("fleet-worker exited with code 137", "configuration",
     "docker compose's '<service> exited with code 137' (SIGKILL, the OOM killer on a rental)"),
    # --- HTTP statuses from the mirror, other clients ---------------------------------------------------------
    ("2026-12-03 06:05:00 ERROR 403: Forbidden.", "configuration", "GNU wget: 'ERROR %d: %s.'"),
    ("urllib.error.HTTPError: HTTP Error 503: Service Unavailable", "params",
     "CPython urllib.error.HTTPError str(): 'HTTP Error %s: %s'"),
    ("Exception: [HttpSkipResponseCommand.cc:215] errorCode=22 The response status is not successful. status=403",
     "configuration", "aria2 src/HttpSkipResponseCommand.cc EX_BAD_STATUS 'The response status is not successful. "
     "status=%d'"),
    ("Exception: [HttpSkipResponseCommand.cc:215] errorCode=22 The response status is not successful. status=429",
     "params", "aria2 EX_BAD_STATUS with a rate-limiting mirror"),
    # --- issue 29: the code tables whole (errnos in every form, aria2c's and curl's codes, signals) ---------------
    ("thread 'peer_connect' panicked at 'clone conn for writer failed: Os { code: 24, kind: Other, message: \"Too "
     "many open files\" }': src/libcore/result.rs:999", "configuration",
     "mimblewimble/grin#3055 (Rust io::Error Debug, EMFILE: the open-file limit)"),
    ('2026-04-28T12:32:58.955800Z  INFO caligula::writer_process: src/writer_process/mod.rs:60: Completed '
     'final_msg=Error(UnknownChildProcError("Input/output error (os error 5)"))', "machine",
     "ifd3f/caligula#230 (Rust io::Error Display, EIO: a loose USB disk)"),
    ("OSError: [Errno 5] Input/output error: '../6-layoutContigs/unitig-popped.layout'", "machine",
     "marbl/verkko#98 (CPython OSError, EIO)"),
    ("  -> [util.cc:1597] errNum=13 errorCode=18 Failed to make the directory D:/PixivDownload/, cause: Permission "
     "denied", "image", "Mapaler/PixivUserBatchDownload#20 (aria2c DIR_CREATE_ERROR with EACCES)"),
    ("  -> [AbstractDiskWriter.cc:224] errNum=30 errorCode=16 Failed to open the file /code/xxxxxxx.zip, cause: "
     "Read-only file system", "unknown", "aria2/aria2#1781 (FILE_CREATE_ERROR with EROFS: by design or a failed disk)"),
    ("curl: (18) transfer closed with 1729112674 bytes remaining to read", "network",
     "fyu/lsun#49 (CURLE_PARTIAL_FILE)"),
    # --- nvidia-smi ----------------------------------------------------------------------------------------------
    ("Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error", "machine",
     "nvidia-smi when the driver lost the GPU (NVIDIA developer forums)"),
]


def test_the_fresh_lines_are_not_the_lines_the_tables_were_written_from() -> None:
    written_from = {line for lines in EXAMPLES.values() for line in lines}
    corpus = "\n".join(p.read_text() for p in TAILS.glob("*.yaml"))
    for line, _, _ in FRESH:
        assert line not in written_from and line not in corpus, line


@pytest.mark.parametrize(("line", "blame", "source"), FRESH, ids=[f[0][:40] for f in FRESH])
def test_a_fresh_real_line_gets_the_right_blame(line: str, blame: str, source: str) -> None:
    match = classify([line])
    assert match is not None, f"not recognised: {line} ({source})"
    assert match.blame == blame, (match.name, line, source)

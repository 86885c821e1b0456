"""CUDA runtime errors, whole: every code of CUDA's `enum cudaError` (driver_types.h) with the blame it carries.

Used by `signatures.py` (decoding `sppark::Error #-N`, `cudaError...` names and the runtime's error strings)
and through it by the verdicts. Pure data.

Sources:
- names and numbers: CUDA 12.x `driver_types.h` `enum cudaError`, as transcribed from NVIDIA's runtime API
  reference (docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html) in sam-caldwell/cudamatrix
  `cudaError.go` at 38bf0615ce06fbf14d242974d6b10ae6ae2260e7 (number and NVIDIA's description of each code);
  the names cross-checked against NVIDIA/cuda-python `cuda_bindings/cuda/bindings/cyruntime.pxd` at
  0d6507faca89284f71d1befc77db4600126a3969 (generated from driver_types.h 12.9-13.3). The five names CUDA 13
  added (cudaErrorVersionTranslation, cudaErrorContained, cudaErrorTensorMemoryLeak, cudaErrorStreamDetached,
  cudaErrorGraphRecaptureFailure) are decoded by name only: no public source at hand gives their numbers.
- sppark reports a code negated (`sppark::Error #-2`, sppark util/exception.cuh) unless built with
  TAKE_RESPONSIBILITY_FOR_ERROR_MESSAGE, then as `<expr>@<file>:<line> failed: "<cudaGetErrorString>"`.
- error strings (`ERROR_TEXT`): only where a public source shows the runtime's exact text (cited per entry).

Blame by what the code says about who failed, for a rented machine running our build:
- machine: the GPU, its driver or the host's CUDA set-up failed: 3 initialization, 46 device busy or
  unavailable, 100 no device, 102 not licensed, 127 startup failure, 214 uncorrectable ECC, 216 device in use
  by another process, 220 uncorrectable NVLink, 702 launch timeout (a display watchdog on the host), 719 launch
  failure, 802 system not ready (driver daemons), 803 system driver mismatch, 805-810 the host's MPS, 999
  unknown. Without a kernel log (most containers) a GPU that fell off the bus shows only as 719 or 999; these
  codes count for the circuit breaker (`breaker.symptom_only`: a machine blame resting only on a CUDA code):
  the same code on distinct machines with one image is the breaker's to judge, not each machine's.
- configuration: 2 (memory allocation: the pool's GPU or host memory is too small for the workload); 35/36
  (the host's driver is older than the CUDA our image is built with: the pool's `min_cuda` admits it).
- image: no kernel or PTX for the GPU (209, 218, 222, 221, 223), kernel faults (700, 710, 714-718), and every
  API-misuse code: our software called CUDA wrongly.
- none: 600 (cudaErrorNotReady), "not actually an error": decoded, never a cause.
"""

from __future__ import annotations

from dataclasses import dataclass

CUDA_ENUM_SOURCE = ("CUDA driver_types.h enum cudaError, via "
                    "sam-caldwell/cudamatrix@38bf0615ce06fbf14d242974d6b10ae6ae2260e7 cudaError.go and "
                    "NVIDIA/cuda-python@0d6507faca89284f71d1befc77db4600126a3969 "
                    "cuda_bindings/cuda/bindings/cyruntime.pxd")

#: enum cudaError (CUDA 12.x): number -> name. cudaSuccess (0) and cudaErrorApiFailureBase (10000) are not errors.
CUDA_ERROR_NAMES: dict[int, str] = {
    1: "cudaErrorInvalidValue", 2: "cudaErrorMemoryAllocation", 3: "cudaErrorInitializationError",
    4: "cudaErrorCudartUnloading", 5: "cudaErrorProfilerDisabled", 6: "cudaErrorProfilerNotInitialized",
    7: "cudaErrorProfilerAlreadyStarted", 8: "cudaErrorProfilerAlreadyStopped", 9: "cudaErrorInvalidConfiguration",
    12: "cudaErrorInvalidPitchValue", 13: "cudaErrorInvalidSymbol", 16: "cudaErrorInvalidHostPointer",
    17: "cudaErrorInvalidDevicePointer", 18: "cudaErrorInvalidTexture", 19: "cudaErrorInvalidTextureBinding",
    20: "cudaErrorInvalidChannelDescriptor", 21: "cudaErrorInvalidMemcpyDirection", 22: "cudaErrorAddressOfConstant",
    23: "cudaErrorTextureFetchFailed", 24: "cudaErrorTextureNotBound", 25: "cudaErrorSynchronizationError",
    26: "cudaErrorInvalidFilterSetting", 27: "cudaErrorInvalidNormSetting", 28: "cudaErrorMixedDeviceExecution",
    31: "cudaErrorNotYetImplemented", 32: "cudaErrorMemoryValueTooLarge", 34: "cudaErrorStubLibrary",
    35: "cudaErrorInsufficientDriver", 36: "cudaErrorCallRequiresNewerDriver", 37: "cudaErrorInvalidSurface",
    43: "cudaErrorDuplicateVariableName", 44: "cudaErrorDuplicateTextureName", 45: "cudaErrorDuplicateSurfaceName",
    46: "cudaErrorDevicesUnavailable", 49: "cudaErrorIncompatibleDriverContext", 52: "cudaErrorMissingConfiguration",
    53: "cudaErrorPriorLaunchFailure", 65: "cudaErrorLaunchMaxDepthExceeded", 66: "cudaErrorLaunchFileScopedTex",
    67: "cudaErrorLaunchFileScopedSurf", 68: "cudaErrorSyncDepthExceeded", 69: "cudaErrorLaunchPendingCountExceeded",
    98: "cudaErrorInvalidDeviceFunction", 100: "cudaErrorNoDevice", 101: "cudaErrorInvalidDevice",
    102: "cudaErrorDeviceNotLicensed", 103: "cudaErrorSoftwareValidityNotEstablished", 127: "cudaErrorStartupFailure",
    200: "cudaErrorInvalidKernelImage", 201: "cudaErrorDeviceUninitialized", 205: "cudaErrorMapBufferObjectFailed",
    206: "cudaErrorUnmapBufferObjectFailed", 207: "cudaErrorArrayIsMapped", 208: "cudaErrorAlreadyMapped",
    209: "cudaErrorNoKernelImageForDevice", 210: "cudaErrorAlreadyAcquired", 211: "cudaErrorNotMapped",
    212: "cudaErrorNotMappedAsArray", 213: "cudaErrorNotMappedAsPointer", 214: "cudaErrorECCUncorrectable",
    215: "cudaErrorUnsupportedLimit", 216: "cudaErrorDeviceAlreadyInUse", 217: "cudaErrorPeerAccessUnsupported",
    218: "cudaErrorInvalidPtx", 219: "cudaErrorInvalidGraphicsContext", 220: "cudaErrorNvlinkUncorrectable",
    221: "cudaErrorJitCompilerNotFound", 222: "cudaErrorUnsupportedPtxVersion", 223: "cudaErrorJitCompilationDisabled",
    224: "cudaErrorUnsupportedExecAffinity", 225: "cudaErrorUnsupportedDevSideSync", 300: "cudaErrorInvalidSource",
    301: "cudaErrorFileNotFound", 302: "cudaErrorSharedObjectSymbolNotFound", 303: "cudaErrorSharedObjectInitFailed",
    304: "cudaErrorOperatingSystem", 400: "cudaErrorInvalidResourceHandle", 401: "cudaErrorIllegalState",
    402: "cudaErrorLossyQuery", 500: "cudaErrorSymbolNotFound", 600: "cudaErrorNotReady",
    700: "cudaErrorIllegalAddress", 701: "cudaErrorLaunchOutOfResources", 702: "cudaErrorLaunchTimeout",
    703: "cudaErrorLaunchIncompatibleTexturing", 704: "cudaErrorPeerAccessAlreadyEnabled",
    705: "cudaErrorPeerAccessNotEnabled", 708: "cudaErrorSetOnActiveProcess", 709: "cudaErrorContextIsDestroyed",
    710: "cudaErrorAssert", 711: "cudaErrorTooManyPeers", 712: "cudaErrorHostMemoryAlreadyRegistered",
    713: "cudaErrorHostMemoryNotRegistered", 714: "cudaErrorHardwareStackError", 715: "cudaErrorIllegalInstruction",
    716: "cudaErrorMisalignedAddress", 717: "cudaErrorInvalidAddressSpace", 718: "cudaErrorInvalidPc",
    719: "cudaErrorLaunchFailure", 720: "cudaErrorCooperativeLaunchTooLarge", 800: "cudaErrorNotPermitted",
    801: "cudaErrorNotSupported", 802: "cudaErrorSystemNotReady", 803: "cudaErrorSystemDriverMismatch",
    804: "cudaErrorCompatNotSupportedOnDevice", 805: "cudaErrorMpsConnectionFailed", 806: "cudaErrorMpsRpcFailure",
    807: "cudaErrorMpsServerNotReady", 808: "cudaErrorMpsMaxClientsReached", 809: "cudaErrorMpsMaxConnectionsReached",
    810: "cudaErrorMpsClientTerminated", 811: "cudaErrorCdpNotSupported", 812: "cudaErrorCdpVersionMismatch",
    900: "cudaErrorStreamCaptureUnsupported", 901: "cudaErrorStreamCaptureInvalidated",
    902: "cudaErrorStreamCaptureMerge", 903: "cudaErrorStreamCaptureUnmatched", 904: "cudaErrorStreamCaptureUnjoined",
    905: "cudaErrorStreamCaptureIsolation", 906: "cudaErrorStreamCaptureImplicit", 907: "cudaErrorCapturedEvent",
    908: "cudaErrorStreamCaptureWrongThread", 909: "cudaErrorTimeout", 910: "cudaErrorGraphExecUpdateFailure",
    911: "cudaErrorExternalDevice", 912: "cudaErrorInvalidClusterSize", 913: "cudaErrorFunctionNotLoaded",
    914: "cudaErrorInvalidResourceType", 915: "cudaErrorInvalidResourceConfiguration", 999: "cudaErrorUnknown",
}

#: The driver API's CUresult names (cuda.h) as driver-API callers print them (`DriverError(CUDA_ERROR_...)`):
#: jcuda/jcuda JCudaJava/src/main/java/jcuda/driver/CUresult.java at 06732764a5329fa952791c81d2c89bde5a93d38e
#: ("comments taken from the CUDA reference manual"). Since CUDA 10.1 the runtime's numbers follow the
#: driver's, so a driver code has the blame of the runtime code with its number (`DRIVER_BLAME` overrides the
#: few whose meaning differs).
DRIVER_ERROR_NAMES: dict[int, str] = {
    1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY", 3: "CUDA_ERROR_NOT_INITIALIZED",
    4: "CUDA_ERROR_DEINITIALIZED", 5: "CUDA_ERROR_PROFILER_DISABLED", 6: "CUDA_ERROR_PROFILER_NOT_INITIALIZED",
    7: "CUDA_ERROR_PROFILER_ALREADY_STARTED", 8: "CUDA_ERROR_PROFILER_ALREADY_STOPPED", 100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE", 200: "CUDA_ERROR_INVALID_IMAGE", 201: "CUDA_ERROR_INVALID_CONTEXT",
    202: "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", 205: "CUDA_ERROR_MAP_FAILED", 206: "CUDA_ERROR_UNMAP_FAILED",
    207: "CUDA_ERROR_ARRAY_IS_MAPPED", 208: "CUDA_ERROR_ALREADY_MAPPED", 209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
    210: "CUDA_ERROR_ALREADY_ACQUIRED", 211: "CUDA_ERROR_NOT_MAPPED", 212: "CUDA_ERROR_NOT_MAPPED_AS_ARRAY",
    213: "CUDA_ERROR_NOT_MAPPED_AS_POINTER", 214: "CUDA_ERROR_ECC_UNCORRECTABLE", 215: "CUDA_ERROR_UNSUPPORTED_LIMIT",
    216: "CUDA_ERROR_CONTEXT_ALREADY_IN_USE", 217: "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
    218: "CUDA_ERROR_INVALID_PTX", 219: "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT", 220: "CUDA_ERROR_NVLINK_UNCORRECTABLE",
    300: "CUDA_ERROR_INVALID_SOURCE",
    301: "CUDA_ERROR_FILE_NOT_FOUND", 302: "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND",
    303: "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED", 304: "CUDA_ERROR_OPERATING_SYSTEM", 400: "CUDA_ERROR_INVALID_HANDLE",
    500: "CUDA_ERROR_NOT_FOUND", 600: "CUDA_ERROR_NOT_READY", 700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", 702: "CUDA_ERROR_LAUNCH_TIMEOUT",
    703: "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING", 704: "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
    705: "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", 706: "CUDA_ERROR_PEER_MEMORY_ALREADY_REGISTERED",
    707: "CUDA_ERROR_PEER_MEMORY_NOT_REGISTERED", 708: "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
    709: "CUDA_ERROR_CONTEXT_IS_DESTROYED", 710: "CUDA_ERROR_ASSERT", 711: "CUDA_ERROR_TOO_MANY_PEERS",
    712: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", 713: "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
    714: "CUDA_ERROR_HARDWARE_STACK_ERROR", 715: "CUDA_ERROR_ILLEGAL_INSTRUCTION", 716: "CUDA_ERROR_MISALIGNED_ADDRESS",
    717: "CUDA_ERROR_INVALID_ADDRESS_SPACE", 718: "CUDA_ERROR_INVALID_PC", 719: "CUDA_ERROR_LAUNCH_FAILED",
    800: "CUDA_ERROR_NOT_PERMITTED", 801: "CUDA_ERROR_NOT_SUPPORTED", 999: "CUDA_ERROR_UNKNOWN",
}
#: Driver codes whose meaning differs from the runtime code of the same number (216: a context bound to another
#: thread is our software, the runtime's 216 is a device held by another process).
DRIVER_BLAME: dict[int, str] = {216: "image"}

#: Names CUDA 13 added whose numbers no source at hand gives (decoded by name: software errors, image).
CUDA_13_NAMES = ("cudaErrorVersionTranslation", "cudaErrorContained", "cudaErrorTensorMemoryLeak",
                 "cudaErrorStreamDetached", "cudaErrorGraphRecaptureFailure")

#: "This result is not actually an error" (NVIDIA's description of cudaErrorNotReady): a query's answer that
#: healthy code logs too; decoded, never a cause.
NOT_AN_ERROR = frozenset({600})
MACHINE_CODES = frozenset({3, 46, 100, 102, 127, 214, 216, 220, 702, 719, 802, 803, 805, 806, 807, 808, 809, 810, 999})
#: 2: the pool's GPU or host memory is too small; 35/36: the pool admits hosts whose driver is older than
#: the CUDA our image is built with (`pools[].min_cuda`).
CONFIGURATION_CODES = frozenset({2, 35, 36})

#: cudaGetErrorString texts, where a public source shows them verbatim.
ERROR_TEXT: dict[int, str] = {
    # sppark util/exception.cuh prints cudaGetErrorString; texts as in the curio e0294b0f tails of
    # tests/fixtures/tails/ and CUDA's runtime (kept from the first table).
    2: "out of memory",
    3: "initialization error",
    35: "CUDA driver version is insufficient for CUDA runtime version",
    46: "CUDA-capable device(s) is/are busy or unavailable",
    100: "no CUDA-capable device is detected",
    209: "no kernel image is available for execution on the device",
    214: "uncorrectable ECC error encountered",
    222: "the provided PTX was compiled with an unsupported toolchain.",
    700: "an illegal memory access was encountered",
    # compute-sanitizer on an A100, quoted in public CUDA debugging notes: 'Program hit cudaErrorLaunchFailure
    # (error 719) due to "unspecified launch failure" on CUDA API call to cudaDeviceSynchronize.'
    719: "unspecified launch failure",
    # pytorch/pytorch#11989 'RuntimeError: CUDA error: unknown error' (PyTorch prints cudaGetErrorString).
    999: "unknown error",
    # PyTorch's `RuntimeError: CUDA error: device-side assert triggered` (the runtime's text for 710).
    710: "device-side assert triggered",
    # the runtime's text for 715 as GPU miners log it (public miner-watchdog configs list it verbatim).
    715: "an illegal instruction was encountered",
}


@dataclass(frozen=True)
class CudaError:
    code: int
    name: str
    blame: str
    text: str | None

    def meaning(self) -> str:
        return f"{self.name} ({self.code}){': ' + self.text if self.text else ''}"


def _blame(code: int) -> str:
    if code in NOT_AN_ERROR:
        return "none"
    if code in MACHINE_CODES:
        return "machine"
    if code in CONFIGURATION_CODES:
        return "configuration"
    return "image"


CUDA_ERRORS: dict[int, CudaError] = {code: CudaError(code, name, _blame(code), ERROR_TEXT.get(code))
                                     for code, name in CUDA_ERROR_NAMES.items()}
BY_NAME: dict[str, CudaError] = {e.name: e for e in CUDA_ERRORS.values()}


def codes_with_blame(blame: str) -> tuple[int, ...]:
    return tuple(code for code, err in CUDA_ERRORS.items() if err.blame == blame)


def driver_blame(code: int) -> str:
    """The blame of a driver API code (CUresult): the runtime code's with the same number, unless overridden."""
    return DRIVER_BLAME.get(code) or _blame(code)


def driver_codes_with_blame(blame: str) -> tuple[int, ...]:
    return tuple(code for code in DRIVER_ERROR_NAMES if driver_blame(code) == blame)


DRIVER_BY_NAME: dict[str, int] = {name: code for code, name in DRIVER_ERROR_NAMES.items()}

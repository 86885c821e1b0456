"""Every Linux errno, whole: its number and name, the text glibc gives it (what Rust's `io::Error`, Python's
`OSError`, bash, coreutils and Go print) and the blame it carries for a failure on a rented machine. Pure data;
`signatures.py` decodes every form of it (`<text> (os error N)`, `Os { code: N, .. }`, `[Errno N]`, the name, the
text) into the signature its entry names.

Sources:
- numbers and names: torvalds/linux `include/uapi/asm-generic/errno-base.h` (1-34) at
  ef8c029fa793423439e67ef0416b220d3fa3321a and `include/uapi/asm-generic/errno.h` (35-133) at
  01b944fe1cd4e21a2a9ed51adbdbafe2d5e905ba (x86 and arm64 use these; 41 and 58 are unassigned, EWOULDBLOCK and
  EDEADLOCK are aliases of 11 and 35);
- texts: glibc's `strerror`, bminor/glibc `sysdeps/gnu/errlist.h` at 04e750e75b73957cf1c791535a3f4319534a52fc
  (`_S(ENOENT, N_("No such file or directory"))`; a few differ from the kernel's comments: 35 "Resource deadlock
  avoided", 84 "Invalid or incomplete multibyte or wide character", 122 "Disk quota exceeded");
- Rust's form: rust-lang/rust `library/std/src/io/error.rs` at 86d6d2b7389fe1b339402c1798edae8b695fc9ef:
  `Display` writes `"{} (os error {})"` with `sys::os::error_string(code)` (strerror_r: the glibc text above),
  `Debug` writes `Os { code: N, kind: K, message: "<text>" }` (what `unwrap()` on an io::Error panics with).

Blame by who can fix it: the host's storage, devices or hardware (EIO, EUCLEAN, EHWPOISON, ...) are the machine;
a full disk, memory or a container limit is configuration (a pool setting); the network errnos are the network
(against our own daemon on 127.0.0.1 they are a symptom of the daemon, not the network: signatures.py looks at the
line); a call the kernel refused for its arguments or our own state (EINVAL, EBADF, ENOENT, EADDRINUSE, ...) is
our software; errnos that more than one owner raises (EAGAIN, EBUSY, EPIPE, EROFS, ...) and those Linux keeps only
for STREAMS, XENIX or RFS are unknown: recognised and shown, but the other lines, or the fleet, decide.
"""

from __future__ import annotations

from reconciler.domain.codes import Code, by_number

ERRNO_SOURCE = ("torvalds/linux@ef8c029fa793423439e67ef0416b220d3fa3321a include/uapi/asm-generic/errno-base.h, "
                "torvalds/linux@01b944fe1cd4e21a2a9ed51adbdbafe2d5e905ba include/uapi/asm-generic/errno.h, "
                "bminor/glibc@04e750e75b73957cf1c791535a3f4319534a52fc sysdeps/gnu/errlist.h, "
                "rust-lang/rust@86d6d2b7389fe1b339402c1798edae8b695fc9ef library/std/src/io/error.rs")

WHY_DISK = "the instance disk is full (pools[].disk_gb): neither the machine's fault nor our software's"
WHY_MEMORY = "memory is exhausted: the pool admits machines too small for the workload (pools[].min_host_ram_gb)"
WHY_HWPOISON = "the kernel retired a page of host RAM with a hardware error: the machine's memory"
WHY_HOST = ("the host's kernel reports its storage, a device or a system-wide table failing (an I/O error, a file "
            "system that needs fsck, a stale mount, a device gone): only the machine's owner can fix it")
WHY_PERMISSION = ("our software touched a file or made a call its container does not allow (file modes, seccomp, "
                  "capabilities): the image or how we run it")
WHY_EXEC = "a binary in the image is not in a format this machine runs: our build"
WHY_LIMIT = ("a per-process limit of the container was reached (open files, file size): raise it where the worker "
             "starts (ulimit) or in the container's run options")
WHY_RESET = "the remote end or the path to it dropped the connection: the machine's network while fetching"
WHY_TIMEOUT = "no answer in time over the machine's network"
WHY_UNREACH = "the machine has no working route or address to the server: its network"
WHY_REFUSED = ("a remote server refused the connection (against our own daemon on 127.0.0.1 it is a symptom of "
               "the daemon: daemon-connection-refused)")
WHY_SOFTWARE = ("the kernel refused a call of our software for its arguments or its own state (a missing file it "
                "expected, a bad descriptor, an address already in use, an unsupported operation): our software")
WHY_AMBIGUOUS = ("raised for more than one owner (a busy device or a busy mount, a read-only file system after "
                 "disk errors or by design, a peer that went away, a resource briefly short): the other lines, or "
                 "the fleet, decide")
WHY_OBSOLETE = ("Linux keeps it for STREAMS, XENIX, RFS or as a kernel-internal code; no call our software makes "
                "returns it: recognised, but it names nobody")

ERRNO_CODES: tuple[Code, ...] = (
    Code(1, "EPERM", "Operation not permitted", "image", "permission-denied", WHY_PERMISSION),
    Code(2, "ENOENT", "No such file or directory", "image", "software-os-error", WHY_SOFTWARE),
    Code(3, "ESRCH", "No such process", "image", "software-os-error", WHY_SOFTWARE),
    Code(4, "EINTR", "Interrupted system call", "unknown", "os-error-ambiguous", WHY_AMBIGUOUS),
    Code(5, "EIO", "Input/output error", "machine", "host-os-error", WHY_HOST),
    Code(6, "ENXIO", "No such device or address", "unknown", "os-error-ambiguous", WHY_AMBIGUOUS),
    Code(7, "E2BIG", "Argument list too long", "image", "software-os-error", WHY_SOFTWARE),
    Code(8, "ENOEXEC", "Exec format error", "image", "exec-format-error", WHY_EXEC),
    Code(9, "EBADF", "Bad file descriptor", "image", "software-os-error", WHY_SOFTWARE),
    Code(10, "ECHILD", "No child processes", "image", "software-os-error", WHY_SOFTWARE),
    Code(11, "EAGAIN", "Resource temporarily unavailable", "unknown", "os-error-ambiguous", WHY_AMBIGUOUS),
    Code(12, "ENOMEM", "Cannot allocate memory", "configuration", "host-out-of-memory", WHY_MEMORY),
    Code(13, "EACCES", "Permission denied", "image", "permission-denied", WHY_PERMISSION),
    Code(14, "EFAULT", "Bad address", "image", "software-os-error", WHY_SOFTWARE),
    Code(15, "ENOTBLK", "Block device required", "image", "software-os-error", WHY_SOFTWARE),
    Code(16, "EBUSY", "Device or resource busy", "unknown", "os-error-ambiguous", WHY_AMBIGUOUS),
    Code(17, "EEXIST", "File exists", "image", "software-os-error", WHY_SOFTWARE),
    Code(18, "EXDEV", "Invalid cross-device link", "image", "software-os-error", WHY_SOFTWARE),
    Code(19, "ENODEV", "No such device", "machine", "host-os-error", WHY_HOST),
    Code(20, "ENOTDIR", "Not a directory", "image", "software-os-error", WHY_SOFTWARE),
    Code(21, "EISDIR", "Is a directory", "image", "software-os-error", WHY_SOFTWARE),
    Code(22, "EINVAL", "Invalid argument", "image", "software-os-error", WHY_SOFTWARE),
    Code(23, "ENFILE", "Too many open files in system", "machine", "host-os-error", WHY_HOST),
    Code(24, "EMFILE", "Too many open files", "configuration", "container-limit", WHY_LIMIT),
    Code(25, "ENOTTY", "Inappropriate ioctl for device", "image", "software-os-error", WHY_SOFTWARE),
    Code(26, "ETXTBSY", "Text file busy", "image", "software-os-error", WHY_SOFTWARE),
    Code(27, "EFBIG", "File too large", "configuration", "container-limit", WHY_LIMIT),
    Code(28, "ENOSPC", "No space left on device", "configuration", "disk-full", WHY_DISK),
    Code(29, "ESPIPE", "Illegal seek", "image", "software-os-error", WHY_SOFTWARE),
    Code(30, "EROFS", "Read-only file system", "unknown", "os-error-ambiguous", WHY_AMBIGUOUS),
    Code(31, "EMLINK", "Too many links", "image", "software-os-error", WHY_SOFTWARE),
    Code(32, "EPIPE", "Broken pipe", "unknown", "os-error-ambiguous", WHY_AMBIGUOUS),
    Code(33, "EDOM", "Numerical argument out of domain", "image", "software-os-error", WHY_SOFTWARE),
    Code(34, "ERANGE", "Numerical result out of range", "image", "software-os-error", WHY_SOFTWARE),
    Code(35, "EDEADLK", "Resource deadlock avoided", "image", "software-os-error", WHY_SOFTWARE),
    Code(36, "ENAMETOOLONG", "File name too long", "image", "software-os-error", WHY_SOFTWARE),
    Code(37, "ENOLCK", "No locks available", "unknown", "os-error-ambiguous", WHY_AMBIGUOUS),
    Code(38, "ENOSYS", "Function not implemented", "image", "software-os-error", WHY_SOFTWARE),
    Code(39, "ENOTEMPTY", "Directory not empty", "image", "software-os-error", WHY_SOFTWARE),
    Code(40, "ELOOP", "Too many levels of symbolic links", "image", "software-os-error", WHY_SOFTWARE),
    Code(42, "ENOMSG", "No message of desired type", "image", "software-os-error", WHY_SOFTWARE),
    Code(43, "EIDRM", "Identifier removed", "image", "software-os-error", WHY_SOFTWARE),
    Code(44, "ECHRNG", "Channel number out of range", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(45, "EL2NSYNC", "Level 2 not synchronized", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(46, "EL3HLT", "Level 3 halted", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(47, "EL3RST", "Level 3 reset", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(48, "ELNRNG", "Link number out of range", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(49, "EUNATCH", "Protocol driver not attached", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(50, "ENOCSI", "No CSI structure available", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(51, "EL2HLT", "Level 2 halted", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(52, "EBADE", "Invalid exchange", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(53, "EBADR", "Invalid request descriptor", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(54, "EXFULL", "Exchange full", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(55, "ENOANO", "No anode", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(56, "EBADRQC", "Invalid request code", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(57, "EBADSLT", "Invalid slot", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(59, "EBFONT", "Bad font file format", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(60, "ENOSTR", "Device not a stream", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(61, "ENODATA", "No data available", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(62, "ETIME", "Timer expired", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(63, "ENOSR", "Out of streams resources", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(64, "ENONET", "Machine is not on the network", "network", "network-unreachable", WHY_UNREACH),
    Code(65, "ENOPKG", "Package not installed", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(66, "EREMOTE", "Object is remote", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(67, "ENOLINK", "Link has been severed", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(68, "EADV", "Advertise error", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(69, "ESRMNT", "Srmount error", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(70, "ECOMM", "Communication error on send", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(71, "EPROTO", "Protocol error", "unknown", "os-error-ambiguous", WHY_AMBIGUOUS),
    Code(72, "EMULTIHOP", "Multihop attempted", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(73, "EDOTDOT", "RFS specific error", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(74, "EBADMSG", "Bad message", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(75, "EOVERFLOW", "Value too large for defined data type", "image", "software-os-error", WHY_SOFTWARE),
    Code(76, "ENOTUNIQ", "Name not unique on network", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(77, "EBADFD", "File descriptor in bad state", "image", "software-os-error", WHY_SOFTWARE),
    Code(78, "EREMCHG", "Remote address changed", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(79, "ELIBACC", "Can not access a needed shared library", "image", "software-os-error", WHY_SOFTWARE),
    Code(80, "ELIBBAD", "Accessing a corrupted shared library", "image", "software-os-error", WHY_SOFTWARE),
    Code(81, "ELIBSCN", ".lib section in a.out corrupted", "image", "software-os-error", WHY_SOFTWARE),
    Code(82, "ELIBMAX", "Attempting to link in too many shared libraries", "image", "software-os-error", WHY_SOFTWARE),
    Code(83, "ELIBEXEC", "Cannot exec a shared library directly", "image", "software-os-error", WHY_SOFTWARE),
    Code(84, "EILSEQ", "Invalid or incomplete multibyte or wide character", "image", "software-os-error", WHY_SOFTWARE),
    Code(85, "ERESTART", "Interrupted system call should be restarted", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(86, "ESTRPIPE", "Streams pipe error", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(87, "EUSERS", "Too many users", "unknown", "os-error-ambiguous", WHY_AMBIGUOUS),
    Code(88, "ENOTSOCK", "Socket operation on non-socket", "image", "software-os-error", WHY_SOFTWARE),
    Code(89, "EDESTADDRREQ", "Destination address required", "image", "software-os-error", WHY_SOFTWARE),
    Code(90, "EMSGSIZE", "Message too long", "image", "software-os-error", WHY_SOFTWARE),
    Code(91, "EPROTOTYPE", "Protocol wrong type for socket", "image", "software-os-error", WHY_SOFTWARE),
    Code(92, "ENOPROTOOPT", "Protocol not available", "image", "software-os-error", WHY_SOFTWARE),
    Code(93, "EPROTONOSUPPORT", "Protocol not supported", "image", "software-os-error", WHY_SOFTWARE),
    Code(94, "ESOCKTNOSUPPORT", "Socket type not supported", "image", "software-os-error", WHY_SOFTWARE),
    Code(95, "EOPNOTSUPP", "Operation not supported", "image", "software-os-error", WHY_SOFTWARE),
    Code(96, "EPFNOSUPPORT", "Protocol family not supported", "image", "software-os-error", WHY_SOFTWARE),
    Code(97, "EAFNOSUPPORT", "Address family not supported by protocol", "image", "software-os-error", WHY_SOFTWARE),
    Code(98, "EADDRINUSE", "Address already in use", "image", "software-os-error", WHY_SOFTWARE),
    Code(99, "EADDRNOTAVAIL", "Cannot assign requested address", "network", "network-unreachable", WHY_UNREACH),
    Code(100, "ENETDOWN", "Network is down", "network", "network-unreachable", WHY_UNREACH),
    Code(101, "ENETUNREACH", "Network is unreachable", "network", "network-unreachable", WHY_UNREACH),
    Code(102, "ENETRESET", "Network dropped connection on reset", "network", "connection-reset", WHY_RESET),
    Code(103, "ECONNABORTED", "Software caused connection abort", "network", "connection-reset", WHY_RESET),
    Code(104, "ECONNRESET", "Connection reset by peer", "network", "connection-reset", WHY_RESET),
    Code(105, "ENOBUFS", "No buffer space available", "unknown", "os-error-ambiguous", WHY_AMBIGUOUS),
    Code(106, "EISCONN", "Transport endpoint is already connected", "image", "software-os-error", WHY_SOFTWARE),
    Code(107, "ENOTCONN", "Transport endpoint is not connected", "unknown", "os-error-ambiguous", WHY_AMBIGUOUS),
    Code(108, "ESHUTDOWN", "Cannot send after transport endpoint shutdown", "unknown", "os-error-ambiguous",
         WHY_AMBIGUOUS),
    Code(109, "ETOOMANYREFS", "Too many references: cannot splice", "image", "software-os-error", WHY_SOFTWARE),
    Code(110, "ETIMEDOUT", "Connection timed out", "network", "network-timeout", WHY_TIMEOUT),
    Code(111, "ECONNREFUSED", "Connection refused", "network", "connection-failed", WHY_REFUSED),
    Code(112, "EHOSTDOWN", "Host is down", "network", "network-unreachable", WHY_UNREACH),
    Code(113, "EHOSTUNREACH", "No route to host", "network", "network-unreachable", WHY_UNREACH),
    Code(114, "EALREADY", "Operation already in progress", "image", "software-os-error", WHY_SOFTWARE),
    Code(115, "EINPROGRESS", "Operation now in progress", "image", "software-os-error", WHY_SOFTWARE),
    Code(116, "ESTALE", "Stale file handle", "machine", "host-os-error", WHY_HOST),
    Code(117, "EUCLEAN", "Structure needs cleaning", "machine", "host-os-error", WHY_HOST),
    Code(118, "ENOTNAM", "Not a XENIX named type file", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(119, "ENAVAIL", "No XENIX semaphores available", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(120, "EISNAM", "Is a named type file", "unknown", "os-error-ambiguous", WHY_OBSOLETE),
    Code(121, "EREMOTEIO", "Remote I/O error", "machine", "host-os-error", WHY_HOST),
    Code(122, "EDQUOT", "Disk quota exceeded", "configuration", "disk-full", WHY_DISK),
    Code(123, "ENOMEDIUM", "No medium found", "machine", "host-os-error", WHY_HOST),
    Code(124, "EMEDIUMTYPE", "Wrong medium type", "machine", "host-os-error", WHY_HOST),
    Code(125, "ECANCELED", "Operation canceled", "image", "software-os-error", WHY_SOFTWARE),
    Code(126, "ENOKEY", "Required key not available", "unknown", "os-error-ambiguous", WHY_AMBIGUOUS),
    Code(127, "EKEYEXPIRED", "Key has expired", "unknown", "os-error-ambiguous", WHY_AMBIGUOUS),
    Code(128, "EKEYREVOKED", "Key has been revoked", "unknown", "os-error-ambiguous", WHY_AMBIGUOUS),
    Code(129, "EKEYREJECTED", "Key was rejected by service", "unknown", "os-error-ambiguous", WHY_AMBIGUOUS),
    Code(130, "EOWNERDEAD", "Owner died", "image", "software-os-error", WHY_SOFTWARE),
    Code(131, "ENOTRECOVERABLE", "State not recoverable", "image", "software-os-error", WHY_SOFTWARE),
    Code(132, "ERFKILL", "Operation not possible due to RF-kill", "unknown", "os-error-ambiguous", WHY_AMBIGUOUS),
    Code(133, "EHWPOISON", "Memory page has hardware error", "machine", "host-memory-hardware-error", WHY_HWPOISON),
)

ERRNO: dict[int, Code] = by_number(ERRNO_CODES)

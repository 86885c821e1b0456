"""curl's exit codes, whole: every CURLcode with the text curl gives it and the blame it carries for our params
fetch. Pure data; `signatures.py` builds the curl signatures from it.

Sources (curl/curl at 5c61e168698a72b87437d58ed728bcdea6d5db42): numbers and names from `include/curl/curl.h`
(`typedef enum { CURLE_OK = 0, ... } CURLcode`, each number as its comment gives it), texts from `lib/strerror.c`
`curl_easy_strerror()`. The curl tool exits with the CURLcode and prints `curl: (N) <message>`, the message being
the transfer's error buffer when set (more specific: `Failed to connect to host port 443 after 2 ms: Connection
refused`, `The requested URL returned error: 404`) else the strerror text; where the buffer names an errno or an
HTTP status, that decides (errnos.py, the mirror-status signatures).

Blame for the worker's fetch (`curl -fsS -C - -o <file> <mirror URL>`, worker-image/fetch-params.sh): the mirror's
answers are `params` (or `configuration` when it refuses us: params.base_url and its credentials), the machine's
network is `network`, our command line, libcurl API misuse and protocols we never use (uploads, TFTP, LDAP, RTSP,
SSH, local certificates) are `image`. The codes curl.h marks "NOT USED" / obsolete are kept for wholeness: curl no
longer returns them, so they blame nobody (`unknown`).
"""

from __future__ import annotations

from reconciler.domain.codes import Code, by_number

CURL_SOURCE = "curl/curl@5c61e168698a72b87437d58ed728bcdea6d5db42 include/curl/curl.h, lib/strerror.c"

_OURS = "our fetch script's curl command line, a libcurl call or a protocol it never uses: our software"
_MIRROR = "the params mirror's answer: fixed in params.base_url or at the mirror, not on the machine"
_NET = "the machine's network between it and the mirror"
_OBSOLETE = "curl.h marks it NOT USED / obsolete: current curl never returns it"


# The three blames most codes carry, each written once (`detail`: what the code adds to it).
def _ours(number: int, name: str, text: str, detail: str = "") -> Code:
    return Code(number, name, text, "image", "downloader-usage-error", f"{_OURS}: {detail}" if detail else _OURS)


def _ftp(number: int, name: str, text: str) -> Code:
    return Code(number, name, text, "params", "params-mirror-bad-response", f"{_MIRROR} (FTP)")


def _net(number: int, name: str, text: str, detail: str = "") -> Code:
    return Code(number, name, text, "network", "download-failed-network", f"{_NET}: {detail}" if detail else _NET)


def _obsolete(number: int) -> Code:
    return Code(number, f"CURLE_OBSOLETE{number}", "Unknown error", "unknown", "download-failed-generic",
                _OBSOLETE, generic=True)


CURL_CODES: tuple[Code, ...] = (
    Code(0, "CURLE_OK", "No error", "none", None, "not a failure"),
    Code(1, "CURLE_UNSUPPORTED_PROTOCOL", "Unsupported protocol", "configuration", "params-url-malformed",
         "params.base_url names a scheme this curl does not speak"),
    _ours(2, "CURLE_FAILED_INIT", "Failed initialization"),
    Code(3, "CURLE_URL_MALFORMAT", "URL using bad/illegal format or missing URL", "configuration",
         "params-url-malformed", "params.base_url is not a valid URL"),
    _ours(4, "CURLE_NOT_BUILT_IN", "A requested feature, protocol or option was not found built-in in this libcurl "
          "due to a build-time decision.", "the image's curl lacks it"),
    Code(5, "CURLE_COULDNT_RESOLVE_PROXY", "Could not resolve proxy name", "network", "dns-failure",
         f"{_NET}: its resolver or its proxy setting"),
    Code(6, "CURLE_COULDNT_RESOLVE_HOST", "Could not resolve hostname", "network", "dns-failure",
         "the machine's resolver could not resolve the mirror"),
    Code(7, "CURLE_COULDNT_CONNECT", "Could not connect to server", "network", "connection-failed", _NET),
    Code(8, "CURLE_WEIRD_SERVER_REPLY", "Weird server reply", "params", "params-mirror-bad-response", _MIRROR),
    Code(9, "CURLE_REMOTE_ACCESS_DENIED", "Access denied to remote resource", "configuration",
         "params-mirror-denied", "the mirror refused us: params.base_url or its credentials"),
    _ftp(10, "CURLE_FTP_ACCEPT_FAILED", "FTP: The server failed to connect to data port"),
    _ftp(11, "CURLE_FTP_WEIRD_PASS_REPLY", "FTP: unknown PASS reply"),
    _ftp(12, "CURLE_FTP_ACCEPT_TIMEOUT", "FTP: Accepting server connect has timed out"),
    _ftp(13, "CURLE_FTP_WEIRD_PASV_REPLY", "FTP: unknown PASV reply"),
    _ftp(14, "CURLE_FTP_WEIRD_227_FORMAT", "FTP: unknown 227 response format"),
    _ftp(15, "CURLE_FTP_CANT_GET_HOST", "FTP: cannot figure out the host in the PASV response"),
    _net(16, "CURLE_HTTP2", "Error in the HTTP2 framing layer", "the HTTP/2 connection broke"),
    _ftp(17, "CURLE_FTP_COULDNT_SET_TYPE", "FTP: could not set file type"),
    _net(18, "CURLE_PARTIAL_FILE", "Transferred a partial file", "the transfer ended before the file did"),
    Code(19, "CURLE_FTP_COULDNT_RETR_FILE", "FTP: could not retrieve (RETR failed) the specified file", "params",
         "params-not-found", f"{_MIRROR} (FTP): it lacks the file"),
    _obsolete(20),
    _ours(21, "CURLE_QUOTE_ERROR", "Quote command returned error"),
    Code(22, "CURLE_HTTP_RETURNED_ERROR", "HTTP response code said error", "params", "params-mirror-http-error",
         f"{_MIRROR}: with -f curl fails on any HTTP status >= 400; the status it prints decides (404 not found, "
         "401/403 refused, 429/5xx unavailable)", prints=("The requested URL returned error: %d",)),
    Code(23, "CURLE_WRITE_ERROR", "Failed writing received data to disk/application", "configuration", "disk-full",
         "curl writes into a file the worker created in a directory it created, so only the disk refuses it: the "
         "instance disk is full (pools[].disk_gb); a failing disk logs the kernel's I/O error, which outranks this",
         prints=("Failure writing output to destination, passed %zu returned %zu",)),
    _obsolete(24),
    _ours(25, "CURLE_UPLOAD_FAILED", "Upload failed (at start/before it took off)", "the worker never uploads"),
    _ours(26, "CURLE_READ_ERROR", "Failed to open/read local data from file/application"),
    Code(27, "CURLE_OUT_OF_MEMORY", "Out of memory", "configuration", "host-out-of-memory",
         "the container's memory is exhausted (pools[].min_host_ram_gb)"),
    Code(28, "CURLE_OPERATION_TIMEDOUT", "Timeout was reached", "network", "network-timeout",
         f"{_NET}: no answer in time", prints=("%s timed out after %d milliseconds",
                                               "Operation timed out after %d milliseconds with %d bytes received")),
    _obsolete(29),
    _ftp(30, "CURLE_FTP_PORT_FAILED", "FTP: command PORT failed"),
    Code(31, "CURLE_FTP_COULDNT_USE_REST", "FTP: command REST failed", "params", "params-mirror-unsupported",
         f"{_MIRROR} (FTP): it cannot resume"),
    _obsolete(32),
    Code(33, "CURLE_RANGE_ERROR", "Requested range was not delivered by the server", "params",
         "params-mirror-unsupported", f"{_MIRROR}: our fetch resumes (-C -), the mirror must serve byte ranges"),
    _obsolete(34),
    _net(35, "CURLE_SSL_CONNECT_ERROR", "SSL connect error",
         "the TLS handshake broke off (a certificate problem has its own code, 60)"),
    Code(36, "CURLE_BAD_DOWNLOAD_RESUME", "Could not resume download", "params", "params-mirror-unsupported",
         f"{_MIRROR}: our fetch resumes (-C -)"),
    Code(37, "CURLE_FILE_COULDNT_READ_FILE", "Could not read a file:// file", "configuration",
         "params-url-malformed", "params.base_url names a file:// path the container does not have"),
    _ours(38, "CURLE_LDAP_CANNOT_BIND", "LDAP: cannot bind"),
    _ours(39, "CURLE_LDAP_SEARCH_FAILED", "LDAP: search failed"),
    _obsolete(40),
    _obsolete(41),
    _ours(42, "CURLE_ABORTED_BY_CALLBACK", "Operation was aborted by an application callback"),
    _ours(43, "CURLE_BAD_FUNCTION_ARGUMENT", "A libcurl function was given a bad argument"),
    _obsolete(44),
    _ours(45, "CURLE_INTERFACE_FAILED", "Failed binding local connection end", "--interface"),
    _obsolete(46),
    Code(47, "CURLE_TOO_MANY_REDIRECTS", "Number of redirects hit maximum amount", "params",
         "params-mirror-bad-response", f"{_MIRROR}: it redirects in a loop"),
    _ours(48, "CURLE_UNKNOWN_OPTION", "An unknown option was passed in to libcurl",
          "an option this curl does not accept"),
    _ours(49, "CURLE_SETOPT_OPTION_SYNTAX", "Malformed option provided in a setopt"),
    _obsolete(50),
    _obsolete(51),
    _net(52, "CURLE_GOT_NOTHING", "Server returned nothing (no headers, no data)",
         "the connection closed before any answer"),
    _ours(53, "CURLE_SSL_ENGINE_NOTFOUND", "SSL crypto engine not found"),
    _ours(54, "CURLE_SSL_ENGINE_SETFAILED", "Can not set SSL crypto engine as default"),
    _net(55, "CURLE_SEND_ERROR", "Failed sending data to the peer"),
    Code(56, "CURLE_RECV_ERROR", "Failure when receiving data from the peer", "network", "download-failed-network",
         _NET, prints=("Recv failure: %s",)),
    _obsolete(57),
    _ours(58, "CURLE_SSL_CERTPROBLEM", "Problem with the local SSL certificate", "a client certificate"),
    _ours(59, "CURLE_SSL_CIPHER", "Could not use specified SSL cipher"),
    Code(60, "CURLE_PEER_FAILED_VERIFICATION", "SSL peer certificate or SSH remote key was not OK", "unknown",
         "tls-verify-failed", "the certificate check failed; its cause decides (the clock behind: the machine; "
         "expired or for another host: the mirror; unknown issuer: our CA bundle), the code alone names nobody",
         prints=("SSL certificate problem: %s",)),
    Code(61, "CURLE_BAD_CONTENT_ENCODING", "Unrecognized or bad HTTP Content or Transfer-Encoding", "params",
         "params-mirror-bad-response", _MIRROR),
    _obsolete(62),
    _ours(63, "CURLE_FILESIZE_EXCEEDED", "Maximum file size exceeded", "--max-filesize"),
    Code(64, "CURLE_USE_SSL_FAILED", "Requested SSL level failed", "params", "params-mirror-bad-response",
         f"{_MIRROR} (FTP without TLS)"),
    _ours(65, "CURLE_SEND_FAIL_REWIND", "Send failed since rewinding of the data stream failed"),
    _ours(66, "CURLE_SSL_ENGINE_INITFAILED", "Failed to initialize SSL crypto engine"),
    Code(67, "CURLE_LOGIN_DENIED", "Login denied", "configuration", "params-mirror-denied",
         "the mirror refused our login: params.base_url or its credentials"),
    Code(68, "CURLE_TFTP_NOTFOUND", "TFTP: File Not Found", "params", "params-not-found",
         f"{_MIRROR} (TFTP): it lacks the file"),
    Code(69, "CURLE_TFTP_PERM", "TFTP: Access Violation", "configuration", "params-mirror-denied",
         "the mirror refused us (TFTP)"),
    Code(70, "CURLE_REMOTE_DISK_FULL", "Disk full or allocation exceeded", "params", "params-mirror-bad-response",
         f"{_MIRROR}: the server's disk"),
    Code(71, "CURLE_TFTP_ILLEGAL", "TFTP: Illegal operation", "params", "params-mirror-bad-response",
         f"{_MIRROR} (TFTP)"),
    Code(72, "CURLE_TFTP_UNKNOWNID", "TFTP: Unknown transfer ID", "params", "params-mirror-bad-response",
         f"{_MIRROR} (TFTP)"),
    _ours(73, "CURLE_REMOTE_FILE_EXISTS", "Remote file already exists", "the worker never uploads"),
    Code(74, "CURLE_TFTP_NOSUCHUSER", "TFTP: No such user", "configuration", "params-mirror-denied",
         "the mirror refused us (TFTP)"),
    _obsolete(75),
    _obsolete(76),
    Code(77, "CURLE_SSL_CACERT_BADFILE", "Problem with the SSL CA cert (path? access rights?)", "image",
         "tls-unknown-authority", "the image has no usable CA bundle (install ca-certificates)"),
    Code(78, "CURLE_REMOTE_FILE_NOT_FOUND", "Remote file not found", "params", "params-not-found",
         f"{_MIRROR}: it lacks the file"),
    Code(79, "CURLE_SSH", "Error in the SSH layer", "params", "params-mirror-bad-response", f"{_MIRROR} (SFTP/SCP)"),
    _net(80, "CURLE_SSL_SHUTDOWN_FAILED", "Failed to shut down the SSL connection"),
    _ours(81, "CURLE_AGAIN", "Socket not ready for send/recv", "a libcurl API result, never the tool's exit"),
    _ours(82, "CURLE_SSL_CRL_BADFILE", "Failed to load CRL file (path? access rights?, format?)"),
    _ours(83, "CURLE_SSL_ISSUER_ERROR", "Issuer check against peer certificate failed", "--issuer"),
    _ftp(84, "CURLE_FTP_PRET_FAILED", "FTP: The server did not accept the PRET command."),
    _ours(85, "CURLE_RTSP_CSEQ_ERROR", "RTSP CSeq mismatch or invalid CSeq"),
    _ours(86, "CURLE_RTSP_SESSION_ERROR", "RTSP session error"),
    _ftp(87, "CURLE_FTP_BAD_FILE_LIST", "Unable to parse FTP file list"),
    _ours(88, "CURLE_CHUNK_FAILED", "Chunk callback failed"),
    _ours(89, "CURLE_NO_CONNECTION_AVAILABLE", "The max connection limit is reached"),
    _ours(90, "CURLE_SSL_PINNEDPUBKEYNOTMATCH", "SSL public key does not match pinned public key", "--pinnedpubkey"),
    Code(91, "CURLE_SSL_INVALIDCERTSTATUS", "SSL server certificate status verification FAILED", "params",
         "params-mirror-bad-response", f"{_MIRROR}: its certificate status (OCSP) is bad"),
    _net(92, "CURLE_HTTP2_STREAM", "Stream error in the HTTP/2 framing layer", "an HTTP/2 stream was reset"),
    _ours(93, "CURLE_RECURSIVE_API_CALL", "API function called from within callback"),
    Code(94, "CURLE_AUTH_ERROR", "An authentication function returned an error", "configuration",
         "params-mirror-denied", "authenticating to the mirror failed: params.base_url or its credentials"),
    _net(95, "CURLE_HTTP3", "HTTP/3 error"),
    _net(96, "CURLE_QUIC_CONNECT_ERROR", "QUIC connection error"),
    _net(97, "CURLE_PROXY", "proxy handshake error", "the machine's proxy"),
    Code(98, "CURLE_SSL_CLIENTCERT", "SSL Client Certificate required", "configuration", "params-mirror-denied",
         "the mirror wants a client certificate we do not have: params.base_url"),
    _ours(99, "CURLE_UNRECOVERABLE_POLL", "Unrecoverable error in select/poll"),
    _ours(100, "CURLE_TOO_LARGE", "A value or data field grew larger than allowed"),
    _net(101, "CURLE_ECH_REQUIRED", "ECH attempted but failed"),
)

CURL: dict[int, Code] = by_number(CURL_CODES)

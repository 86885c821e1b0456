"""aria2c's exit status, whole: every code of aria2's `error_code::Value` with the messages aria2 prints with it
and the blame it carries for our params fetch. Pure data; `signatures.py` builds the aria2c signatures from it.

Sources (aria2/aria2 at b4fd7cb1ca03e38ad9d7ab9308b8200cb1d41c25):
- numbers and names: `src/error_code.h` (`enum Value`, UNDEFINED = -1 is internal, never an exit status);
- meanings: `doc/manual-src/en/aria2c.rst`, EXIT STATUS ("aria2 returns the following exit status based on the
  last error encountered");
- messages: `src/message.h` (EX_*/MSG_* texts) where `src/*.cc` throws them with that code (`DL_ABORT_EX2(..,
  error_code::X)`), e.g. `src/HttpSkipResponseCommand.cc` 404 -> RESOURCE_NOT_FOUND "Resource not found". aria2c
  prints an error as `Exception: [File.cc:L] errorCode=N <message>`, its causes as `  -> [File.cc:L] errorCode=N
  <message>`; socket errors are thrown without a code (`src/Exception.cc`: UNKNOWN_ERROR) with the errno text
  as their cause (`Failed to receive data, cause: Connection reset by peer`): the errno then decides (errnos.py).

Blame for the worker's fetch (`aria2c -x16 -s16 --continue` of the mirror's manifest, worker-image/fetch-params.sh):
the mirror's answers (not found, refused, overloaded, no resume) are `params`/`configuration` (params.base_url);
the machine's network (DNS, timeouts, dropped connections) is `network`; our own command line and aria2c
features we never use (torrents, Metalink, RPC, overwrite rules) are `image`; the params directory's errors say
which errno in their cause (disk full -> configuration, EACCES -> image, EIO -> machine), so the code alone is
`unknown`. 1 (unknown error) and 7 (stopped by a signal with downloads unfinished) are generic.
"""

from __future__ import annotations

from reconciler.domain.codes import Code, by_number

ARIA2_SOURCE = ("aria2/aria2@b4fd7cb1ca03e38ad9d7ab9308b8200cb1d41c25 src/error_code.h, src/message.h, "
                "doc/manual-src/en/aria2c.rst (EXIT STATUS)")

_OURS = "our fetch script's aria2c command line or a feature it never uses: our software (worker-image/fetch-params.sh)"
_MIRROR = "the params mirror's answer: fixed in params.base_url or at the mirror, not on the machine"
_PARAMS_DIR = ("aria2c could not use the params directory; its cause line carries the errno that says why (disk full "
               "-> configuration, permission -> image, I/O error -> machine): the code alone names nobody")

ARIA2_CODES: tuple[Code, ...] = (
    Code(0, "FINISHED", "all downloads were successful", "none", None, "not a failure"),
    Code(1, "UNKNOWN_ERROR", "an unknown error occurred", "unknown", "download-failed-generic",
         "aria2c's default code: every socket error it does not classify (the errno text is in its cause line) and "
         "a download that ended without a result: it says only that aria2c stopped", generic=True,
         prints=("Download aborted.",)),
    Code(2, "TIME_OUT", "time out occurred", "network", "network-timeout",
         "the mirror did not answer in time over the machine's network", prints=("Timeout.",)),
    Code(3, "RESOURCE_NOT_FOUND", "a resource was not found", "params", "params-not-found",
         "the mirror answered 404: it lacks a file of the manifest", prints=("Resource not found",)),
    Code(4, "MAX_FILE_NOT_FOUND", 'aria2 saw the specified number of "resource not found" error', "params",
         "params-not-found", "the mirror answered 404 --max-file-not-found times",
         prints=("Reached max-file-not-found count=%d",)),
    Code(5, "TOO_SLOW_DOWNLOAD_SPEED", "a download aborted because download speed was too slow", "unknown",
         "params-too-slow", "slow: the machine's network or the mirror; the fleet decides (the same mirror slow on "
         "K machines, the same machine slow twice)", prints=("Too slow Downloading speed: %d <= %d(B/s), host:%s",)),
    Code(6, "NETWORK_PROBLEM", "network problem occurred", "network", "download-failed-network",
         "the machine's connection to the mirror failed", prints=("Network problem has occurred. cause:%s",)),
    Code(7, "IN_PROGRESS", "there were unfinished downloads (aria2c was stopped by Ctrl-C, TERM or INT)", "unknown",
         "download-failed-generic", "aria2c was stopped from outside while downloading: our deadline or the "
         "container's stop says who, elsewhere", generic=True),
    Code(8, "CANNOT_RESUME", "remote server did not support resume when resume was required to complete download",
         "params", "params-mirror-unsupported", f"{_MIRROR}: our fetch resumes (--continue), the mirror must serve "
         "byte ranges", prints=("FTP server doesn't support resuming.",
                                "Invalid range header. Request: %d-%d/%d, Response: %d-%d/%d")),
    Code(9, "NOT_ENOUGH_DISK_SPACE", "there was not enough disk space available", "configuration", "disk-full",
         "the instance disk is too small for the params (pools[].disk_gb)",
         prints=("Failed to write into the file %s, cause: %s", "fallocate failed. cause: %s")),
    Code(10, "PIECE_LENGTH_CHANGED", "piece length was different from one in .aria2 control file", "image",
         "downloader-usage-error", _OURS),
    Code(11, "DUPLICATE_DOWNLOAD", "aria2 was downloading same file at that moment", "image",
         "downloader-usage-error", f"{_OURS}: the script asked for one file twice"),
    Code(12, "DUPLICATE_INFO_HASH", "aria2 was downloading same info hash torrent at that moment", "image",
         "downloader-usage-error", _OURS),
    Code(13, "FILE_ALREADY_EXISTS", "file already existed", "image", "downloader-usage-error",
         f"{_OURS}: --allow-overwrite / the .aria2 control file",
         prints=("File %s exists, but a control file(*.aria2) does not exist. Download was canceled in order to "
                 "prevent your file from being truncated to 0. If you are sure to download the file all over again, "
                 "then delete it or add --allow-overwrite=true option and restart aria2.",)),
    Code(14, "FILE_RENAMING_FAILED", "renaming file failed", "image", "downloader-usage-error",
         f"{_OURS}: --auto-file-renaming", prints=("File renaming failed: %s",)),
    Code(15, "FILE_OPEN_ERROR", "aria2 could not open existing file", "unknown", "params-dir-error", _PARAMS_DIR,
         prints=("Failed to open the file %s, cause: %s",)),
    Code(16, "FILE_CREATE_ERROR", "aria2 could not create new file or truncate existing file", "unknown",
         "params-dir-error", _PARAMS_DIR, prints=("Failed to open the file %s, cause: %s",)),
    Code(17, "FILE_IO_ERROR", "file I/O error occurred", "unknown", "params-dir-error",
         f"{_PARAMS_DIR}; a full disk has its own code (9)",
         prints=("Failed to write into the file %s, cause: %s", "Failed to read from the file %s, cause: %s",
                 "Failed to seek the file %s, cause: %s")),
    Code(18, "DIR_CREATE_ERROR", "aria2 could not create directory", "unknown", "params-dir-error", _PARAMS_DIR,
         prints=("Failed to make the directory %s, cause: %s",)),
    Code(19, "NAME_RESOLVE_ERROR", "name resolution failed", "network", "dns-failure",
         "the machine's resolver could not resolve the mirror",
         prints=("Name resolution for %s failed:%s", "Failed to resolve the hostname %s, cause: %s")),
    Code(20, "METALINK_PARSE_ERROR", "aria2 could not parse Metalink document", "image", "downloader-usage-error",
         _OURS),
    Code(21, "FTP_PROTOCOL_ERROR", "FTP command failed", "params", "params-mirror-bad-response",
         f"{_MIRROR} (an FTP mirror's reply)"),
    Code(22, "HTTP_PROTOCOL_ERROR", "HTTP response header was bad or unexpected", "params",
         "params-mirror-bad-response", f"{_MIRROR}: an unexpected status or header (its status decides when shown)",
         prints=("The response status is not successful. status=%d", "Unexpected status %d",
                 "Got %d status, but no location header provided.")),
    Code(23, "HTTP_TOO_MANY_REDIRECTS", "too many redirects occurred", "params", "params-mirror-bad-response",
         f"{_MIRROR}: it redirects in a loop", prints=("Too many redirects: count=%u",)),
    Code(24, "HTTP_AUTH_FAILED", "HTTP authorization failed", "configuration", "params-mirror-denied",
         "the mirror refused our credentials: params.base_url or its credentials", prints=("Authorization failed.",)),
    Code(25, "BENCODE_PARSE_ERROR", 'aria2 could not parse bencoded file (usually ".torrent" file)', "image",
         "downloader-usage-error", _OURS),
    Code(26, "BITTORRENT_PARSE_ERROR", '".torrent" file was corrupted or missing information that aria2 needed',
         "image", "downloader-usage-error", _OURS),
    Code(27, "MAGNET_PARSE_ERROR", "Magnet URI was bad", "image", "downloader-usage-error", _OURS),
    Code(28, "OPTION_ERROR", "bad/unrecognized option was given or unexpected option argument was given", "image",
         "downloader-usage-error", f"{_OURS}: an option this aria2c does not accept"),
    Code(29, "HTTP_SERVICE_UNAVAILABLE", "the remote server was unable to handle the request due to a temporary "
         "overloading or maintenance", "params", "params-mirror-unavailable",
         f"{_MIRROR}: overloaded or down (HTTP 502/503/504)",
         prints=("The response status is not successful. status=%d",)),
    Code(30, "JSON_PARSE_ERROR", "aria2 could not parse JSON-RPC request", "image", "downloader-usage-error", _OURS),
    Code(31, "REMOVED", "reserved, not used (a download removed over RPC)", "image", "downloader-usage-error",
         f"{_OURS}: the worker never removes downloads over RPC"),
    Code(32, "CHECKSUM_ERROR", "checksum validation failed", "network", "checksum-mismatch",
         "a file arrived corrupt (repeated on one machine: its network; the params policy strikes it)"),
)

ARIA2: dict[int, Code] = by_number(ARIA2_CODES)

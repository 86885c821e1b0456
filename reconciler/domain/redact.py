"""Mask credentials in worker log lines before anything is stored, shown or committed.

One mechanism: a `Redactor` (the patterns below plus the secrets this deployment knows by value: the
vast.ai API key, the registry password, the controller's own tokens). The controller store applies it at
ingest to every log line, log tail, event message, string in event details and free-text register field,
so the SQLite store, `/api/...` answers, the status page, `fleet status`, the evidence committed into
machine records and the commit messages built from it never hold a secret; the same patterns run again
where text is composed (verdict causes, commit messages, webhooks) as defence in depth.

Redaction is a best-effort filter over text we do not control: it errs towards masking credential-shaped
words, but keeps what evidence needs (image digests `sha256:<hex>`,
params file names that embed a hash, aria2 progress lines, blake2b sums).

Known trade-off: a bare 64-hex word is indistinguishable from a vast.ai API key, so it is masked; digests
that matter carry the `sha256:` prefix (docker) or sit inside a file name (`...-<hex>.params`), and both
survive. Pure functions; `redact_line(redact_line(x)) == redact_line(x)`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

MASK = "[REDACTED]"


@dataclass(frozen=True)
class Pattern:
    name: str
    regex: re.Pattern[str]
    replacement: str
    #: Lowercase substrings one of which any match must contain; the regex only runs if the line has one.
    #: Empty = always run. Purely a speed-up (ingest redacts every log line); results are identical.
    triggers: tuple[str, ...] = ()
    #: Every match is (part of) a run of at least this many characters of [A-Za-z0-9+/]: the regex only
    #: runs on lines that have such a run (0 = no such rule). Also purely a speed-up.
    min_run: int = 0


# Words that, as (part of) a key name followed by `=` or `:`, introduce a secret value. Deliberately not
# "pass" or "auth" alone: `passed: 3` and `author:` are ordinary output.
_CREDENTIAL_WORDS = (r"(?:password|passwd|passphrase|pwd|secret|token|api[_-]?key|apikey|access[_-]?key"
                r"|private[_-]?key|credentials?|session[_-]?key)")
_KEY_NAME = rf"[A-Za-z0-9_.-]*{_CREDENTIAL_WORDS}[A-Za-z0-9_.-]*"
#: Every word of _CREDENTIAL_WORDS contains one of these (lowercase).
_KEY_TRIGGERS = ("pass", "pwd", "secret", "token", "key", "credential")

PATTERNS: tuple[Pattern, ...] = (
    # One-line PEM (e.g. JSON-escaped) or the opening line of a block; redact_lines masks the block body.
    Pattern("private-key",
            re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|$)"),
            "-----BEGIN PRIVATE KEY----- " + MASK, ("private key-----",)),
    # `Authorization: Bearer x`, `Authorization: Basic x`, `Authorization: token x` (header dumps, curl -v).
    Pattern("authorization-header",
            re.compile(r"(?i)(\bauthorization\"?\s*[:=]\s*\"?)(?:bearer|basic|token|digest)?\s*[^\s\"',;]+"),
            r"\1" + MASK, ("authorization",)),
    Pattern("bearer", re.compile(r"(?i)\b(bearer)(\s+)[A-Za-z0-9._~+/=-]{4,}"), r"\1\2" + MASK, ("bearer",)),
    # scheme://user:password@host -> keep the user (useful when debugging a mirror), mask the password.
    Pattern("url-userinfo", re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s/:@]*):[^\s/@]+@"), r"\1:" + MASK + "@",
            ("://",)),
    # key=value, key: value, "key": "value", KEY_TOKEN=value (env dumps); the value may be quoted.
    Pattern("key-value",
            re.compile(rf"(?i)(\b{_KEY_NAME}[\"']?\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s\"',;&]+)"),
            r"\1" + MASK, _KEY_TRIGGERS),
    # --password x, --token x, -p x is too ambiguous to touch.
    Pattern("cli-flag", re.compile(rf"(?i)(--{_KEY_NAME})(\s+)(?!-)\S+"), r"\1\2" + MASK, ("--",)),
    # curl -u user:pass / --user user:pass / -uuser:pass: keep the user, mask the password.
    Pattern("curl-user", re.compile(r"(?<!\S)(-u\s*|--user[\s=]+)([^\s:'\"]+):([^\s'\"]+)"), r"\1\2:" + MASK,
            ("-u", "--user")),
    # Registry logins as vast.ai's image_login or docker take them: `-u USER -p PASS [SERVER]`.
    Pattern("login-password", re.compile(r"(?<!\S)(-u\s+\S+\s+(?:-p|--password)\s+)(\S+)"), r"\1" + MASK, ("-p",)),
    # Signed URLs: GCS V4 (X-Goog-Signature, X-Goog-Credential), S3 SigV4 (X-Amz-Signature, -Credential,
    # -Security-Token), Azure SAS (sig=) and generic signature/token query parameters.
    Pattern("signed-url-param",
            re.compile(r"(?i)([?&;](?:x-goog-signature|x-goog-credential|x-amz-signature|x-amz-credential"
                       r"|x-amz-security-token|sig|signature|access_token|token|session)=)[^&\s\"'#<>]+"),
            r"\1" + MASK, ("sig", "x-goog-", "x-amz-", "token=", "session=")),
    Pattern("aws-access-key-id", re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b"), MASK,
            ("akia", "asia", "agpa", "aida", "aroa")),
    Pattern("slack-token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}|\bxapp-[0-9]-[A-Za-z0-9-]{10,}"), MASK,
            ("xox", "xapp-")),
    Pattern("huggingface-token", re.compile(r"\bhf_[A-Za-z0-9]{30,}"), MASK, ("hf_",)),
    Pattern("stripe-key", re.compile(r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"), MASK, ("_live_", "_test_")),
    Pattern("github-token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{40,})\b"), MASK,
            ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_")),
    Pattern("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), MASK, ("eyj",)),
    # vast.ai API keys: 64 hex as a word of its own. Not after `sha256:`/`sha256=`/`@sha256:` (image
    # digests) and not inside a longer hex run (blake2b sums) or a file name (`-<hex>.params`, `/<hex>`).
    Pattern("hex-64-key",
            re.compile(r"(?<![0-9A-Za-z_./:-])(?<!sha256:)[0-9a-fA-F]{64}(?![0-9A-Za-z_./-])"), MASK, min_run=64),
    # The body of a PEM block that arrived without its BEGIN line (split across log batches). A line of
    # pure hex (a blake2b sum printed alone) is not a PEM body and is kept.
    Pattern("pem-body", re.compile(r"^\s*(?=[0-9a-fA-F]*[g-zG-Z+/])[A-Za-z0-9+/]{60,}={0,2}\s*$"), MASK, min_run=60),
)

#: The shortest `min_run` of any pattern, and a search for such a run.
_MIN_RUN = min(p.min_run for p in PATTERNS if p.min_run)
_LONG_RUN = re.compile(rf"[A-Za-z0-9+/]{{{_MIN_RUN}}}")

_PEM_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")
_PEM_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY-----")


#: Known secrets shorter than this are not masked by value: too likely to occur in ordinary text.
MIN_KNOWN_SECRET = 8


@dataclass(frozen=True)
class Redactor:
    """The patterns, plus `known`: secret values this deployment holds (masked wherever they appear, also
    in shapes no pattern knows, e.g. a registry password). Pure; `line(line(x)) == line(x)`."""

    known: tuple[str, ...] = ()

    @classmethod
    def with_secrets(cls, values: Iterable[str | None]) -> Redactor:
        # Longest first: a secret that contains another is masked whole.
        usable = {v.strip() for v in values if v and len(v.strip()) >= MIN_KNOWN_SECRET}
        return cls(tuple(sorted(usable, key=len, reverse=True)))

    def line(self, text: str) -> str:
        """`text` with every credential-shaped part and every known secret replaced by `[REDACTED]`."""
        for secret in self.known:
            if secret in text:
                text = text.replace(secret, MASK)
        # Triggers are checked on the original line: replacements only add "[REDACTED]" and keep prefixes
        # that were already there, so they never create a trigger a later pattern would need.
        lower = text.lower()
        long_run = len(text) >= _MIN_RUN and _LONG_RUN.search(text) is not None
        for pattern in PATTERNS:
            if pattern.min_run:
                if long_run:
                    text = pattern.regex.sub(pattern.replacement, text)
                continue
            for trigger in pattern.triggers:
                if trigger in lower:
                    text = pattern.regex.sub(pattern.replacement, text)
                    break
        return text

    def lines(self, lines: Iterable[str]) -> list[str]:
        """Redact each line; lines inside a multi-line `BEGIN ... PRIVATE KEY` block are masked whole."""
        return self._lines(lines, self.line)

    def _lines(self, lines: Iterable[str], redact: Callable[[str], str]) -> list[str]:
        out: list[str] = []
        in_key = False
        for line in lines:
            if in_key:
                end = _PEM_END.search(line)
                if end is None:
                    out.append(MASK)
                else:
                    in_key = False
                    out.append("-----END PRIVATE KEY-----" + redact(line[end.end():]))
                continue
            begin = _PEM_BEGIN.search(line)
            if begin and not _PEM_END.search(line, begin.end()):
                in_key = True
            out.append(redact(line))
        return out

    def value(self, value: Any) -> Any:
        """Every string inside a JSON value (keys kept), redacted."""
        if isinstance(value, str):
            return self.line(value)
        if isinstance(value, list):
            return [self.value(v) for v in value]
        if isinstance(value, dict):
            return {k: self.value(v) for k, v in value.items()}
        return value


#: The patterns alone (no known secrets): what code without access to the deployment's settings applies.
PATTERNS_ONLY = Redactor()


#: The judge redacts every verdict's evidence again (defence in depth): log lines repeat across reports (the same
#: params, daemon and bench lines on every machine), so each distinct line is redacted once. Pure.
_patterns_only_line = lru_cache(maxsize=1 << 14)(PATTERNS_ONLY.line)


def redact_line(text: str) -> str:
    """`text` with every credential-shaped part replaced by `[REDACTED]` (patterns only)."""
    return _patterns_only_line(text)


def redact_lines(lines: Iterable[str]) -> list[str]:
    """Redact each line (patterns only); a multi-line `BEGIN ... PRIVATE KEY` block is masked whole."""
    return PATTERNS_ONLY._lines(lines, _patterns_only_line)

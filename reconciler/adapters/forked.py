"""A pure computation on a second core: `ForkedCall(fn)` forks a child that runs `fn()` on this process's memory as
it stands at the fork (nothing is sent to it) and hands the result back pickled through a temporary file;
`result()` waits for it.

Place in the flow: `flows.whatif` replays the fleet's history under the specs as they were in a child while this
process replays it under the PR's spec (each replay is one core's work for tens of seconds at fleet size).

Never a different answer, only a slower one: where there is no fork (another platform, another thread running,
out of processes) or the child fails (killed, out of memory, an exception), `result()` runs `fn()` here, and an
exception it raises is raised here as usual. The child leaves with `os._exit`: no cleanup of the parent's (open
files, atexit handlers, buffered output) runs twice.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import tempfile
from collections.abc import Callable
from typing import IO, Generic, TypeVar

from reconciler.adapters.closing import Closing

T = TypeVar("T")


class ForkedCall(Closing, Generic[T]):
    """`fn()` in a forked child from now on; `result()` is its value. `with ForkedCall(fn) as call:` kills a child
    still running when the block ends early."""

    def __init__(self, fn: Callable[[], T], *, fork: bool | None = None) -> None:
        """`fork`: False runs `fn` here in `result()`; None forks when this process runs one thread (a lock another
        thread holds at the fork would stay locked in the child forever); True forks whatever runs beside (the
        caller knows `fn` takes no lock another thread may hold)."""
        self._fn = fn
        self._pid: int | None = None
        self._file: IO[bytes] | None = None
        #: Why the result was computed here rather than in a child (None: it was not, or not yet asked for).
        self.ran_here: str | None = None
        why_not = _why_not_fork(fork)
        if why_not is not None:
            self.ran_here = why_not
            return
        self._file = tempfile.TemporaryFile(prefix="fleet-forked-")  # noqa: SIM115 - closed by result() or close()
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as exc:
            self._file.close()
            self._file = None
            self.ran_here = f"no fork: {exc.strerror or exc}"
            return
        if pid == 0:  # the child: the value, pickled to the shared file; leave without any of the parent's cleanup
            code = 1
            try:
                pickle.dump(fn(), self._file, protocol=pickle.HIGHEST_PROTOCOL)
                self._file.flush()
                code = 0
            finally:
                os._exit(code)
        self._pid = pid

    def result(self) -> T:
        """The child's value; computed here if there was no child or it failed."""
        pid, self._pid = self._pid, None
        if pid is None:
            if self.ran_here is None:
                self.ran_here = "asked for twice: computed again here"
            return self._fn()
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        found: tuple[T] | None = None
        if code == 0 and self._file is not None:
            self._file.seek(0)
            try:
                found = (pickle.load(self._file),)  # noqa: S301 - written by our own child, never read from elsewhere
            except (EOFError, pickle.UnpicklingError, AttributeError, ValueError, TypeError) as exc:
                self.ran_here = f"the child's result was unreadable ({type(exc).__name__})"
        else:
            self.ran_here = f"the child ended with {_ended(code)}"
        self._close_file()
        return found[0] if found is not None else self._fn()

    def close(self) -> None:
        """Kill a child still running (the block ended before its result was asked for) and drop its file."""
        pid, self._pid = self._pid, None
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        self._close_file()

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _why_not_fork(fork: bool | None) -> str | None:
    if fork is False:
        return "asked to run here"
    if not hasattr(os, "fork"):
        return "this platform has no fork"
    threading = sys.modules.get("threading")
    if fork is None and threading is not None and threading.active_count() > 1:
        return "another thread runs in this process"
    return None


def _ended(code: int) -> str:
    if code >= 0:
        return f"exit {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:
        return f"signal {-code}"

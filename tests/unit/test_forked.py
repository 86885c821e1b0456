"""adapters.forked: a computation in a forked child, its value back; never a different answer when the child
cannot run or fails (real fork, real signals, real files). The tests that need a child say `fork=True`: a test run
may have threads of earlier tests still running, where the default would rightly not fork."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from reconciler.adapters.forked import ForkedCall

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")


def test_the_value_is_computed_in_a_child_on_the_parents_memory() -> None:
    loaded = {"rows": list(range(1000))}  # what the parent had loaded before the fork; nothing is sent
    parent = os.getpid()
    with ForkedCall(lambda: (os.getpid(), sum(loaded["rows"])), fork=True) as call:
        loaded["rows"] = []  # the parent's later changes do not reach the child
        pid, total = call.result()
    assert call.ran_here is None
    assert pid != parent and total == sum(range(1000))


def test_asked_to_run_here_it_runs_here() -> None:
    call = ForkedCall(os.getpid, fork=False)
    assert call.result() == os.getpid() and call.ran_here == "asked to run here"


def test_a_child_killed_mid_way_is_computed_again_here() -> None:
    parent = os.getpid()

    def dies_in_the_child() -> str:
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return "computed here"

    with ForkedCall(dies_in_the_child, fork=True) as call:
        assert call.result() == "computed here"
    assert call.ran_here == "the child ended with signal SIGKILL"


def test_an_exception_in_the_child_is_raised_here_as_it_would_have_been() -> None:
    def fails() -> int:
        raise ValueError("no such pool 'p99'")

    with ForkedCall(fails, fork=True) as call, pytest.raises(ValueError, match="p99"):
        call.result()
    assert call.ran_here == "the child ended with exit 1"


def test_a_result_pickle_cannot_carry_is_computed_here() -> None:
    parent = os.getpid()
    with ForkedCall(lambda: (lambda: None) if os.getpid() != parent else "here", fork=True) as call:
        assert call.result() == "here"
    assert call.ran_here == "the child ended with exit 1"


def test_a_block_left_early_kills_the_child_and_reaps_it() -> None:
    with ForkedCall(lambda: time.sleep(60), fork=True) as call:
        pid = call._pid
        assert pid is not None
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # already reaped: no zombie left behind


def test_no_fork_while_another_thread_runs() -> None:
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        call = ForkedCall(os.getpid)
        assert call.ran_here == "another thread runs in this process"
        assert call.result() == os.getpid()
        forced = ForkedCall(os.getpid, fork=True)  # the caller knows the function takes no lock: a child all the same
        assert forced.result() != os.getpid() and forced.ran_here is None
    finally:
        stop.set()
        other.join()

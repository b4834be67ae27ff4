"""The tests' `fork()` helper: it refuses to fork beside a thread it does not know, and forks
without Python 3.12's multi-threaded-fork warning beside the ones it does."""

from __future__ import annotations

import os
import threading
import warnings

import pytest

from _forking import fork, unexpected_threads


def _child_exits(code: int) -> int:
    pid = fork()
    if pid == 0:  # pragma: no cover - child
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _with_thread(name: str) -> tuple[threading.Thread, threading.Event]:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name=name, daemon=True)
    thread.start()
    return thread, stop


def test_a_thread_left_running_fails_the_fork_and_names_it() -> None:
    thread, stop = _with_thread("leaked-by-a-test")
    try:
        assert "leaked-by-a-test" in unexpected_threads()
        with pytest.raises(AssertionError, match="leaked-by-a-test"):
            fork()
    finally:
        stop.set()
        thread.join()
    assert "leaked-by-a-test" not in unexpected_threads()


def test_beside_an_allowed_thread_it_forks_without_a_warning() -> None:
    thread, stop = _with_thread("asyncio_7")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the 3.12+ DeprecationWarning would raise here
            assert _child_exits(5) == 5
    finally:
        stop.set()
        thread.join()

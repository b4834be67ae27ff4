"""The channel's polling wait: the C accelerator's `poll_recv` and its Python twin, side by
side on the same socket cases (what arrives, nothing, end of file, errors), plus how the
host and the workers pick one."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from suaveplan_sandbox import _speedups
from suaveplan_sandbox.permissions import _accel
from suaveplan_sandbox.vm import _worker_loop
from suaveplan_sandbox.vm._worker_loop import _poll_recv_python, poll_receiver

Receive = Callable[[bytearray, float], int]


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    yield ours, theirs
    ours.close()
    theirs.close()


@pytest.fixture(params=["c", "python"])
def receiver(request: pytest.FixtureRequest, pair: tuple[socket.socket, socket.socket]) -> Receive:
    """A polling wait on the second socket of `pair` (blocking, as a worker's is)."""
    native = _speedups.poll_recv if request.param == "c" else None
    return poll_receiver(pair[1], native)


def test_what_is_there_is_read_at_once_even_past_the_deadline(
    pair: tuple[socket.socket, socket.socket], receiver: Receive
) -> None:
    pair[0].sendall(b"ready")
    buf = bytearray(16)
    assert receiver(buf, time.monotonic() - 1.0) == 5  # tried once before the clock
    assert bytes(buf[:5]) == b"ready"


def test_at_most_the_buffer_is_read_and_the_rest_waits(
    pair: tuple[socket.socket, socket.socket], receiver: Receive
) -> None:
    pair[0].sendall(b"0123456789")
    buf = bytearray(4)
    assert receiver(buf, time.monotonic() + 1.0) == 4
    assert bytes(buf) == b"0123"
    assert pair[1].recv(16) == b"456789"


def test_nothing_by_the_deadline_is_minus_one_and_waits_at_least_that_long(
    receiver: Receive,
) -> None:
    began = time.monotonic()
    assert receiver(bytearray(8), began + 0.05) == -1
    assert time.monotonic() - began >= 0.05


def test_what_arrives_while_polling_is_read(
    pair: tuple[socket.socket, socket.socket], receiver: Receive
) -> None:
    timer = threading.Timer(0.05, pair[0].sendall, args=(b"late",))
    timer.start()
    buf = bytearray(8)
    try:
        assert receiver(buf, time.monotonic() + 30.0) == 4
    finally:
        timer.join()
    assert bytes(buf[:4]) == b"late"


def test_end_of_file_is_zero(pair: tuple[socket.socket, socket.socket], receiver: Receive) -> None:
    pair[0].close()
    assert receiver(bytearray(8), time.monotonic() + 1.0) == 0


def test_a_closed_socket_raises_oserror(
    pair: tuple[socket.socket, socket.socket], receiver: Receive
) -> None:
    pair[1].close()
    with pytest.raises(OSError):
        receiver(bytearray(8), time.monotonic() + 1.0)


@pytest.mark.parametrize("buffer", [b"immutable", "text", memoryview(b"ro"), 3])
def test_anything_but_a_writable_buffer_is_refused(
    pair: tuple[socket.socket, socket.socket], receiver: Receive, buffer: object
) -> None:
    pair[0].sendall(b"x")
    with pytest.raises((TypeError, BufferError)):
        receiver(buffer, time.monotonic() + 1.0)  # type: ignore[arg-type]
    assert pair[1].recv(1) == b"x"  # nothing was consumed


@pytest.mark.parametrize(
    "args",
    [
        (-1, bytearray(1), 0.0),
        (2**40, bytearray(1), 0.0),
        ("3", bytearray(1), 0.0),
        (3, bytearray(1), "x"),
    ],
    ids=["negative-fd", "huge-fd", "str-fd", "str-deadline"],
)
def test_the_c_call_refuses_bad_arguments(args: tuple[object, ...]) -> None:
    with pytest.raises((OSError, TypeError, OverflowError)):
        _speedups.poll_recv(*args)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _speedups.poll_recv(3, bytearray(1))  # type: ignore[call-arg]


def test_other_threads_run_while_the_c_call_waits(receiver: Receive) -> None:
    # The GIL is released while polling: a host's other threads are not stopped by it.
    counted = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal counted
        while not stop.is_set():
            counted += 1

    thread = threading.Thread(target=count)
    thread.start()
    try:
        time.sleep(0.01)
        before = counted
        assert receiver(bytearray(8), time.monotonic() + 0.2) == -1
        during = counted - before
    finally:
        stop.set()
        thread.join()
    assert during > 1000


def test_a_non_blocking_socket_polls_the_same(pair: tuple[socket.socket, socket.socket]) -> None:
    # The host's socket is non-blocking; each twin still waits for the deadline, not EAGAIN.
    pair[1].setblocking(False)
    for native in (_speedups.poll_recv, None):
        receive = poll_receiver(pair[1], native)
        began = time.monotonic()
        assert receive(bytearray(8), began + 0.02) == -1
        assert time.monotonic() - began >= 0.02


# -- which one is used ------------------------------------------------------------------


def test_the_twin_is_named_and_the_switch_names_agree(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    assert poll_receiver(pair[1], None).func is _poll_recv_python  # type: ignore[attr-defined]
    assert _worker_loop._NO_SPEEDUPS_ENV == _accel.DISABLE_ENV
    with _accel.accelerated():
        assert _accel.poll_recv() is _speedups.poll_recv
    with _accel.pure_python():
        assert _accel.poll_recv() is None


def test_a_worker_uses_c_unless_the_switch_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_accel.DISABLE_ENV, raising=False)
    assert _worker_loop.worker_native_poll() is _speedups.poll_recv
    monkeypatch.setenv(_accel.DISABLE_ENV, "1")
    assert _worker_loop.worker_native_poll() is None
    monkeypatch.setenv(_accel.DISABLE_ENV, "0")
    assert _worker_loop.worker_native_poll() is _speedups.poll_recv

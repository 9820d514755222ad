"""A cell's time limit, enforced where the cell is computed, so that one stuck hook costs its cells (recorded as
failed with the reason) rather than the whole run, in every executor.

`within(seconds, what)` raises CellTimeout in the computing thread once `seconds` have passed. In a process's
main thread (the local executor, every process-pool worker and every Ray task worker run cells there) it is a
SIGALRM interval timer: the handler runs between bytecodes and interrupts `time.sleep` and blocking reads, so
both a hook asleep and a Python busy loop stop; it fires again every second until the step ends, so a hook that
catches the first one is hit again. Elsewhere (a thread that is not the main one) a watchdog thread raises
CellTimeout asynchronously in it, which stops a busy loop but waits out a `time.sleep`.

Limits: a single C call that never returns to Python (one long torch or TenSEAL operation, a deadlock in native
code) is interrupted only when it returns; a hook that swallows every BaseException forever, or calls
`os._exit`, is out of reach here (`os._exit` ends the local run; a process-pool or Ray worker's death is recorded
as a failed group by its executor).
"""
from __future__ import annotations

import ctypes
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

REPEAT_S = 1.0   # after the first alarm, how often it fires again until the step ends


class CellTimeout(BaseException):
    """Raised in the computing thread when its step ran out of time. A BaseException, as KeyboardInterrupt is,
    so a hook's `except Exception` does not swallow it."""

    def __init__(self, seconds: float, what: str):
        super().__init__(f"timed out after {seconds:g} s in {what} (cell_timeout_s = {seconds:g}); raise "
                         "cell_timeout_s for this scenario, or --cell-timeout, if it needs longer")


def exit_reason(err: SystemExit) -> str:
    """The one-line reason of a cell whose code called sys.exit: a failure, never a silent success."""
    return (f"SystemExit: sys.exit({err.code!r}) was called while computing the cell (a hook must return or "
            "raise, not exit the run)")


@contextmanager
def within(seconds: float | None, what: str) -> Iterator[None]:
    """Run the block under a time limit of `seconds` (None: none); CellTimeout when it is exceeded."""
    if not seconds:
        yield
        return
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        with _alarm(seconds, what):
            yield
    else:
        with _watchdog(seconds, what):
            yield


@contextmanager
def _alarm(seconds: float, what: str) -> Iterator[None]:
    armed = [True]

    def ring(signum, frame):
        if armed[0]:
            raise CellTimeout(seconds, what)

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds, REPEAT_S)
    try:
        yield
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def _watchdog(seconds: float, what: str) -> Iterator[None]:
    target, done, lock = threading.get_ident(), threading.Event(), threading.Lock()
    armed = [True]

    class error(CellTimeout):   # raised asynchronously, so a class that builds its own message
        def __init__(self):
            super().__init__(seconds, what)

    error.__name__ = error.__qualname__ = CellTimeout.__name__

    def watch():
        wait = seconds
        while not done.wait(wait):
            with lock:
                if armed[0]:
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(target), ctypes.py_object(error))
            wait = REPEAT_S

    watcher = threading.Thread(target=watch, name="leakbench-cell-timeout", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        with lock:
            armed[0] = False
            done.set()
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(target), None)   # one still pending is dropped

"""SIGINT and SIGTERM as one exception, ``Interrupted``, raised where the run can act on it.

Python's default SIGINT handler raises ``KeyboardInterrupt`` wherever the main thread happens
to be, and SIGTERM kills the process without any cleanup. Under ``handled()`` both raise
``Interrupted`` instead, except inside ``deferred()`` blocks (bookkeeping that must not be cut in
half: a worker started but not yet recorded, a result half written), which raise it when they
end. ``allowed()`` reopens a deferred block where waiting is all it does. Only the first signal
raises: shutting down is bounded, so later signals are noted and otherwise ignored.
"""

import signal
import threading
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """The run was stopped by a signal; like KeyboardInterrupt, not caught by ``except Exception``."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """The shell's convention: 128 + the signal number (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + self.signum


class _State:
    signum: int | None = None  # the first signal received
    raised = False  # Interrupted has been raised for it
    depth = 0  # > 0 inside deferred()


_state = _State()


def _raise_pending() -> None:
    if _state.signum is not None and not _state.raised:
        _state.raised = True
        raise Interrupted(_state.signum)


def _handler(signum, frame) -> None:
    if _state.signum is None:
        _state.signum = signum
    if _state.depth == 0:
        _raise_pending()


def received() -> int | None:
    """The signal that interrupted this run, if one did."""
    return _state.signum


def check() -> None:
    """Raise ``Interrupted`` now if a signal arrived and has not been raised yet."""
    _raise_pending()


@contextmanager
def handled():
    """Route SIGINT and SIGTERM to ``Interrupted`` for the duration (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.signal(s, _handler) for s in SIGNALS}
    _state.signum, _state.raised, _state.depth = None, False, 0
    try:
        yield
    finally:
        for s, previous in saved.items():
            signal.signal(s, previous)


@contextmanager
def deferred():
    """A signal that arrives inside is raised when the block ends (not when it ends by an exception)."""
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1
    if _state.depth == 0:
        _raise_pending()


@contextmanager
def allowed():
    """Inside a deferred block: let a signal raise right here (around a blocking wait)."""
    saved, _state.depth = _state.depth, 0
    try:
        _raise_pending()
        yield
    finally:
        _state.depth = saved

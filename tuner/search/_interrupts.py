"""Ctrl-C and SIGTERM held back while Optuna creates or records a trial.

Optuna marks a trial FAIL when its objective raises KeyboardInterrupt, but an interrupt that lands
inside its own bookkeeping (`study.ask()` has written the RUNNING row, the objective has not begun; or
`tell` is halfway) leaves the trial RUNNING for good in a storage without heartbeats, and until the
grace period in one with them. So, while the trial loop runs, the two signals raise only where tuner's
own code runs (the objective, the callbacks, the loop's waits: `InterruptGuard.open`); one arriving
elsewhere is kept and raised at the next of those places.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["InterruptGuard"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class InterruptGuard:
    """While entered: SIGINT and SIGTERM (where their handler raises) are raised only inside `open()`."""

    def __init__(self) -> None:
        self._previous: dict[int, object] = {}
        self._pending: int | None = None
        self._depth = 0  # open() blocks entered

    def __enter__(self) -> InterruptGuard:
        if threading.current_thread() is threading.main_thread():
            for signum in _SIGNALS:
                handler = signal.getsignal(signum)
                if callable(handler):  # a default (kill) or ignored signal is left as it is
                    self._previous[signum] = handler
                    signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, exc_type, *_) -> None:
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        signum, self._pending = self._pending, None
        if exc_type is None and signum is not None:
            previous[signum](signum, None)  # arrived during the last trial's bookkeeping

    @contextlib.contextmanager
    def open(self) -> Iterator[None]:
        """Interrupts raise at once within the block (and one kept from before raises on entry)."""
        self._depth += 1
        try:
            self._raise_pending()
            yield
        finally:
            self._depth -= 1

    def _on_signal(self, signum: int, frame) -> None:
        if self._depth:
            self._previous[signum](signum, frame)
        elif self._pending is None:
            self._pending = signum

    def _raise_pending(self) -> None:
        signum, self._pending = self._pending, None
        if signum is not None:
            self._previous[signum](signum, None)

"""Preemption signals (SIGTERM, SIGINT) as a flag that training checks between steps."""

from __future__ import annotations

import contextlib
import signal


class PreemptionFlag:
    """Turns SIGTERM/SIGINT into a flag the loop checks between steps.

    Flags nest: a sweep holds one across its groups and each group's loop one inside it. A
    signal the outer flag caught before the inner was entered is the inner's from the start;
    one the inner caught is passed out to the outer when it exits, so that a signal arriving
    during a group's last step (its final evaluation and hooks, where the loop no longer
    checks) still stops the sweep before its next group instead of being dropped."""

    def __init__(self):
        self.signal: int | None = None
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            # Outside the main thread signals cannot be caught: leave them to the caller.
            with contextlib.suppress(ValueError):
                self._previous[sig] = signal.signal(sig, self._handle)
        self.signal = next((outer.signal for outer in self._outer() if outer.signal), None)
        return self

    def _handle(self, signum, frame):
        self.signal = signum

    def _outer(self) -> list[PreemptionFlag]:
        """The flags whose handlers this one replaced (an enclosing flag's, at most one)."""
        handlers = {getattr(h, "__self__", None) for h in self._previous.values()}
        return [h for h in handlers if isinstance(h, PreemptionFlag)]

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        for outer in self._outer():
            outer.signal = outer.signal or self.signal

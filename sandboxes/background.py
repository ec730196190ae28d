"""When a backend's background work (warm-pool refills, removals) may run: in the quiet gaps between
its sandboxes' commands, so it does not take the CPU from them.

A fork announces a command to come and every command's end starts a gap: the work waits until no
command runs and none has started or ended for QUIET_GAP seconds, but never longer than
YIELD_AT_MOST in all. G samples at a pivot run back to back (reset, step, reset, ...) with gaps
of a millisecond or two between them, so their warm forks are refilled after the group, while the
policy generates, not during the samples' commands (on two cores the refills made an editor call
take twice as long).
"""

from __future__ import annotations

import threading
import time

# How long the backend must have been idle (no command running, started or ended, no fork) before
# background work goes ahead.
QUIET_GAP = 0.05
# The longest background work waits for such a gap before going ahead anyway.
YIELD_AT_MOST = 1.0


class QuietGate:
    """Counts a backend's running commands; `wait_quiet()` blocks background work until a quiet gap."""

    def __init__(self, gap: float = QUIET_GAP, at_most: float = YIELD_AT_MOST) -> None:
        self.gap = gap
        self.at_most = at_most
        self.running = 0
        self.closed = False
        self._active_at = float("-inf")
        self._condition = threading.Condition()

    def touch(self) -> None:
        """Something a command will follow happened now (a fork was handed out)."""
        with self._condition:
            self._active_at = time.monotonic()

    def __enter__(self) -> None:
        with self._condition:
            self.running += 1
            self._active_at = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        with self._condition:
            self.running -= 1
            self._active_at = time.monotonic()
            self._condition.notify_all()

    def wait_quiet(self) -> None:
        """Block until no command has run for `gap` seconds (at most `at_most` seconds, or until closed)."""
        deadline = time.monotonic() + self.at_most
        with self._condition:
            while not self.closed:
                now = time.monotonic()
                if now >= deadline:
                    return
                if self.running == 0:
                    idle = now - self._active_at
                    if idle >= self.gap:
                        return
                    self._condition.wait(min(self.gap - idle, deadline - now))
                else:
                    self._condition.wait(deadline - now)

    def close(self) -> None:
        """Release every waiter now (the backend is closing)."""
        with self._condition:
            self.closed = True
            self._condition.notify_all()

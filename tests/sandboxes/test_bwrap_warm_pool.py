"""The bubblewrap warm pool's background work waits for the gaps between commands (bounded)."""

from __future__ import annotations

import threading
import time

from sandbox_fixtures import FAST_LIMITS

from pivot_envs.sandboxes.bwrap_backend import YIELD_AT_MOST, BwrapBackend


def snapshot_and_busy(backend, seconds):
    """A snapshot with no warm forks yet, and a thread running `sleep seconds` in another sandbox."""
    sandbox = backend.create()
    sandbox.run("echo hi > f")
    snapshot = sandbox.snapshot()
    worker = threading.Thread(target=sandbox.run, args=(f"sleep {seconds}",))
    worker.start()
    time.sleep(0.2)  # the command is running
    backend.prewarm(snapshot)
    return sandbox, snapshot, worker


def test_the_pool_makes_no_fork_while_a_command_runs_and_fills_once_it_ends(has_bwrap):
    with BwrapBackend(has_bwrap, FAST_LIMITS, warm_pool=1) as backend:
        sandbox, snapshot, worker = snapshot_and_busy(backend, YIELD_AT_MOST * 0.8)
        time.sleep(YIELD_AT_MOST * 0.5)
        assert backend._pools[snapshot.ref].qsize() == 0
        worker.join()
        assert backend.wait_warm(snapshot, timeout=20)
        sandbox.close()


def test_a_long_command_holds_the_pool_back_no_longer_than_the_bound(has_bwrap):
    with BwrapBackend(has_bwrap, FAST_LIMITS, warm_pool=1) as backend:
        sandbox, snapshot, worker = snapshot_and_busy(backend, 2.8)
        assert backend.wait_warm(snapshot, timeout=2.4)  # the command is still running
        assert worker.is_alive()
        worker.join()
        sandbox.close()

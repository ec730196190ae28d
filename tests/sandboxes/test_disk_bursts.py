"""The disk limit against bursts (boundary audit F7): the limit is a poll (every CHECK_EVERY
seconds), so one command gets past the limit before a check (by what it writes in 0.1 s; with
`fallocate`, which both backends' seccomp filter now refuses, it was gigabytes); the
sandbox keeps its files. A sandbox over its limit may not grow further, so what it holds stays
bounded by one burst however many commands follow. Both backends (the `backend` and `sandbox`
fixtures)."""

from __future__ import annotations

import dataclasses

from pivot_envs.sandboxes.channel import DiskFloor
from pivot_envs.sandboxes.manifest import disk_usage

MB = 1 << 20
FILES, FILE_MB = 8, 30  # one command's burst: at most 240 MB, written by 8 writers at once


def held(sandbox) -> int:
    """Bytes the sandbox's writable tree holds on the host (what the disk check counts)."""
    root = getattr(sandbox, "upper", None) or getattr(sandbox, "directory", None)
    assert root is not None, "the host cannot read this sandbox's tree"
    return disk_usage(root)


def burst(step: int) -> str:
    # All files at once, then a wait, so the command is still running at the check.
    return (
        f"for i in $(seq {FILES}); do head -c {FILE_MB}M /dev/zero > /tmp/burst{step}-$i & done; wait;"
        " echo allocated; sleep 1"
    )


def test_repeated_fallocate_bursts_leave_the_sandbox_holding_one_burst(backend):
    backend.limits = dataclasses.replace(backend.limits, disk_mb=20)
    sandbox = backend.new_sandbox("/app")
    try:
        first = sandbox.run(burst(1))
        after_first = held(sandbox)
        later = [sandbox.run(burst(step)) for step in (2, 3)]
        # Before: each command added its own burst (720 MB after three). Now the two later commands,
        # started in a sandbox far over its limit, do not run: it holds at most the first burst.
        total = held(sandbox)
        most = DiskFloor.most(backend.limits)
        # Before: each command added its own burst (720 MB after three). Now a later command started in a
        # sandbox far over its limit does not run, and one started just over it is killed once it grows.
        assert total < most + FILES * FILE_MB * MB, (after_first / MB, total / MB)
        assert total <= max(after_first, most) + 2 * FILES * FILE_MB * MB // 3, (after_first / MB, total / MB)
        assert first.exit_code == 137 and "disk limit (20 MB)" in first.output, first.output
        for result in later:
            assert result.exit_code == 137, result.output
            assert "not run" in result.output or "wrote more" in result.output, result.output
            if "not run" in result.output:  # nothing of the command before it either
                assert "allocated" not in result.output, result.output
    finally:
        sandbox.close()


def test_a_sandbox_over_its_limit_runs_commands_that_do_not_grow_it_and_recovers_below_it(backend):
    backend.limits = dataclasses.replace(backend.limits, disk_mb=20)
    sandbox = backend.new_sandbox("/app")
    try:
        # Left just over its limit (by a command too quick for any check, or killed at one).
        sandbox.run("head -c 25M /dev/zero > /app/a")
        assert held(sandbox) > 20 * MB
        # A command that writes nothing runs to its end (before: killed at its first check).
        quiet = sandbox.run("sleep 0.4; ls /app; echo ok")
        assert quiet.exit_code == 0 and quiet.output == "a\nok\n", quiet.output
        # One that makes the sandbox larger than at its start is killed at the first check that sees it.
        grows = sandbox.run("sleep 0.3; head -c 4M /dev/zero > /app/b; sleep 2; echo finished")
        assert grows.exit_code == 137 and "finished" not in grows.output, grows.output
        assert "over its disk limit (20 MB)" in grows.output, grows.output
        # Back under its limit (the command deleted files), the sandbox is checked as before.
        assert sandbox.run("rm /app/a /app/b; echo removed").output == "removed\n"
        normal = sandbox.run("head -c 10M /dev/zero > /app/c; sleep 0.4; echo fine")
        assert normal.exit_code == 0 and normal.output == "fine\n", normal.output
    finally:
        sandbox.close()

"""The command channel's request file, the quiet gate the warm pools' work waits on, and Docker's
warm forks: the set-up run ahead and the snapshot's digests reused by each fork's manifest."""

from __future__ import annotations

import hashlib
import os
import threading
import time

import pytest
from sandbox_fixtures import FAST_LIMITS

import pivot_envs.sandboxes.manifest as manifest_module
from pivot_envs.domains.terminal import image
from pivot_envs.sandboxes.background import QuietGate
from pivot_envs.sandboxes.channel import GO, REQUEST, Channel
from pivot_envs.sandboxes.docker_backend import DockerBackend
from pivot_envs.sandboxes.manifest import manifest

# Longer than the 64 KiB a pipe holds, shorter than the 128 KiB one argument of a process may be.
BIG = 100_000


def test_a_request_crosses_as_a_file_and_only_a_short_line_goes_through_the_fifo(tmp_path):
    channel = Channel(tmp_path)
    args = ["c" * BIG, "host", "0", "1", "0", "0", "60", "MARK", "", "5000"]
    seen: dict[str, bytes] = {}

    def server() -> None:
        # As runner.SERVER: the three paths opened once, "ready", then a request read through its descriptor.
        go = os.open(channel.directory / "in", os.O_RDWR)
        reply = os.open(channel.directory / "out", os.O_WRONLY)
        request = os.open(channel.directory / REQUEST, os.O_RDONLY)
        os.write(reply, b"ready drop\n")
        seen["fifo"] = os.read(go, 64)
        seen["request"] = os.pread(request, 2 * BIG, 0)
        os.write(reply, b"output\nMARK exit 3 2\n")  # the status, then what the command left running
        for descriptor in (go, reply, request):
            os.close(descriptor)

    thread = threading.Thread(target=server, daemon=True)
    thread.start()
    reply, status = channel.call(args, time.monotonic() + 60, "a test server")
    thread.join(timeout=60)
    assert (reply, status, channel.left_running) == (b"output", 3, 2)
    assert seen["fifo"] == GO
    assert seen["request"] == b"".join(arg.encode() + b"\0" for arg in args)
    # Once connected, the channel's paths are gone: nothing in the sandbox can open them.
    assert channel.isolated is True
    assert sorted(os.listdir(channel.directory)) == []
    channel.close()


def test_a_command_bigger_than_a_pipe_runs_intact_and_a_shorter_one_after_it_too(sandbox):
    text = "".join(chr(ord("a") + i % 26) for i in range(BIG))
    result = sandbox.run(f"x='{text}'; printf %s \"$x\" | md5sum")
    assert result.ok, result.output[-300:]
    assert result.output.split()[0] == hashlib.md5(text.encode()).hexdigest()
    # The request file is rewritten, not appended to: the short request is not read with the long one's tail.
    assert sandbox.run("echo short").output == "short\n"


def test_the_quiet_gate_holds_background_work_while_a_command_runs_and_for_a_gap_after():
    gate = QuietGate(gap=0.2, at_most=60)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (gate.wait_quiet(), done.set()), daemon=True)
    with gate:
        worker.start()
        assert not done.wait(0.5)  # a command runs: the work waits (up to 60 s)
    ended = time.monotonic()
    assert done.wait(30)
    assert time.monotonic() - ended >= 0.2  # the gap after the command's end
    gate.touch()
    started = time.monotonic()
    gate.wait_quiet()
    assert time.monotonic() - started >= 0.15  # a fork announces a command: another gap


def test_the_quiet_gate_lets_background_work_go_after_its_bound_or_once_closed():
    bounded = QuietGate(gap=0.05, at_most=0.3)
    with bounded:
        bounded.wait_quiet()  # returns after at most 0.3 s while the command still runs
    closing = QuietGate(gap=0.05, at_most=60)
    done = threading.Event()
    with closing:
        threading.Thread(target=lambda: (closing.wait_quiet(), done.set()), daemon=True).start()
        closing.close()
        assert done.wait(30)


@pytest.fixture
def docker_snapshot(has_docker):
    """A Docker backend (warm pool of 2, a set-up command) and a snapshot with a small workspace."""
    backend = DockerBackend(FAST_LIMITS, warm_pool=2)
    sandbox = backend.create(image.image_tag(), "/app")
    assert sandbox.run("mkdir pkg && echo 'def f(): return 1' > pkg/mod.py && echo hi > notes").ok
    snapshot = sandbox.snapshot()
    sandbox.close()
    yield backend, snapshot
    backend.close()


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("echo started > /tmp/warm && { sleep 60 >/dev/null 2>&1 & }", "started\nhi\n"),
        ("exit 3", "hi\n"),  # a set-up that fails still leaves a fork that works
    ],
)
def test_a_warm_docker_container_has_the_snapshots_state_and_ran_the_set_up(docker_snapshot, setup, expected):
    backend, snapshot = docker_snapshot
    backend.prewarm(snapshot, setup=setup)
    assert backend.wait_warm(snapshot, timeout=120)
    fork = backend.fork(snapshot)
    assert fork.run("cat /tmp/warm notes 2>/dev/null").output == expected
    if "sleep" in setup:
        assert "sleep 60" in fork.run("ps -eo args").output  # what the set-up started still runs
    fork.close()


def test_a_docker_forks_manifest_reuses_the_snapshots_digests_and_sees_every_change(
    docker_snapshot, monkeypatch
):
    backend, snapshot = docker_snapshot
    backend.prewarm(snapshot)
    assert backend.wait_warm(snapshot, timeout=120)
    left_alone, rewritten = backend.fork(snapshot), backend.fork(snapshot)
    assert set(left_alone.known.files) == {"pkg/mod.py", "notes"}
    reads = []
    real = manifest_module._digest
    monkeypatch.setattr(
        manifest_module,
        "_digest",
        lambda directory, name, *rest: reads.append(name) or real(directory, name, *rest),
    )
    before = left_alone.run("cat notes", files=True).files
    assert reads == []  # nothing it left alone is read again
    assert before == manifest(left_alone.workspace())
    reads.clear()
    # A same-size rewrite in the same tick with its mtime put back (touch -r): size, mtime and
    # inode as they were, but the copy-up and the write gave it a new ctime.
    after = rewritten.run(
        "touch -r pkg/mod.py /tmp/t && echo 'def f(): return 2' > pkg/mod.py && touch -r /tmp/t pkg/mod.py",
        files=True,
    ).files
    assert [os.path.basename(path) for path in reads] == ["mod.py"]
    assert after["pkg/mod.py"] != before["pkg/mod.py"]
    assert after["pkg/mod.py"].endswith(hashlib.md5(b"def f(): return 2\n").hexdigest())
    assert {p: e for p, e in after.items() if p != "pkg/mod.py"} == {
        p: e for p, e in before.items() if p != "pkg/mod.py"
    }
    left_alone.close()
    rewritten.close()


def test_a_file_a_docker_fork_changed_before_its_stamp_is_not_taken_from_the_snapshot(docker_snapshot):
    # Racy case: the digests hold for the image's files only; a write is never older than a record.
    backend, snapshot = docker_snapshot
    fork = backend.fork(snapshot)  # a cold fork: no warm one was made
    known = fork.known
    path = fork.workspace() / "notes"
    entry = known.files["notes"]
    info = path.stat()
    assert entry[:4] == (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    known.stamp_ns = max(info.st_mtime_ns, info.st_ctime_ns)  # a stamp within the record's tick
    assert known.digest("notes", info) is None
    fork.close()

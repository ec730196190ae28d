"""What a command leaves running after its shell exits: counted by the sandbox (CommandResult.left_running),
after the command and before its files are read, and never charged to a later command."""

from __future__ import annotations

import time


def test_a_plain_command_leaves_nothing_running(sandbox):
    assert sandbox.run("echo hi; sleep 0.1 | cat", files=True).left_running == 0
    assert sandbox.run("true").left_running == 0


def test_a_background_job_a_new_session_and_a_delayed_writer_are_counted(sandbox):
    assert sandbox.run("sleep 5 &").left_running == 1
    assert sandbox.run("setsid sleep 5 &", files=True).left_running == 1
    # A subshell and its sleep: still alive at the count, its write lands after the files were read.
    result = sandbox.run("( sleep 1; touch late ) &", files=True)
    assert result.left_running >= 1 and "late" not in result.files
    assert sandbox.run("nohup sleep 5 >/dev/null 2>&1 & disown", clean=True).left_running == 1


def test_a_background_job_that_ended_is_not_counted_and_its_effect_is_read(sandbox):
    result = sandbox.run("( touch early ) & wait", files=True)
    assert result.left_running == 0 and "early" in result.files


def test_what_an_earlier_command_left_running_is_not_charged_to_a_later_one(sandbox):
    # A daemon, and a loop that forks a child every 0.1 s: both started by the first command.
    assert sandbox.run("sleep 30 & ( while :; do sleep 0.1; done ) &").left_running >= 2
    for _ in range(3):
        assert sandbox.run("echo next; sleep 0.3", files=True).left_running == 0
    assert sandbox.run("sleep 30 &").left_running == 1
    assert sandbox.stop_processes()
    assert sandbox.run("true").left_running == 0


def test_docker_counts_through_the_channel_where_it_reports_and_not_through_docker_exec(has_docker):
    from pivot_envs.domains.terminal.image import image_tag
    from pivot_envs.sandboxes.docker_backend import DockerBackend

    backend = DockerBackend(warm_pool=0)
    try:
        sandbox = backend.create(image_tag(), "/app")
        sandbox.merged = None  # the runner prints the whole report, as for a daemon on another machine
        assert sandbox.run("setsid sleep 5 &", files=True).left_running == 1
        assert sandbox.run("echo hi", files=True).left_running == 0
    finally:
        backend.close()
    backend = DockerBackend(warm_pool=0, channel=False)
    try:
        sandbox = backend.create(image_tag(), "/app")
        start = time.monotonic()
        assert sandbox.run("sleep 5 &").left_running is None  # no server to count
        assert time.monotonic() - start < 5
    finally:
        backend.close()

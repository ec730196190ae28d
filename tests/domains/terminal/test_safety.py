"""The safety suite: hostile commands stay inside their limits on both backends, the env keeps
serving episodes, the host file stays unread and untouched, and nothing is left behind."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest
from pivot_envs.domains.terminal import TerminalEnv, bundled_pivots
from pivot_envs.domains.terminal.backends import BWRAP_PREFIX, DOCKER_PREFIX, LABEL, NOBODY

from pivot_envs.sandbox import SandboxLimits

PIVOT = "terminal/count-error-lines/t1"
LIMITS = SandboxLimits(timeout=2.0, processes=64, file_mb=16, memory_mb=512, disk_mb=100)
SECRET = "host-secret-4f1c9"


def leftovers() -> dict[str, int]:
    """What sandboxes could leave on the host: containers, images, processes, mounts, temp dirs."""
    counts = {"mounts": len(Path("/proc/self/mountinfo").read_text().splitlines()),
              "tmp_dirs": len(list(Path(tempfile.gettempdir()).glob(f"{BWRAP_PREFIX}*")))
              + len(list(Path(tempfile.gettempdir()).glob(f"{DOCKER_PREFIX}*"))),
              "sandbox_processes": 0, "zombies": 0}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            uid = entry.stat().st_uid
            zombie = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0] == b"Z"
        except (OSError, IndexError):
            continue
        # The bubblewrap sandboxes run as nobody; Docker's as root in containers, so look for the
        # suite's own long sleeps by their arguments. Zombies are counted apart: they are gone
        # only where the host's PID 1 reaps (not in every container a CI job runs in).
        if uid == NOBODY or argv[:2] in ([b"sleep", b"1000"], [b"sleep", b"100000"]):
            counts["zombies" if zombie else "sandbox_processes"] += 1
    try:
        import docker

        client = docker.from_env()
        counts["containers"] = len(client.containers.list(all=True, filters={"label": [LABEL]}))
        counts["images"] = len(client.images.list(filters={"label": [LABEL]}))
    except Exception:  # no daemon: the Docker counts do not apply
        pass
    return counts


@pytest.fixture(scope="module", params=["bwrap", "docker"])
def suite(request, tmp_path_factory):
    request.getfixturevalue("has_bwrap" if request.param == "bwrap" else "has_docker")
    host_file = tmp_path_factory.mktemp("host") / "secret.txt"
    host_file.write_text(SECRET)
    # Sandboxes of earlier tests may still be exiting: start from a settled count.
    deadline = time.monotonic() + 10
    while leftovers()["sandbox_processes"] and time.monotonic() < deadline:
        time.sleep(0.2)
    before = leftovers()
    pivots = [p for p in bundled_pivots() if p.id == PIVOT]
    env = TerminalEnv(pivots, sandbox=request.param, limits=LIMITS, warm_pool=1)
    state = {"env": env, "kind": request.param, "before": before, "host_file": host_file, "mtime": host_file.stat().st_mtime_ns}
    yield state
    env.close()


def attack(suite, command: str) -> dict:
    env = suite["env"]
    env.reset(options={"pivot": PIVOT})
    start = time.monotonic()
    _, _, terminated, _, info = env.step(f"```bash\n{command}\n```")
    assert terminated and info["valid"], info
    assert time.monotonic() - start < LIMITS.timeout + 10
    return info


def serves_next_episode(suite) -> None:
    env = suite["env"]
    env.reset(options={"pivot": PIVOT})
    _, reward, _, _, info = env.step(env.pivot.expert)
    assert reward == 1.0 and info["output"]["output"] == "3\n", info


def test_a_fork_bomb_is_contained(suite):
    # The trailing sleep keeps the sandbox alive while the bomb runs into the process limit.
    info = attack(suite, ":(){ :|:& };:; sleep 30")
    assert info["output"]["timed_out"]
    serves_next_episode(suite)


def test_rm_rf_root_only_destroys_the_sandbox(suite, rootfs):
    attack(suite, "rm -rf / --no-preserve-root")
    assert (rootfs / "usr" / "bin" / "bash").exists()
    assert suite["host_file"].read_text() == SECRET
    serves_next_episode(suite)


def test_endless_output_is_cut(suite):
    info = attack(suite, "yes")
    assert info["output"]["truncated"] > 0
    assert len(info["output"]["output"]) <= LIMITS.output_bytes + 100
    serves_next_episode(suite)


def test_a_command_that_never_ends_is_killed_at_the_timeout(suite):
    info = attack(suite, "sleep 100000")
    assert info["output"]["timed_out"] and info["output"]["exit_code"] == 137
    serves_next_episode(suite)


def test_a_background_daemon_does_not_hold_the_step(suite):
    info = attack(suite, "nohup sleep 1000 > /dev/null 2>&1 &")
    assert info["output"]["exit_code"] == 0 and not info["output"]["timed_out"]
    assert info["output"]["seconds"] < LIMITS.timeout
    serves_next_episode(suite)


def test_a_host_file_outside_the_sandbox_cannot_be_read(suite):
    info = attack(suite, f"cat {suite['host_file']}; ls {suite['host_file'].parent}; echo done > {suite['host_file']}")
    assert SECRET not in info["output"]["output"]
    assert suite["host_file"].read_text() == SECRET
    assert suite["host_file"].stat().st_mtime_ns == suite["mtime"]
    serves_next_episode(suite)


def test_links_planted_where_the_host_reads_results_are_not_followed(suite):
    # The host reads the output file and the workspace from the sandbox's directories; a link
    # planted there must not make it read a host file (or list a host directory) instead.
    host_file, host_dir = suite["host_file"], suite["host_file"].parent
    info = attack(suite, f"ln -sfn {host_file} /.pivot/out")
    assert SECRET not in info["output"]["output"]
    info = attack(suite, f"mkdir -p /tmp/x && ln -s {host_file} /tmp/x/out && rm -rf /.pivot; ln -sfn /tmp/x /.pivot; "
                         f"cd / && rm -rf /app; ln -sfn {host_dir} /app")
    assert SECRET not in info["output"]["output"]
    assert all("secret" not in change["path"] for change in info["output"]["files_changed"])
    serves_next_episode(suite)


def test_a_network_connection_cannot_be_opened(suite):
    info = attack(suite, "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=1); print('CONNECTED')\"")
    assert "CONNECTED" not in info["output"]["output"] and info["output"]["exit_code"] != 0
    serves_next_episode(suite)


def test_filling_the_disk_stops_at_the_file_size_limit(suite):
    free_before = os.statvfs(tempfile.gettempdir()).f_bavail
    info = attack(suite, "dd if=/dev/zero of=/app/fill bs=1M count=100000; echo \"dd exit $?\"; ls -l /app/fill")
    assert "dd exit 0" not in info["output"]["output"]
    assert str(LIMITS.file_mb * 1024 * 1024) in info["output"]["output"]
    block = os.statvfs(tempfile.gettempdir()).f_frsize
    assert (free_before - os.statvfs(tempfile.gettempdir()).f_bavail) * block < 200 * 1024 * 1024
    serves_next_episode(suite)


def test_filling_the_disk_with_many_files_stops_at_the_disk_limit(suite):
    info = attack(suite, "for i in $(seq 1 400); do head -c 16M /dev/zero > /app/f$i; done; echo finished; sleep 30")
    output = info["output"]["output"]
    assert "finished" not in output and "disk limit (100 MB)" in output, output[-300:]
    assert info["output"]["exit_code"] == 137 and not info["output"]["timed_out"]
    written = sum(change["path"].startswith("f") for change in info["output"]["files_changed"]) * 16
    assert 100 <= written < 400  # stopped within a few checks of the limit, long before 400 files
    serves_next_episode(suite)


def test_killing_every_process_in_the_sandbox_is_the_commands_failure_not_the_envs(suite):
    info = attack(suite, "kill -9 -1")
    assert info["output"]["exit_code"] != 0
    serves_next_episode(suite)


def test_nothing_is_left_behind_after_the_suite(suite):
    suite["env"].close()
    deadline = time.monotonic() + 10  # killed processes are reaped asynchronously
    while leftovers() != suite["before"] and time.monotonic() < deadline:
        time.sleep(0.2)
    after, before = leftovers(), suite["before"]
    # One known exception: when a command kills the sandbox's command server (`kill -9 -1` above),
    # bubblewrap exits as soon as its init reports that, before the init has exited, so the init
    # becomes an orphan of the host's PID 1. Where PID 1 does not reap, it stays a zombie. Every
    # other way a sandbox ends is reaped by this process (close, time limits, forks, the warm pool).
    assert after["zombies"] - before["zombies"] <= (1 if suite["kind"] == "bwrap" else 0)
    assert {**after, "zombies": 0} == {**before, "zombies": 0}

"""The safety suite: hostile commands stay inside their limits on both backends, the env keeps
serving episodes, the host file stays unread and untouched, and nothing is left behind."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from pivot_envs.domains.terminal import TerminalEnv, bundled_pivots
from pivot_envs.sandboxes import CommandRejected, SandboxLimits, cgroups
from pivot_envs.sandboxes.bwrap_backend import BwrapBackend
from pivot_envs.sandboxes.channel import Channel
from pivot_envs.sandboxes.cleanup import BWRAP_PREFIX, DOCKER_PREFIX, LABEL, OWNER_LABEL, gc
from pivot_envs.sandboxes.processes import NOBODY
from pivot_envs.sandboxes.runner import runner_argv

PIVOT = "terminal/count-error-lines/t1"
LIMITS = SandboxLimits(timeout=2.0, processes=64, file_mb=16, memory_mb=512, disk_mb=100)
SECRET = "host-secret-4f1c9"


def leftovers() -> dict[str, int]:
    """What this process's sandboxes could leave on the host: containers, images, processes, mounts, temp dirs.
    Only this process's are counted (its owner label, its pid in the names, its cgroups), so that sandboxes
    another program runs on the machine meanwhile do not count."""
    pid = os.getpid()
    counts = {
        "mounts": len(Path("/proc/self/mountinfo").read_text().splitlines()),
        "tmp_dirs": len(list(Path(tempfile.gettempdir()).glob(f"{BWRAP_PREFIX}{pid}-*")))
        + len(list(Path(tempfile.gettempdir()).glob(f"{DOCKER_PREFIX}{pid}-*"))),
        "sandbox_processes": 0,
        "zombies": 0,
    }
    containers: list[str] = []
    try:
        import docker

        client = docker.from_env()
        labelled = {"label": [LABEL]}
        mine = f"{os.uname().nodename}:{pid}:"

        def owned(items: list[dict]) -> list[dict]:
            return [i for i in items if (i.get("Labels") or {}).get(OWNER_LABEL, "").startswith(mine)]

        containers = [c["Id"] for c in owned(client.api.containers(all=True, filters=labelled))]
        counts["containers"] = len(containers)
        counts["images"] = len(owned(client.api.images(filters=labelled)))
    except Exception:  # no daemon: the Docker counts do not apply
        pass
    found = cgroups.hierarchy()
    ours = f"/{cgroups.PREFIX}{pid}/"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            uid = entry.stat().st_uid
            zombie = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0] == b"Z"
            cgroup = (entry / "cgroup").read_text()
        except (OSError, IndexError):
            continue
        # The bubblewrap sandboxes run as nobody, in this process's cgroups where there are any; Docker's as
        # root in this process's containers, so look for the suite's own long sleeps by their arguments.
        # Zombies are counted apart, by uid alone (an exited process leaves its cgroup): they are gone
        # only where the host's PID 1 reaps (not in every container a CI job runs in).
        if zombie:
            counts["zombies"] += uid == NOBODY
        elif uid == NOBODY and (isinstance(found, str) or ours in cgroup):
            counts["sandbox_processes"] += 1
        elif argv[:2] in ([b"sleep", b"1000"], [b"sleep", b"100000"]) and any(
            c in cgroup for c in containers
        ):
            counts["sandbox_processes"] += 1
    if not isinstance(found, str):  # bubblewrap sandboxes' cgroups (this process's parents)
        counts["cgroups"] = sum(1 for parent in found.parents for entry in parent.iterdir() if entry.is_dir())
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
    state = {
        "env": env,
        "kind": request.param,
        "before": before,
        "host_file": host_file,
        "mtime": host_file.stat().st_mtime_ns,
    }
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
    info = attack(
        suite, f"cat {suite['host_file']}; ls {suite['host_file'].parent}; echo done > {suite['host_file']}"
    )
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
    info = attack(
        suite,
        f"mkdir -p /tmp/x && ln -s {host_file} /tmp/x/out && rm -rf /.pivot; ln -sfn /tmp/x /.pivot; "
        f"cd / && rm -rf /app; ln -sfn {host_dir} /app",
    )
    assert SECRET not in info["output"]["output"]
    assert all("secret" not in change["path"] for change in info["output"]["files_changed"])
    serves_next_episode(suite)


def test_a_network_connection_cannot_be_opened(suite):
    info = attack(
        suite,
        "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=1); print('CONNECTED')\"",
    )
    assert "CONNECTED" not in info["output"]["output"] and info["output"]["exit_code"] != 0
    serves_next_episode(suite)


def test_filling_the_disk_stops_at_the_file_size_limit(suite):
    free_before = os.statvfs(tempfile.gettempdir()).f_bavail
    info = attack(
        suite, 'dd if=/dev/zero of=/app/fill bs=1M count=100000; echo "dd exit $?"; ls -l /app/fill'
    )
    assert "dd exit 0" not in info["output"]["output"]
    assert str(LIMITS.file_mb * 1024 * 1024) in info["output"]["output"]
    block = os.statvfs(tempfile.gettempdir()).f_frsize
    assert (free_before - os.statvfs(tempfile.gettempdir()).f_bavail) * block < 200 * 1024 * 1024
    serves_next_episode(suite)


def test_filling_the_disk_with_many_files_stops_at_the_disk_limit(suite):
    info = attack(
        suite, "for i in $(seq 1 400); do head -c 16M /dev/zero > /app/f$i; done; echo finished; sleep 30"
    )
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


def step_action(suite, action) -> tuple[float, dict]:
    env = suite["env"]
    env.reset(options={"pivot": PIVOT})
    _, reward, _, _, info = env.step(action)
    return reward, info


def limits_hold(suite) -> None:
    """The limits are in force in the next command: what `ulimit` shows, and a 2 GiB allocation fails."""
    info = attack(suite, "ulimit -f; ulimit -v; python3 -c 'b = bytearray(2 << 30); print(\"ALLOCATED\")'")
    lines = info["output"]["output"].split("\n")
    assert lines[0] == str(LIMITS.file_mb * 1024)  # ulimit -f counts 1024-byte blocks in bash
    if suite["kind"] == "bwrap":
        assert lines[1] == str(LIMITS.memory_mb * 1024)
    assert "ALLOCATED" not in lines, info["output"]["output"]


@pytest.mark.parametrize("where", ["tool_call", "bash_block", "hermes"])
def test_a_nul_byte_in_a_command_is_rejected_and_cannot_shift_the_limits(suite, where):
    # The server's request is NUL-separated: a NUL inside the command once shifted the arguments
    # after it, so the command chose its own process, memory and file limits.
    command = "python3 -c 'b = bytearray(2 << 30); print(1)'\x001000000\x00\x00unlimited\x00unlimited\x00999"
    action = {
        "tool_call": {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "bash", "arguments": json.dumps({"command": command})},
                }
            ],
        },
        "bash_block": f"```bash\n{command}\n```",
        "hermes": "<tool_call>"
        + json.dumps({"name": "bash", "arguments": {"command": command}})
        + "</tool_call>",
    }[where]
    reward, info = step_action(suite, action)
    assert (reward, info["category"], info["valid"]) == (0.0, "invalid_command", True), info
    assert "NUL byte" in info["detail"]
    limits_hold(suite)
    serves_next_episode(suite)


def test_a_lone_surrogate_in_a_command_is_rejected_with_a_category(suite):
    reward, info = step_action(suite, "```bash\necho \ud800 > /app/x\n```")
    assert (reward, info["category"], info["valid"]) == (0.0, "invalid_command", True), info
    json.dumps(info)  # the info stays encodable
    serves_next_episode(suite)


def test_control_characters_run_as_bash_sees_them_and_the_limits_still_hold(suite):
    controls = "".join(chr(code) for code in range(1, 32) if chr(code) not in "\n") + "\x7f"
    info = attack(suite, f"printf '%s' {shlex.quote(controls)} | od -An -tx1 | tr -d ' \\n'; echo")
    assert info["output"]["output"].strip() == controls.encode().hex()
    limits_hold(suite)
    serves_next_episode(suite)


def test_a_command_cannot_raise_its_limits(suite):
    info = attack(suite, 'ulimit -f unlimited; echo "f $?"; ulimit -v unlimited; echo "v $?"; ulimit -f')
    output = info["output"]["output"]
    assert "f 1" in output and str(LIMITS.file_mb * 1024) in output.split("\n")[-2], output
    if suite["kind"] == "bwrap":
        assert "v 1" in output, output
    serves_next_episode(suite)


# Eight children that each allocate and touch 200 MB, then report through a pipe and wait; the
# parent counts those that are still alive holding it once every child has reported or died.
MEMORY_BOMB = """
import os, time
children = []
for _ in range(8):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        b = bytearray(200 << 20)
        b[::4096] = b"x" * len(b[::4096])
        os.write(w, b"h")
        time.sleep(5)
        os._exit(0)
    os.close(w)
    children.append((pid, r))
held = [pid for pid, r in children if os.read(r, 1) == b"h"]
time.sleep(0.2)
print("HOLDING", sum(os.waitpid(pid, os.WNOHANG) == (0, 0) for pid in held), flush=True)
"""


def test_a_memory_bomb_spread_over_many_processes_is_bounded_for_the_whole_sandbox(suite):
    # Each process stays under the per-process address-space limit (512 MB); together they ask for
    # 1.6 GB. Only a limit on the whole sandbox (Docker's, or the bubblewrap sandbox's cgroup) holds.
    if suite["kind"] == "bwrap" and not cgroups.available():
        pytest.skip(f"no cgroup for bubblewrap sandboxes here: {cgroups.hierarchy()}")
    # Run in the sample's sandbox with a longer time limit than the suite's: on a loaded machine the
    # probe alone can take two seconds, and a timeout would make it pass without saying anything.
    env = suite["env"]
    env.reset(options={"pivot": PIVOT})
    result = env.sandbox.run(f"python3 -c {shlex.quote(MEMORY_BOMB)}", timeout=20)
    holding = [line for line in result.output.split("\n") if line.startswith("HOLDING ")]
    assert holding and 1 <= int(holding[0].split()[1]) <= 2, result.output
    serves_next_episode(suite)


def test_a_fork_bomb_stops_at_the_sandboxs_process_limit(suite):
    if suite["kind"] == "bwrap" and not cgroups.available():
        pytest.skip(f"no cgroup for bubblewrap sandboxes here: {cgroups.hierarchy()}")
    # Children that sleep, forked until fork fails: how many started is bounded by the sandbox's limit.
    forker = (
        "import os, time\nn = 0\ntry:\n    while n < 1000:\n        if os.fork() == 0:\n"
        "            time.sleep(5)\n            os._exit(0)\n        n += 1\nexcept OSError:\n    pass\n"
        "print('STARTED', n, flush=True)\n"
    )
    info = attack(suite, f"python3 -c {shlex.quote(forker)}")
    started = [line for line in info["output"]["output"].split("\n") if line.startswith("STARTED ")]
    bound = LIMITS.processes + (cgroups.INFRASTRUCTURE_PROCESSES if suite["kind"] == "bwrap" else 0)
    assert started and 10 < int(started[0].split()[1]) <= bound, info["output"]["output"]
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


def test_the_runner_refuses_a_command_that_would_not_cross_intact():
    with pytest.raises(CommandRejected, match="NUL byte"):
        runner_argv("echo a\x00b", 1.0, LIMITS, "M")
    with pytest.raises(CommandRejected, match="surrogate"):
        runner_argv("echo \udc80", 1.0, LIMITS, "M")


def test_the_command_channel_refuses_a_request_holding_a_nul(tmp_path):
    # Checked before the channel is opened: nothing is written to the server.
    with pytest.raises(CommandRejected, match="NUL"):
        Channel(tmp_path).call(["x\x00y", *["0"] * 9], time.monotonic() + 1, "a test sandbox")


@pytest.fixture
def cgroups_here():
    """A skip where bubblewrap sandboxes get no cgroup here."""
    if not cgroups.available():
        pytest.skip(f"no cgroup for bubblewrap sandboxes here: {cgroups.hierarchy()}")


@pytest.fixture
def cgroup_backend(has_bwrap, cgroups_here):
    """A bubblewrap backend without a warm pool whose sandboxes each get a cgroup."""
    backend = BwrapBackend(has_bwrap, LIMITS, warm_pool=0)
    yield backend
    backend.close()


def test_a_bubblewrap_sandbox_cgroup_is_gone_once_the_sandbox_is(cgroup_backend):
    sandbox = cgroup_backend.create("/app")
    sandbox.run("true")
    paths = sandbox.server.cgroup.paths
    assert all(path.is_dir() for path in paths)
    assert sandbox.server.process.pid in sandbox.server.cgroup.pids()
    memory = next(
        (
            path
            for path in paths
            if (path / "memory.limit_in_bytes").exists() or (path / "memory.max").exists()
        ),
        None,
    )
    limit_file = "memory.limit_in_bytes" if (memory / "memory.limit_in_bytes").exists() else "memory.max"
    assert int((memory / limit_file).read_text()) == LIMITS.memory_mb << 20
    sandbox.close()
    cgroup_backend.close()
    assert not any(path.exists() for path in paths)


def test_gc_removes_the_cgroups_a_dead_process_left(cgroups_here):
    found = cgroups.hierarchy()
    dead = subprocess.Popen(["true"])
    dead.wait()
    made = [parent.parent / f"{cgroups.PREFIX}{dead.pid}" / "leftover" for parent in found.parents]
    for path in made:
        path.mkdir(parents=True)
    assert gc()["cgroups"] >= len(made)  # what `pivotrl sandbox gc` runs
    assert not any(path.parent.exists() for path in made)


def test_the_interactive_shell_shares_the_bubblewrap_sandboxs_cgroup(cgroup_backend):
    sandbox = cgroup_backend.create("/app")
    shell = subprocess.Popen(
        sandbox.interactive_argv(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        shell.stdin.write("ulimit -v; sleep 30\n")
        shell.stdin.flush()
        assert shell.stdout.readline().strip() == str(LIMITS.memory_mb * 1024)
        # Seen from the host (inside, the cgroup namespace shows "/"): the shell's bwrap is in it.
        assert shell.pid in sandbox.server.cgroup.pids()
        assert sandbox.server.process.pid in sandbox.server.cgroup.pids()
    finally:
        shell.kill()
        shell.wait()

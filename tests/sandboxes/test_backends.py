"""Both sandbox backends against the real thing: bubblewrap and a Docker daemon."""

from __future__ import annotations

import dataclasses
import signal
import time

from pivot_envs.domains.terminal import image
from pivot_envs.sandboxes import Sandbox
from pivot_envs.sandboxes.cleanup import LABEL, OWNER_LABEL


def test_a_sandbox_implements_the_core_protocol(sandbox):
    assert isinstance(sandbox, Sandbox)
    sandbox.close()


def test_run_reports_output_exit_code_and_starts_in_the_workdir(sandbox):
    result = sandbox.run("pwd; echo to-stderr >&2; exit 7")
    assert result.exit_code == 7
    assert result.output == "/app\nto-stderr\n"
    assert not result.timed_out


def test_shell_state_carries_over_between_commands(sandbox):
    sandbox.run("mkdir -p /app/sub && cd /app/sub && export GREETING='hello world'")
    assert sandbox.run('pwd; echo "$GREETING"').output == "/app/sub\nhello world\n"


def test_a_fork_starts_from_the_snapshot_and_does_not_touch_it(backend, sandbox):
    sandbox.run("echo v1 > f.txt && cd /tmp && export X=1")
    snapshot = sandbox.snapshot()
    first = backend.fork(snapshot)
    assert first.run("cat /app/f.txt; pwd; echo $X").output == "v1\n/tmp\n1\n"
    first.run("echo v2 > /app/f.txt")
    second = backend.fork(snapshot)
    assert second.run("cat /app/f.txt").output == "v1\n"
    first.close()
    second.close()


def test_files_lists_the_workspace_after_the_command(sandbox):
    result = sandbox.run(
        "mkdir d && echo hi > d/a.txt && ln -s d/a.txt link && chmod 600 d/a.txt", files=True
    )
    assert set(result.files) == {".", "d", "d/a.txt", "link"}  # "." the workspace's own entry
    assert result.files["."] == "d 755"
    assert result.files["d/a.txt"].startswith("f 600 ")
    assert result.files["link"] == "l 777 -> d/a.txt"


def test_files_also_reports_the_saved_shell_state_cut_at_its_bound(sandbox):
    from pivot_envs.sandboxes.protocol import SHELL_BYTES

    assert sandbox.run("mkdir -p /app/sub && cd /app/sub && export GREETING='hello world'").shell is None
    shell = sandbox.run(":", files=True).shell
    assert 'declare -x GREETING="hello world"\n' in shell and shell.endswith("cd -- /app/sub\n")
    shell = sandbox.run("export BIG=$(head -c 1000000 /dev/zero | tr '\\0' a)", files=True).shell
    assert len(shell) < SHELL_BYTES + 100 and "bytes of output cut" in shell
    assert shell.endswith("cd -- /app/sub\n")  # the tail half is kept


def test_the_timeout_kills_the_whole_process_tree(sandbox):
    start = time.monotonic()
    result = sandbox.run("(sleep 3; echo late > /app/late.txt) & sleep 100", timeout=1)
    assert result.timed_out and result.exit_code == 137
    assert time.monotonic() - start < 5
    time.sleep(2.5)
    assert sandbox.run("ls /app").output == ""


def test_a_command_over_the_disk_limit_is_killed_and_the_sandbox_keeps_its_files(backend, sandbox):
    backend.limits = dataclasses.replace(backend.limits, disk_mb=40)
    # Paced so that the host's poll (every 0.1 s) finds the sandbox over 40 MB before it holds twice
    # that: a sandbox left beyond DiskFloor.most is refused its next command, by design, and an
    # unpaced writer on a loaded machine got there between two polls (CI, docker).
    result = sandbox.run(
        "for i in $(seq 1 100); do head -c 8M /dev/zero > big$i; sleep 0.5; done; echo finished"
    )
    assert (
        result.exit_code == 137 and "disk limit (40 MB)" in result.output and "finished" not in result.output
    )
    after = sandbox.run("ls big* | wc -l; rm big*; echo next")
    assert 5 <= int(after.output.split()[0]) < 100 and after.output.endswith("next\n")


def test_stdin_is_closed_and_pagers_and_colours_are_off(sandbox):
    result = sandbox.run("cat; echo $PAGER $GIT_PAGER $TERM $NO_COLOR", timeout=3)
    assert not result.timed_out
    assert result.output == "cat cat dumb 1\n"


def test_files_also_reports_the_workspaces_git_state_read_from_the_host(sandbox):
    assert sandbox.run(":", files=True).git == ""  # no repository yet
    sandbox.run("echo one > notes.txt && git init -q && git add -A && git commit -qm first")
    git = sandbox.run(":", files=True).git
    lines = git.splitlines()
    assert lines[0] == '"" HEAD\t"ref: refs/heads/master"'
    assert lines[1].startswith('"" ref "refs/heads/master"\t"') and len(lines[1].split('"')[5]) == 40
    # the blob of "one\n", as `git hash-object` names it: the index is read without its stat data
    assert lines[2] == '"" index "notes.txt"\t100644 5626abf0f72e58d7a153368ba57db4c673c0e171 0'
    sandbox.run("mkdir site && cd site && git init -q")  # a repository in a subdirectory is read too
    assert '"site" HEAD\t"ref: refs/heads/master"' in sandbox.run(":", files=True).git.splitlines()
    assert sandbox.run("git commit -q --allow-empty -m again", files=True).git != git


def test_commands_see_a_closed_pipe_as_a_normal_shell_does(sandbox):
    # SIGPIPE has its default action: `yes` dies quietly (141) when `head` stops reading.
    assert sandbox.run("yes | head -1; echo ${PIPESTATUS[@]}").output == "y\n141 0\n"


def test_commands_do_not_inherit_signals_the_host_process_ignores(backend):
    # ignored signals survive exec; a job a script starts in the background ignores SIGINT and SIGQUIT
    previous = {
        number: signal.signal(number, signal.SIG_IGN)
        for number in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM)
    }
    try:
        sandbox = (
            backend.create(image.image_tag(), "/app") if backend.name == "docker" else backend.create("/app")
        )
        ignored = sandbox.run("grep SigIgn /proc/self/status").output.split()[1]
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    # the standard signals 1-31; 32 and 33 belong to the C library's threads and cannot be reset
    assert int(ignored, 16) & ((1 << 31) - 1) == 0, ignored


def test_long_output_keeps_head_and_tail_with_a_marker(sandbox):
    result = sandbox.run("seq 1 100000")
    assert result.output.startswith("1\n2\n3\n")
    assert result.output.endswith("99999\n100000\n")
    assert "bytes of output cut" in result.output
    assert result.truncated > 0


def test_ansi_sequences_are_stripped_from_output(sandbox):
    assert sandbox.run(r"printf '\033[31mred\033[0m\n'").output == "red\n"


def test_the_network_is_unreachable(sandbox):
    result = sandbox.run("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)\"")
    assert result.exit_code != 0
    assert "unreachable" in result.output.lower() or "error" in result.output.lower()


def test_docker_containers_and_snapshots_carry_the_label_and_close_removes_them(has_docker):
    import docker

    from pivot_envs.domains.terminal.image import image_tag
    from pivot_envs.sandboxes.docker_backend import DockerBackend

    client = docker.from_env()
    backend = DockerBackend(warm_pool=1)
    sandbox = backend.create(image_tag(), "/app")
    snapshot = sandbox.snapshot()
    backend.fork(snapshot)
    owned = {"label": [f"{OWNER_LABEL}={backend.owner}"]}
    containers = client.containers.list(all=True, filters=owned)
    assert containers and all(c.labels[LABEL] == "container" for c in containers)
    config = containers[0].attrs["HostConfig"]
    assert config["NetworkMode"] == "none" and config["PidsLimit"] > 0 and config["Memory"] > 0
    assert [i.labels[LABEL] for i in client.images.list(filters=owned)] == ["snapshot"]
    backend.close()
    assert client.containers.list(all=True, filters=owned) == []
    assert client.images.list(filters=owned) == []


def test_docker_without_the_command_channel_runs_through_docker_exec(has_docker):
    from pivot_envs.domains.terminal.image import image_tag
    from pivot_envs.sandboxes.docker_backend import DockerBackend

    backend = DockerBackend(warm_pool=0, channel=False)
    sandbox = backend.create(image_tag(), "/app")
    assert sandbox.channel is None
    sandbox.run("cd /tmp && export X=2 && echo data > /app/f")
    result = sandbox.run("pwd; echo $X", files=True)
    assert (result.output, set(result.files)) == ("/tmp\n2\n", {".", "f"})
    assert 'declare -x X="2"\n' in result.shell and result.shell.endswith("cd -- /tmp\n")
    backend.close()


def test_docker_reports_through_the_channel_where_its_files_cannot_be_read_from_the_host(has_docker):
    # A daemon on another machine: no merged directory here, so the runner prints the whole report.
    from pivot_envs.domains.terminal.image import image_tag
    from pivot_envs.sandboxes.docker_backend import DockerBackend

    backend = DockerBackend(warm_pool=0)
    sandbox = backend.create(image_tag(), "/app")
    assert sandbox.channel is not None and sandbox.merged is not None
    sandbox.merged = None
    sandbox.run("cd /tmp && export X=2 && echo data > /app/f")
    result = sandbox.run("pwd; echo $X", files=True)
    assert (result.output, set(result.files)) == ("/tmp\n2\n", {".", "f"})
    assert 'declare -x X="2"\n' in result.shell and result.shell.endswith("cd -- /tmp\n")
    assert result.git is None  # not read from the host there: the verifier leaves .git/ out
    shell = sandbox.run("export BIG=$(head -c 1000000 /dev/zero | tr '\\0' a)", files=True).shell
    assert "bytes of output cut" in shell and shell.endswith("cd -- /tmp\n")
    backend.close()


# Names a newline-separated listing misread: a directory whose name ends in a newline and "d 755 ." holding
# `build` forged the entry of a directory `build` nobody made; " -> " in a name, a backslash, a link whose
# target holds a newline.
HOSTILE_NAMES = (
    "cd /app && echo readme > README && mkdir \"$(printf 'README\\nd 755 .')\""
    " && touch \"$(printf 'README\\nd 755 .')/build\" 'a -> b' 'back\\slash' && ln -s \"$(printf 'x\\ny')\" link"
)


def test_docker_reports_the_manifest_the_host_reads_whatever_the_names(has_docker):
    """Where the runner prints the manifest (a remote daemon), it lists with NUL separators and md5sum's
    escapes are undone: the same entries as the host's own walk; before, a file `build` in a directory named
    "README\\nd 755 ." made a `build` directory appear (the effect of `mkdir build`)."""
    from pivot_envs.domains.terminal.image import image_tag
    from pivot_envs.sandboxes.docker_backend import DockerBackend

    backend = DockerBackend(warm_pool=0)
    try:
        read, printed = (backend.create(image_tag(), "/app") for _ in range(2))
        printed.merged = None
        files = [sandbox.run(HOSTILE_NAMES, files=True).files for sandbox in (read, printed)]
        assert files[1] == files[0], files
        assert "build" not in files[1] and "README\nd 755 ./build" in files[1], files[1]
        assert files[1]["link"] == "l 777 -> x\ny" and files[1]["back\\slash"].startswith("f 644 ")
    finally:
        backend.close()

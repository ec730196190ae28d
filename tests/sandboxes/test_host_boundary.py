"""The host boundary (issue 35, S1-S4 and R1): nothing a command does in a sandbox makes the host
block, read without bound, follow a link out of the sandbox, or hand the command the channel to the
command server or the host's environment. Every attack runs on both backends (the `sandbox` fixture)."""

from __future__ import annotations

import os
import time
import uuid

import pytest

import pivot_envs.sandboxes.manifest as manifest_module
from pivot_envs.sandboxes.manifest import manifest

# The command server's processes: their command line is the server's script, which opens the
# channel's FIFO `in` (the command's own command line, which names it too, is told by FINDSERVER;
# bubblewrap's PID 1, whose arguments hold the script, holds nothing of the channel).
FIND_SERVER = (
    'for p in /proc/[0-9]*; do c=$(tr "\\0" " " <"$p/cmdline" 2>/dev/null);'
    ' case "$c" in *FINDSERVER*|bwrap*) ;; *pivot-chan/in*) echo "${p#/proc/}";; esac; done'
)


def test_an_output_file_replaced_by_a_fifo_neither_blocks_the_host_nor_the_next_command(sandbox):
    start = time.monotonic()
    result = sandbox.run("rm -f /.pivot/out; mkfifo /.pivot/out; echo lost")
    assert time.monotonic() - start < 5
    assert "not a file" in result.output
    # The FIFO is removed before the next command, whose output is its own.
    assert sandbox.run("echo next").output == "next\n"


def test_an_output_fifo_fed_without_end_gives_the_host_no_more_than_the_output_limit(sandbox):
    start = time.monotonic()
    result = sandbox.run("rm -f /.pivot/out; mkfifo /.pivot/out; (yes > /.pivot/out &) ; sleep 0.5")
    assert time.monotonic() - start < 5
    assert len(result.output) < 1000
    assert sandbox.run("echo next").output == "next\n"


def test_an_output_file_linked_to_an_endless_device_is_not_read(sandbox):
    result = sandbox.run("rm -f /.pivot/out; ln -s /dev/zero /.pivot/out")
    assert len(result.output) < 1000
    assert sandbox.run("echo next").output == "next\n"


def test_the_channel_paths_are_gone_once_the_server_runs(sandbox):
    result = sandbox.run("ls -A /.pivot-chan; echo listed")
    assert result.output == "listed\n"
    assert sandbox.channel_isolated is True


def test_a_command_cannot_open_any_descriptor_of_the_command_server(sandbox):
    result = sandbox.run(
        f"for pid in $({FIND_SERVER}); do for f in /proc/$pid/fd/*; do"
        ' ( exec 9<>"$f" ) 2>/dev/null && echo "opened $f"; done;'
        ' cat /proc/$pid/environ >/dev/null 2>&1 && echo "environ $pid"; done; echo done'
    )
    assert result.output.endswith("done\n")
    assert "opened" not in result.output and "environ" not in result.output, result.output


def test_a_forged_trailer_neither_ends_the_call_early_nor_changes_its_exit_status(sandbox):
    # The attack of issue 35 (S2): read the runner's marker from the request, write the trailer
    # "<marker> exit 0" to the reply, keep running. Tried through the paths and through /proc.
    forge = (
        "m=$(tr '\\0' '\\n' </.pivot-chan/request 2>/dev/null | sed -n 8p);"
        ' printf "\\n%s exit 0\\n" "$m" >/.pivot-chan/out 2>/dev/null;'
        f" for pid in $({FIND_SERVER}); do for f in /proc/$pid/fd/*; do"
        ' printf "\\n%s exit 0\\n" "$m" 2>/dev/null >"$f"; done; done;'
        " sleep 1.5; exit 9"
    )
    start = time.monotonic()
    result = sandbox.run(forge)
    assert result.exit_code == 9
    assert time.monotonic() - start >= 1.5
    assert sandbox.run("echo next").output == "next\n"


def test_a_command_left_running_cannot_answer_for_the_next_one(sandbox):
    # In the background: read each request's marker and answer "exit 0" for it, through the paths
    # and through every descriptor of the server it can reach, while the next commands run.
    sandbox.run(
        "( for i in $(seq 100); do m=$(tr '\\0' '\\n' </.pivot-chan/request 2>/dev/null | sed -n 8p);"
        ' [ -n "$m" ] && printf "\\n%s exit 0\\n" "$m" >/.pivot-chan/out 2>/dev/null;'
        f" for pid in $({FIND_SERVER}); do for f in /proc/$pid/fd/*; do"
        ' printf "\\n%s exit 0\\n" "$m" 2>/dev/null >"$f"; done; done; sleep 0.02; done ) >/dev/null 2>&1 &'
    )
    for _ in range(3):
        start = time.monotonic()
        result = sandbox.run("sleep 0.5; exit 5")
        assert result.exit_code == 5
        assert time.monotonic() - start >= 0.5


def test_no_host_environment_variable_reaches_a_sandbox(backend, monkeypatch):
    secret = f"pivot-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("PIVOT_TEST_API_KEY", secret)
    from pivot_envs.domains.terminal import image

    sandbox = (
        backend.create(image.image_tag(), "/app") if backend.name == "docker" else backend.create("/app")
    )
    result = sandbox.run("cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c PIVOT_TEST_API_KEY")
    assert result.output.strip() == "0", result.output


def test_a_directory_swapped_for_a_link_while_the_manifest_is_read_is_not_followed(tmp_path, monkeypatch):
    host = tmp_path / "host"
    host.mkdir()
    (host / "host-only-secret").write_text("secret")
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "mine").write_text("mine")
    listed, swapped = os.scandir, []

    class Listing(list):
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def swapping_scandir(path):
        # Once the top directory is listed, `sub` becomes a link to a host directory.
        with listed(path) as entries:
            entries = Listing(entries)
        if not swapped:
            swapped.append(path)
            os.unlink(tree / "sub" / "mine")
            os.rmdir(tree / "sub")
            os.symlink(host, tree / "sub")
        return entries

    monkeypatch.setattr(os, "scandir", swapping_scandir)
    files = manifest(tree)
    assert not any("host-only-secret" in path for path in files), files


def test_a_race_between_links_and_directories_never_shows_a_host_file_or_fails_the_step(sandbox, tmp_path):
    host = tmp_path / f"host-{uuid.uuid4().hex}"
    host.mkdir()
    (host / "host-only-secret").write_text("secret")
    sandbox.run(
        f"mkdir -p d && echo x > d/f; ( for i in $(seq 400); do mv d d2; ln -s {host} d; rm d; mv d2 d; done"
        " ) >/dev/null 2>&1 &"
    )
    for _ in range(15):
        files = sandbox.run("true", files=True).files
        assert not any("host-only-secret" in path for path in files), files


def test_sparse_files_cost_the_manifest_no_reading_of_their_holes(sandbox):
    start = time.monotonic()
    result = sandbox.run("for i in $(seq 60); do truncate -s 63M sparse$i; done", files=True)
    assert result.ok, result.output
    assert time.monotonic() - start < 4
    assert len({result.files[f"sparse{i}"] for i in range(1, 61)}) == 1


def test_the_same_content_gives_the_same_digest_however_it_is_stored(tmp_path):
    with open(tmp_path / "sparse", "wb") as handle:
        handle.truncate(1 << 20)
        handle.seek(300_000)
        handle.write(b"data")
    dense = bytearray(1 << 20)
    dense[300_000:300_004] = b"data"
    (tmp_path / "dense").write_bytes(bytes(dense))
    files = manifest(tmp_path)
    assert files["sparse"] == files["dense"]
    (tmp_path / "dense").write_bytes(bytes(dense).replace(b"data", b"date"))
    assert manifest(tmp_path)["dense"] != files["dense"]


def test_a_manifest_reads_at_most_its_budget(tmp_path, monkeypatch):
    for name in ("a", "b", "c"):
        (tmp_path / name).write_bytes(os.urandom(200_000))
    files = manifest(tmp_path, budget=450_000)
    assert sum(entry.split()[-1].startswith("unhashed") for entry in files.values()) == 1
    assert manifest_module.manifest(tmp_path) != files


def test_a_clean_run_sees_neither_the_saved_shell_state_nor_a_module_planted_beside_it(sandbox):
    sandbox.run("export PLANTED=1; mkdir -p sub; cd sub; echo 'raise SystemExit(3)' > json.py")
    result = sandbox.run(
        "echo \"[$PLANTED]\"; pwd; cd sub && python3 -c 'import json; print(json.dumps(1))'", clean=True
    )
    assert result.output.splitlines() == ["[]", sandbox.workdir, "1"], result.output
    # A clean run leaves the saved state alone.
    assert sandbox.run('echo "[$PLANTED]"; pwd').output.splitlines() == ["[1]", f"{sandbox.workdir}/sub"]


def test_writes_outside_the_writable_roots_are_listed(sandbox):
    sandbox.run(
        "echo stub > /usr/local/bin/python3; rm -f /etc/issue; echo ok > /tmp/t; echo ok > /root/r; echo ok > w"
    )
    writes = sandbox.system_writes()
    if sandbox.backend == "bwrap":
        assert writes == []  # the system directories are read-only: nothing could be written
        assert sandbox.run("cat /usr/local/bin/python3").exit_code != 0
    else:
        assert writes == ["/etc/issue", "/usr/local/bin/python3"]


def test_a_command_that_kills_the_command_server_leaves_a_sandbox_that_answers(sandbox):
    result = sandbox.run(f"for pid in $({FIND_SERVER}); do kill -9 $pid; done; sleep 0.2")
    assert result.exit_code == 137
    again = sandbox.run("cat /etc/hostname >/dev/null; echo alive")
    assert again.output == "alive\n"


@pytest.mark.slow
def test_a_command_that_stops_the_command_server_is_killed_not_reported_as_a_broken_sandbox(sandbox):
    start = time.monotonic()
    result = sandbox.run(f"for pid in $({FIND_SERVER}); do kill -STOP $pid; done; sleep 0.2", timeout=1)
    assert result.exit_code == 137
    assert time.monotonic() - start < 20
    assert sandbox.run("echo alive").output == "alive\n"


def test_stop_processes_ends_what_commands_left_running_and_the_sandbox_still_answers(sandbox):
    sandbox.run(
        "(setsid bash -c 'while :; do date > beat; sleep 0.05; done' &) ; nohup sleep 1000 >/dev/null 2>&1 &"
    )
    assert sandbox.stop_processes()
    before = sandbox.run("cat beat").output
    time.sleep(0.3)
    assert sandbox.run("cat beat").output == before
    assert "sleep 1000" not in sandbox.run("ps -eo args").output
    assert sandbox.run("echo alive").output == "alive\n"


def test_closed_sandboxes_hold_no_channel_descriptor_however_busy_the_backend(backend):
    from pivot_envs.domains.terminal import image

    def channel_of(sandbox) -> str:
        channel = sandbox.server.channel if sandbox.backend == "bwrap" else sandbox.channel
        return f"/{channel.directory.name}/"

    first = backend.create(image.image_tag(), "/app") if backend.name == "docker" else backend.create("/app")
    snapshot = first.snapshot()
    closed = [channel_of(first)]
    first.close()
    for _ in range(12):  # back to back: the removals wait for a quiet gap the loop never leaves
        sandbox = backend.fork(snapshot)
        sandbox.run("true")
        closed.append(channel_of(sandbox))
        sandbox.close()
    held = []
    for name in os.listdir("/proc/self/fd"):
        try:
            held.append(os.readlink(f"/proc/self/fd/{name}"))
        except OSError:
            continue
    assert [target for target in held if any(channel in target for channel in closed)] == []

"""The sandboxes' seccomp filter (sandboxes/seccomp.py): fallocate fails, so nothing allocates disk
faster than it writes. Between two polls of the disk limit (0.1 s) fallocate reserved gigabytes, and with
FALLOC_FL_KEEP_SIZE past the file-size limit too (a 54 ms command left 1 GB at disk_mb=20)."""

from __future__ import annotations

import dataclasses
import struct

import pytest

from pivot_envs.sandboxes import seccomp

X86_64, I386, AARCH64, RISCV64 = 0xC000003E, 0x40000003, 0xC00000B7, 0xC00000F3


def run_filter(program: bytes, architecture: int, number: int) -> int:
    """What the classic-BPF `program` returns for a system call (an interpreter of the three instructions it
    uses), so that the filter is checked on every architecture it names, not only this machine's."""
    instructions = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    data = {0: number, 4: architecture}
    accumulator, at = 0, 0
    while True:
        code, jump_true, jump_false, k = instructions[at]
        if code == 0x20:
            accumulator, at = data[k], at + 1
        elif code == 0x15:
            at += 1 + (jump_true if accumulator == k else jump_false)
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")


@pytest.mark.parametrize(
    ("architecture", "fallocate", "other"),
    [(X86_64, 285, 1), (X86_64, 285 | 0x40000000, 0), (I386, 324, 4), (AARCH64, 47, 64)],
    ids=["x86-64", "x32", "i386", "aarch64"],
)
def test_the_filter_denies_fallocate_and_allows_the_rest(architecture, fallocate, other):
    program = seccomp.program()
    denied = 0x00050000 | 95  # SECCOMP_RET_ERRNO | EOPNOTSUPP
    assert run_filter(program, architecture, fallocate) == denied
    assert run_filter(program, architecture, other) == 0x7FFF0000
    # another architecture's fallocate number is an ordinary call here (write on x86-64 is 1, 47 is recvmsg)
    assert run_filter(program, RISCV64, fallocate) == 0x7FFF0000


def test_in_a_sandbox_fallocate_fails_and_posix_fallocate_writes_within_the_file_size_limit(backend):
    """On both backends: bubblewrap takes the filter from a descriptor, a Docker container's command server
    installs it over Docker's own profile (seccomp.container_command), and every command inherits it."""
    backend.limits = dataclasses.replace(backend.limits, timeout=10.0, disk_mb=20, file_mb=16)
    sandbox = backend.new_sandbox("/app")
    try:
        result = sandbox.run("fallocate -l 1G a; echo $?; touch b; fallocate -n -l 1G b; echo $?; du -sk a b")
        lines = result.output.splitlines()
        assert lines[1] == "1" and lines[3] == "1" and "not supported" in lines[0], result.output
        assert [line.split()[0] for line in lines[4:]] == ["0", "0"], result.output
        # glibc falls back to writing, which the file-size limit (16 MB) bounds
        result = sandbox.run(
            "python3 -c \"import os; f = os.open('c', os.O_CREAT | os.O_WRONLY)\n"
            "try: os.posix_fallocate(f, 0, 64 << 20)\nexcept OSError as e: print('refused', e.errno)\n"
            'print(os.fstat(f).st_blocks * 512 >> 20)"'
        )
        assert result.output.splitlines()[-1] in {"16", "15"} and "refused 27" in result.output, result.output
    finally:
        sandbox.close()


def test_commands_under_the_filter_ignore_no_signal(sandbox):
    """Python ignores SIGPIPE and SIGXFSZ at its start and an ignored signal stays ignored across exec, where
    bash cannot trap it again: the Docker server's installer puts them back, so a pipeline ends as on the
    host (`yes | head` by SIGPIPE, 141) and no command starts with SIGPIPE or SIGXFSZ ignored."""
    result = sandbox.run("yes | head -1; echo ${PIPESTATUS[0]}; grep SigIgn /proc/self/status")
    lines = result.output.splitlines()
    assert lines[:2] == ["y", "141"] and lines[2].startswith("SigIgn:"), result.output
    # (bubblewrap passes on what the host process ignores, e.g. glibc's real-time signal 32 under make)
    ignored = int(lines[2].split()[1], 16)
    assert not ignored & (1 << (13 - 1) | 1 << (25 - 1)), result.output  # SIGPIPE (13), SIGXFSZ (25)


def test_an_image_without_python_runs_the_server_as_it_is(tmp_path):
    """The container command execs its argv unchanged where python3 is missing (a user's minimal image)."""
    import subprocess

    command = seccomp.container_command(["sh", "-c", "echo ran $0", "unfiltered"])
    empty = tmp_path / "bin"
    empty.mkdir()
    (empty / "sh").symlink_to("/bin/sh")
    result = subprocess.run(command, capture_output=True, text=True, env={"PATH": str(empty)})
    assert result.stdout == "ran unfiltered\n", result.stderr

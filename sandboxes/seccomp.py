"""A seccomp filter for the sandboxes: `fallocate(2)` fails with EOPNOTSUPP.

The disk limit (`SandboxLimits.disk_mb`) is a poll of the sandbox's tree every 0.1 s. `fallocate`
reserves blocks without writing them: inside bubblewrap it allocated 2.5 GB in 15-21 ms, and with
`FALLOC_FL_KEEP_SIZE` it is not even bounded by the file-size limit (RLIMIT_FSIZE), so one command
could fill the host's disk between two polls. Denied, `posix_fallocate` falls back to writing (glibc
does so on EOPNOTSUPP, as on file systems without the call), which runs at write speed and within
RLIMIT_FSIZE; everything else is allowed. The program is classic BPF, written here for the three
architectures a sandbox may run (x86-64 with its x32 and i386 ABIs, and AArch64); on any other,
nothing is denied.

`filter_file(directory)` writes the program where a sandbox's first process can read it, and
`argv_prefix(path)` is the argv that hands it to bwrap: bwrap takes the filter from a descriptor
(`--seccomp FD`), which a `sh` that opens the file and `exec`s bwrap passes on (so that every way
bwrap is started, a Popen or a pty, passes it alike).

Docker applies its own default profile, which allows `fallocate`. `container_command(argv)` starts a
container's command server under this filter as well (filters stack; the container runs with
no-new-privileges, so an unprivileged process may add one): the image's `python3` installs it with
prctl(2) and `exec`s the server, whose commands inherit it. An image without `python3` (and ctypes)
runs the server without it.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

DESCRIPTOR = 9  # the descriptor bwrap reads the program from

_LOAD_WORD = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JUMP_IF_EQUAL = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_RETURN = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000  # SECCOMP_RET_ALLOW
_EOPNOTSUPP = 95
_DENY = 0x00050000 | _EOPNOTSUPP  # SECCOMP_RET_ERRNO | errno
_NUMBER, _ARCHITECTURE = 0, 4  # offsets in struct seccomp_data

# audit architecture -> the numbers of fallocate under it
DENIED = {
    0xC000003E: (285, 285 | 0x40000000),  # x86-64, and its x32 ABI
    0x40000003: (324,),  # i386 (a 32-bit program on x86-64)
    0xC00000B7: (47,),  # AArch64
}


def _instruction(code: int, k: int, jump_true: int = 0, jump_false: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jump_true, jump_false, k)


def program() -> bytes:
    """The filter as `struct sock_filter` instructions: per architecture, deny its fallocate numbers."""
    instructions: list[tuple[int, int, int, int]] = [(_LOAD_WORD, _ARCHITECTURE, 0, 0)]
    denies: list[int] = []  # indexes of the jumps that go to the deny
    for architecture, numbers in DENIED.items():
        # this architecture: load the number, test each (a match jumps to the deny at the end), allow
        length = 1 + len(numbers) + 1
        instructions.append((_JUMP_IF_EQUAL, architecture, 0, length))  # not this one: the next test
        instructions.append((_LOAD_WORD, _NUMBER, 0, 0))
        for number in numbers:
            denies.append(len(instructions))
            instructions.append((_JUMP_IF_EQUAL, number, 0, 0))
        instructions.append((_RETURN, _ALLOW, 0, 0))
    instructions.append((_RETURN, _ALLOW, 0, 0))  # another architecture: nothing denied
    deny = len(instructions)
    instructions.append((_RETURN, _DENY, 0, 0))
    for index in denies:
        code, k, _, _ = instructions[index]
        instructions[index] = (code, k, deny - index - 1, 0)
    return b"".join(_instruction(code, k, jt, jf) for code, k, jt, jf in instructions)


PROGRAM = program()
_PROGRAM_HEX = PROGRAM.hex()  # as container_command passes it, computed once


def filter_file(directory: Path) -> Path:
    """The program written to `directory`/seccomp.bpf, readable by anyone (it holds nothing secret).

    A sandbox calls it once, on its new root; the file is replaced whole, so a reader never sees part of it."""
    path = directory / "seccomp.bpf"
    partial = directory / f".seccomp.{os.getpid()}"
    partial.write_bytes(PROGRAM)
    partial.chmod(0o644)
    partial.replace(path)
    return path


# Run by the image's python3 as `python3 -I -S -c INSTALLER PROGRAM_HEX ARGV...`: install the filter, put back the
# signal dispositions Python's start-up ignores (an ignored signal stays ignored across exec, and bash cannot
# trap one ignored at its start: `yes | head` would not end by SIGPIPE), then exec ARGV.
INSTALLER = r"""
import os, signal, sys

for name in ("SIGPIPE", "SIGXFSZ"):
    signal.signal(getattr(signal, name), signal.SIG_DFL)
try:
    import ctypes
except ImportError:  # a Python without ctypes: the server runs without the filter
    os.execvp(sys.argv[2], sys.argv[2:])

class Program(ctypes.Structure):
    _fields_ = [("length", ctypes.c_ushort), ("instructions", ctypes.c_void_p)]

code = bytes.fromhex(sys.argv[1])
buffer = ctypes.create_string_buffer(code, len(code))
program = Program(len(code) // 8, ctypes.addressof(buffer))
prctl = ctypes.CDLL(None, use_errno=True).prctl
prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
# PR_SET_NO_NEW_PRIVS (38), then PR_SET_SECCOMP (22) with SECCOMP_MODE_FILTER (2)
if prctl(38, 1, None, 0, 0) or prctl(22, 2, ctypes.addressof(program), 0, 0):
    sys.exit("pivot-envs: the seccomp filter was refused: " + os.strerror(ctypes.get_errno()))
os.execvp(sys.argv[2], sys.argv[2:])
"""


def container_command(argv: list[str]) -> list[str]:
    """A container's command that runs `argv` under the filter where the image has python3 with ctypes, and
    `argv` as it is where it has not (a filter the kernel refuses ends the command: nothing starts
    unfiltered on a host whose image could install it)."""
    # -I -S: no user site, no PYTHON* variables, no site module (nothing of the image's own Python set-up runs)
    script = (
        'if command -v python3 >/dev/null 2>&1; then exec python3 -I -S -c "$0" "$@"; fi; shift; exec "$@"'
    )
    return ["sh", "-c", script, INSTALLER, _PROGRAM_HEX, *argv]


def argv_prefix(path: Path) -> list[str]:
    """Start what follows with the filter file open on DESCRIPTOR; bwrap's own arguments then name it."""
    return ["sh", "-c", f'exec "$@" {DESCRIPTOR}<"$0"', str(path)]


def bwrap_arguments() -> list[str]:
    return ["--seccomp", str(DESCRIPTOR)]

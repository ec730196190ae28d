"""The host's end of the command channel to a sandbox's command server (both backends).

A channel is a directory the host makes and bind-mounts read-only into the sandbox at
/.pivot-chan, holding two FIFOs (`in`, `out`) and a request file. The host opens `out` for
reading before the sandbox starts; the server (`runner.SERVER`) opens all three once, says
"ready" on `out`, and the host then opens `in` for writing and removes the three paths: from then
on only the two ends hold them, so no command can open them by path, and commands run with fewer
capabilities than the server, so they cannot open them through /proc either. Each call writes the
runner's arguments to the request file (NUL-separated), a line GO to `in`, and reads the report
from `out` up to its trailer line "<marker> exit <status> <left>" (<left>: the processes the
command left running, `left_running`), at most `max_reply` bytes. The request
crosses as a file because bash reads a FIFO one byte per system call and a pipe holds 64 KiB, so
a large call (an editor's new file) cost thousands of reads; a regular file it reads in blocks.
While the command runs the host watches the sandbox's disk use.
"""

from __future__ import annotations

import os
import select
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from .manifest import disk_usage
from .protocol import CommandRejected, SandboxError, SandboxLimits

# The file in the channel directory that holds a request (the runner's arguments, NUL-separated),
# and the line that tells the server to read it.
REQUEST = "request"
GO = b"go\n"
READY = b"ready"
# Bytes of a reply the host reads at most when the caller gives no bound.
MAX_REPLY = 1 << 20


class Channel:
    """The host's end of one sandbox's command channel (see the module docstring).

    `directory` is what the backend bind-mounts at /.pivot-chan; `owner`: the uid the channel's
    files belong to (the sandbox's user on the host, for bubblewrap run as root). `isolated` tells,
    once connected, whether the server runs commands below itself (False: no setpriv in the image).
    """

    def __init__(self, parent: Path, owner: int | None = None) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="chan-", dir=parent))
        self.directory.chmod(0o755)
        # Where the backend may keep the sandbox's own error output: beside the channel, not in it.
        self.stderr = self.directory.with_name(self.directory.name + ".stderr")
        self.owner = owner
        self._reply = self._request = self._go = -1
        self.isolated: bool | None = None
        # What the last call's command left running (its trailer's count; None: no trailer).
        self.left_running: int | None = None
        # The reply closed without a trailer: the server is gone (its end of `in` may close a moment later).
        self.ended = False
        self._make()

    def _make(self) -> None:
        for name in ("in", "out"):
            os.mkfifo(self.directory / name, 0o600)
        os.close(os.open(self.directory / REQUEST, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        if self.owner is not None:
            for name in ("in", "out", REQUEST):
                os.chown(self.directory / name, self.owner, self.owner)
        # Opened now, before the server: its open of the write end then never waits.
        self._reply = os.open(self.directory / "out", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._request = os.open(self.directory / REQUEST, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)

    @property
    def connected(self) -> bool:
        return self._go >= 0

    def renew(self) -> None:
        """New FIFOs and request file in the same directory, for a server about to start again
        (a restarted container); the old ends are closed."""
        self.close_ends()
        for name in ("in", "out", REQUEST):
            try:
                os.unlink(self.directory / name)
            except FileNotFoundError:
                pass
        self.isolated = None
        self.ended = False
        self._make()

    def connect(self, deadline: float, name: str, alive: Callable[[], bool] | None = None) -> None:
        """Wait for the server's "ready", open `in`, and remove the channel's paths."""
        line = bytearray()
        poller = select.poll()
        poller.register(self._reply, select.POLLIN)
        while not line.endswith(b"\n"):
            if alive is not None and not alive():
                raise ServerDown(f"the command server of {name} is gone")
            if time.monotonic() > deadline:
                raise SandboxError(f"the command server of {name} does not answer")
            if poller.poll(5):
                chunk = os.read(self._reply, 64 - len(line))
                line += chunk
                if len(line) >= 64 or (not chunk and line):
                    break
        words = bytes(line).split()
        if not words or words[0] != READY:
            raise SandboxError(f"the command server of {name} did not start (it said {bytes(line)[:64]!r})")
        self.isolated = words[1:] == [b"drop"]
        self._go = os.open(self.directory / "in", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        for path in ("in", "out", REQUEST):
            os.unlink(self.directory / path)

    def call(
        self,
        args: list[str],
        deadline: float,
        name: str,
        alive: Callable[[], bool] | None = None,
        check: Callable[[], str] | None = None,
        kill_at: float | None = None,
        kill: Callable[[], None] | None = None,
        max_reply: int = MAX_REPLY,
    ) -> tuple[bytes, int | None]:
        """Send the runner's arguments to the server; returns (reply, exit status or None).

        The reply ends with the trailer "<marker> exit <status> <left>" (the marker is args[7]);
        reading stops there, and `left_running` holds <left> (None until then). None: the server closed the reply without a trailer (the command killed it,
        e.g. `kill -9 -1`). A server that is gone before it takes the request raises ServerDown;
        one that does not finish before `deadline` raises `ServerTimeout`; a reply over
        `max_reply` bytes raises `ReplyTooLarge`. While the command runs, `check()` is called every
        CHECK_EVERY seconds; a non-empty answer (a limit the command broke) raises `LimitExceeded`
        with it. At `kill_at`, `kill()` is called once (it ends the command: the time limit) and
        the reply is still awaited.
        """
        # The request is NUL-separated: an argument holding a NUL would shift the ones after it (the
        # limits among them), so none may cross (commands are checked when parsed and in runner_argv).
        if any("\0" in arg for arg in args):
            raise CommandRejected(f"a request to the command server of {name} holds a NUL byte")
        if self.ended:
            raise ServerDown(f"the command server of {name} is gone")
        if not self.connected:
            self.connect(deadline, name, alive)
        if check is not None:
            # Once before the command starts: a sandbox far over its disk limit runs nothing more,
            # where a command would otherwise have CHECK_EVERY seconds to write before a check.
            broken = check()
            if broken:
                raise LimitExceeded(broken)
        trailer = b"\n%s exit " % args[7].encode()
        self.left_running = None
        body = b"".join(arg.encode() + b"\0" for arg in args)
        os.ftruncate(self._request, 0)
        view, offset = memoryview(body), 0
        while offset < len(body):
            offset += os.pwrite(self._request, view[offset:], offset)
        try:
            os.write(self._go, GO)  # a few bytes into a pipe nobody else writes: never blocks
        except BrokenPipeError as error:  # nothing reads `in`: the server is gone
            raise ServerDown(f"the command server of {name} is gone") from error
        chunks, poller = bytearray(), select.poll()
        poller.register(self._reply, select.POLLIN | select.POLLHUP)
        next_check = time.monotonic() + CHECK_EVERY
        kill_at = kill_at if kill is not None else None
        while True:
            now = time.monotonic()
            if now >= deadline:
                raise ServerTimeout(f"the command server of {name} did not reply in time")
            if kill_at is not None and now >= kill_at:
                kill()
                kill_at = None
            if check is not None and now >= next_check:
                broken = check()
                if broken:
                    raise LimitExceeded(broken)
                next_check = time.monotonic() + CHECK_EVERY
            wake = min(deadline, next_check, kill_at if kill_at is not None else deadline)
            if not poller.poll(max(wake - now, 0.0) * 1000):
                continue
            try:
                chunk = os.read(self._reply, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                self.ended = True
                return bytes(chunks), None
            chunks += chunk
            if len(chunks) > max_reply:
                raise ReplyTooLarge(f"the reply of {name} exceeded {max_reply} bytes")
            at = chunks.rfind(trailer, max(len(chunks) - 64, 0))
            words = chunks[at + len(trailer) : -1].split(b" ") if at >= 0 and chunks.endswith(b"\n") else []
            if len(words) == 2 and words[0].isdigit() and words[1].isdigit():
                self.left_running = int(words[1])
                return bytes(chunks[:at]), int(words[0])

    def close_ends(self) -> None:
        """Close the host's ends now (the directory goes with `close`)."""
        for descriptor in (self._reply, self._request, self._go):
            if descriptor >= 0:
                os.close(descriptor)
        self._reply = self._request = self._go = -1

    def close(self) -> None:
        """Close the host's ends and remove the directory."""
        self.close_ends()
        shutil.rmtree(self.directory, ignore_errors=True)
        self.stderr.unlink(missing_ok=True)


class ServerTimeout(SandboxError):
    """A command server did not reply before its deadline (the runner's own timeout did not end it)."""


class ServerDown(SandboxError):
    """A command server's process is gone before it took the request."""


class LimitExceeded(SandboxError):
    """The running command broke a limit the host watches (the disk limit); the caller kills it."""


class ReplyTooLarge(LimitExceeded):
    """A reply longer than the caller's bound (a report of a command's huge manifest); the caller kills it."""


# How often the host checks a running command's disk use.
CHECK_EVERY = 0.1


class DiskFloor:
    """One sandbox's disk state across its commands, for `disk_check`: `bytes` is what the sandbox
    may hold while the current command runs (0: its limit).

    The check is a poll, and `fallocate` allocates gigabytes between two polls (RLIMIT_FSIZE does
    not bound it), so a command can leave a sandbox far over its limit, and the sandbox keeps its
    files. Over its limit, a sandbox may not grow: a command that starts with the sandbox over its
    limit is killed at the first check that finds it larger than at that start (by more than
    SLACK, the runner's own files), and a command that would start with it holding more than
    `most` is not run at all. A sandbox back under its limit (a command deleted files) is checked
    as before. What a sandbox holds is so bounded by `most` plus what one command allocates
    before its first check, however many commands it runs.
    """

    # What a sandbox over its limit may grow by during one command: the runner's output and state files.
    SLACK = 1 << 20

    def __init__(self) -> None:
        self.bytes = 0
        # The check of the command running now: the first call of another one is that command's start.
        self.command: Callable[[], str] | None = None

    @staticmethod
    def most(limits: SandboxLimits) -> int:
        """The most a sandbox may hold and still start a command, in bytes: twice its disk limit, and
        at least the limit plus one largest file, so that a sandbox a writer left over its limit (what
        it wrote between the last check and its end) can still be cleaned up by the next command."""
        return max(2 * limits.disk_mb, limits.disk_mb + limits.file_mb) << 20


def disk_check(root: Path, limits: SandboxLimits, floor: DiskFloor | None = None) -> Callable[[], str]:
    """A check for `Channel.call` (before the command starts, then every CHECK_EVERY seconds): what it
    says when the tree at `root` breaks `limits.disk_mb` or `limits.entries`, given what `floor` knows
    of the sandbox's earlier commands (see DiskFloor)."""
    limit = limits.disk_mb * 1024 * 1024
    floor = floor if floor is not None else DiskFloor()

    def check() -> str:
        # A command's first check, which Channel.call makes before the command starts, counts as far
        # as the most a sandbox may hold to start one and notes what it holds then (see DiskFloor).
        starting = floor.command is not check
        if starting:
            floor.command, floor.bytes = check, DiskFloor.most(limits)
        used = disk_usage(root, stop_above=max(limit, floor.bytes), most_entries=limits.entries)
        if used <= limit:
            floor.bytes = 0
            return ""
        if starting and used <= floor.bytes:
            # Over its limit, not far: the command runs, and may not make the sandbox larger.
            floor.bytes = used + DiskFloor.SLACK
            return ""
        if used <= floor.bytes:
            return ""
        grew = floor.bytes > limit  # it started over its limit
        floor.bytes = used
        ending = "the command was not run" if starting else "killed"
        if used.over == "entries":
            return (
                f"the sandbox holds more files, directories and links than its entry limit ({limits.entries}): "
                f"{ending}"
            )
        if used.over == "depth":
            return f"the sandbox nested its directories deeper than the host counts them: {ending}"
        if starting:
            return (
                f"the sandbox holds more than {DiskFloor.most(limits) >> 20} MB, far over its disk limit "
                f"({limits.disk_mb} MB): the command was not run"
            )
        if grew:
            return (
                f"the sandbox is over its disk limit ({limits.disk_mb} MB) and the command wrote more: killed"
            )
        return f"the sandbox wrote more than its disk limit ({limits.disk_mb} MB): killed"

    return check

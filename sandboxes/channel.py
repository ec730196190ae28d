"""The host's end of the FIFO channel to a sandbox's command server (both backends).

A sandbox's command server (`runner.SERVER`) waits on a pair of FIFOs in a read-only bind mount:
the host writes the runner's arguments to the file REQUEST beside them, then a short line (GO) to
one FIFO, and reads the report, ended by a trailer line, from the other. A command then costs a
bash fork inside the sandbox, not a `docker exec` or a bwrap start. The request crosses as a file
because bash reads a FIFO one byte per system call (it cannot read ahead of a delimiter on a
pipe) and a pipe holds 64 KiB, so a large call (an editor's new file) cost thousands of reads and
round trips through the pipe; a regular file it reads in blocks. While the command runs the host
watches the sandbox's disk use.
"""

from __future__ import annotations

import errno
import os
import select
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


def fifo_channel(parent: Path, owner: int | None = None) -> Path:
    """A new channel directory with the request and reply FIFOs and the request file (owned by `owner` when given)."""
    channel = Path(tempfile.mkdtemp(prefix="chan-", dir=parent))
    channel.chmod(0o755)
    os.mkfifo(channel / "in", 0o600)
    os.mkfifo(channel / "out", 0o600)
    os.close(os.open(channel / REQUEST, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    if owner is not None:
        for path in (channel / "in", channel / "out", channel / REQUEST):
            os.chown(path, owner, owner)
    return channel


def _write_request(channel: Path, body: bytes) -> None:
    # Rewritten in place (its owner and mode stay); the server reads it only after GO, and the
    # channel is read-only inside the sandbox, so nothing there can swap it for a link.
    descriptor = os.open(channel / REQUEST, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
    try:
        view = memoryview(body)
        while view:
            view = view[os.write(descriptor, view) :]
    finally:
        os.close(descriptor)


def call_server(
    channel: Path,
    args: list[str],
    deadline: float,
    name: str,
    alive: Callable[[], bool] | None = None,
    check: Callable[[], str] | None = None,
    kill_at: float | None = None,
    kill: Callable[[], None] | None = None,
) -> tuple[bytes, int | None]:
    """Send the runner's arguments to a sandbox's command server; returns (reply, exit status or None).

    The reply ends with the trailer "<marker> exit <status>" (the marker is args[7]); reading stops
    there, so a process that holds the reply FIFO open cannot hold the call. None: the server
    closed the reply without a trailer (the command killed it, e.g. `kill -9 -1`). A server that
    does not take the request raises SandboxError; one that does not finish before `deadline`
    raises `ServerTimeout`. While the command runs, `check()` is called every CHECK_EVERY seconds;
    a non-empty answer (a limit the command broke) raises `LimitExceeded` with it. At `kill_at`,
    `kill()` is called once (it ends the command: the time limit) and the reply is still awaited.
    """
    # The request is NUL-separated: an argument holding a NUL would shift the ones after it (the
    # limits among them), so none may cross (commands are checked when parsed and in runner_argv).
    if any("\0" in arg for arg in args):
        raise CommandRejected(f"a request to the command server of {name} holds a NUL byte")
    trailer = b"\n%s exit " % args[7].encode()
    _write_request(channel, b"".join(arg.encode() + b"\0" for arg in args))
    # Open the reply FIFO first (non-blocking), so the server's write end opens at once.
    reply = os.open(channel / "out", os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                request = os.open(channel / "in", os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as error:  # ENXIO: the server is not reading yet (starting, or between calls)
                if alive is not None and not alive():
                    raise ServerDown(f"the command server of {name} is gone") from error
                if error.errno != errno.ENXIO or time.monotonic() > deadline:
                    raise SandboxError(f"the command server of {name} does not answer") from error
                time.sleep(0.0005)
        try:
            os.write(request, GO)  # a few bytes into an empty pipe: never blocks
        finally:
            os.close(request)
        chunks, poller = bytearray(), select.poll()
        poller.register(reply, select.POLLIN | select.POLLHUP)
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
            chunk = os.read(reply, 1 << 16)
            if not chunk:
                return bytes(chunks), None
            chunks += chunk
            at = chunks.rfind(trailer, max(len(chunks) - 64, 0))
            status = chunks[at + len(trailer) : -1] if at >= 0 and chunks.endswith(b"\n") else b""
            if status.isdigit():
                _wait_closed(reply, poller, min(deadline, time.monotonic() + 1.0))
                return bytes(chunks[:at]), int(status)
    finally:
        os.close(reply)


def _wait_closed(reply: int, poller: select.poll, until: float) -> None:
    # The server closes the reply right after the trailer; the next call must not open the FIFO
    # while this write end is still open (it would then read this close as its own end of reply).
    # A process that holds the FIFO open costs at most until `until`.
    while (left := until - time.monotonic()) > 0:
        if poller.poll(left * 1000):
            try:
                if not os.read(reply, 1 << 16):
                    return
            except BlockingIOError:
                continue


class ServerTimeout(SandboxError):
    """A command server did not reply before its deadline (the runner's own timeout did not end it)."""


class ServerDown(SandboxError):
    """A command server's process is gone before it took the request."""


class LimitExceeded(SandboxError):
    """The running command broke a limit the host watches (the disk limit); the caller kills it."""


# How often the host checks a running command's disk use.
CHECK_EVERY = 0.1


def disk_check(root: Path, limits: SandboxLimits) -> Callable[[], str]:
    """A check for `call_server`: what it says when the tree at `root` holds more than `limits.disk_mb`."""
    limit = limits.disk_mb * 1024 * 1024

    def check() -> str:
        used = disk_usage(root, stop_above=limit)
        return (
            f"the sandbox wrote more than its disk limit ({limits.disk_mb} MB): killed"
            if used > limit
            else ""
        )

    return check

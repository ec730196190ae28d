"""A persistent, interactive bash inside a sandbox, driven with pexpect (Terminus-style keystrokes).

Used for what one-shot commands cannot do: keys such as C-c, programs that prompt. The prompt
carries a random per-session marker and the last exit status; the marker is assembled from two
shell variables at prompt time, so neither the echoed set-up line nor a command's output that
does not know the marker can look like a prompt.

The host bounds an action here as it bounds a command: the shell reads the terminal itself and
keeps only the head and tail halves of `limits.output_bytes` of what it showed (the middle cut
with the command path's marker), so no more than that is ever held; and a `check`
(`channel.disk_check`) runs before the keys are sent, every CHECK_EVERY seconds while they act
and once after: a sandbox over its disk limit has what the keys started interrupted and killed.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from .channel import CHECK_EVERY
from .output import join_cut, new_marker, strip_ansi
from .processes import kill_children
from .protocol import CommandResult, SandboxError, SandboxLimits

# tmux key names a Terminus agent sends, as the bytes a terminal would send.
KEYS = {
    "Enter": "\r",
    "Escape": "\x1b",
    "Tab": "\t",
    "BSpace": "\x7f",
    "Up": "\x1b[A",
    "Down": "\x1b[B",
    "Right": "\x1b[C",
    "Left": "\x1b[D",
}

# A prompt (marker, space, exit status, "$ ") is shorter than this: the last bytes read are held
# back until the next read shows whether they begin one.
_PROMPT_BYTES = 64
# The most one read of the terminal takes.
_READ_BYTES = 1 << 16


def default_signals() -> None:
    """Run in the child between fork and exec: every signal back to its default action and none
    blocked. Ignored and blocked signals survive exec, so without this a host process that ignores
    SIGINT gives the sandbox a shell whose programs C-c cannot interrupt: any job started in the
    background by a script (`nohup python train.py &`, a CI step's `pytest &`) ignores SIGINT and
    SIGQUIT."""
    import signal

    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for number in signal.valid_signals():
        if number not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(number, signal.SIG_DFL)
            except (OSError, ValueError):  # numbers the C library reserves for itself
                pass


class ShellExited(SandboxError):
    """The interactive shell ended (keys such as C-d, or its process died) before showing a prompt."""


class _Kept:
    """What the host keeps of a terminal's output: its first and last halves of `limit` bytes, and
    how many bytes were cut between them (`join_cut` puts the command path's marker there)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.half = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.cut = 0

    def add(self, data: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        extra = len(self.tail) - (self.limit - self.half)
        if extra > 0:
            del self.tail[:extra]
            self.cut += extra

    def text(self) -> str:
        return strip_ansi(join_cut(bytes(self.head + self.tail), self.cut, self.limit))


class InteractiveShell:
    """bash -i in a sandbox (argv from `sandbox.interactive_argv()`); `close()` ends it.

    `limits`: its `output_bytes` bounds each result's output (SandboxLimits' default when None).
    `check`: the sandbox's disk check (`channel.disk_check`), run around and during `send_keys`.
    `exited` turns True once the shell has ended; `send_keys` reports that as its result.
    """

    def __init__(
        self,
        argv: list[str],
        timeout: float = 10.0,
        limits: SandboxLimits | None = None,
        check: Callable[[], str] | None = None,
    ) -> None:
        import pexpect

        self.exited = False
        self.output_bytes = (limits or SandboxLimits()).output_bytes
        self.check = check
        self.marker = new_marker()
        head, tail = self.marker[:9], self.marker[9:]
        self._prompt = re.compile(re.escape(self.marker.encode()) + rb" (\d+)\$ ")
        # What was read after the last prompt: the start of the next read.
        self._rest = b""
        # Bytes, read in `_read`: pexpect's own reads (expect) would hold all the terminal showed.
        self.child = pexpect.spawn(
            argv[0],
            argv[1:],
            timeout=timeout,
            echo=False,
            dimensions=(50, 200),
            preexec_fn=default_signals,
        )
        self.child.sendline(
            f"stty -echo; __a={head}; __b={tail}; PS2=''; PROMPT_COMMAND=''; "
            "PS1='${__a}${__b} $?$ '; [ -r /.pivot/env.sh ] && . /.pivot/env.sh >/dev/null 2>&1; true"
        )
        self._read(timeout, _Kept(self.output_bytes))

    def _read(
        self, timeout: float, kept: _Kept, check: Callable[[], str] | None = None
    ) -> tuple[int | None, str]:
        """Read the terminal into `kept` until a prompt shows, `timeout` seconds pass, or `check`
        (called every CHECK_EVERY seconds) answers; returns (the prompt's exit status, None
        without one; check's answer, "" when none). Raises ShellExited when the shell ends."""
        import pexpect

        pending, self._rest = self._rest, b""
        now = time.monotonic()
        deadline, next_check = now + timeout, now + CHECK_EVERY
        while True:
            found = self._prompt.search(pending)
            if found:
                kept.add(pending[: found.start()])
                self._rest = pending[found.end() :]
                return int(found.group(1)), ""
            if len(pending) > _PROMPT_BYTES:
                kept.add(pending[:-_PROMPT_BYTES])
                pending = pending[-_PROMPT_BYTES:]
            now = time.monotonic()
            if check is not None and now >= next_check:
                broken = check()
                if broken:
                    kept.add(pending)
                    return None, broken
                now = time.monotonic()
                next_check = now + CHECK_EVERY
            if now >= deadline:
                kept.add(pending)
                return None, ""
            wake = min(deadline, next_check) if check is not None else deadline
            try:
                pending += self.child.read_nonblocking(_READ_BYTES, timeout=max(wake - now, 0.0))
            except pexpect.TIMEOUT:
                continue
            except pexpect.EOF:
                kept.add(pending)
                self.exited = True
                raise ShellExited(f"the interactive shell exited: {kept.text()[-300:]}") from None

    def run(self, command: str, timeout: float = 10.0) -> CommandResult:
        """Type a command and Enter; on timeout send C-c and wait for the prompt again."""
        if self.child.closed:
            raise ShellExited("the interactive shell was closed")
        start = time.monotonic()
        kept = _Kept(self.output_bytes)
        self.child.sendline(command)
        status, _ = self._read(timeout, kept)
        if status is None:
            self.child.sendcontrol("c")
            self._read(5.0, kept)
            return CommandResult(command, 137, kept.text(), True, kept.cut, None, time.monotonic() - start)
        output = kept.text().lstrip("\r\n")
        return CommandResult(command, status, output, False, kept.cut, None, time.monotonic() - start)

    def send_keys(self, keys: str, wait: float = 1.0) -> CommandResult:
        """Send tmux-style keys ("C-c", "Enter", or literal text) and read what appears within `wait` seconds.

        With a `check`: a sandbox it finds over its disk limit before the keys are sent gets none;
        one it finds over while the keys act or right after has what they started interrupted and
        killed (this shell ends), with the check's note at the end of the output.
        """
        if self.child.closed:
            raise ShellExited("the interactive shell was closed (a disk check killed what its keys started)")
        start = time.monotonic()
        broken = self.check() if self.check is not None else ""
        if broken:
            return CommandResult(keys, 137, f"[{broken}]\n", False, 0, None, time.monotonic() - start)
        kept = _Kept(self.output_bytes)
        if re.fullmatch(r"C-[a-z\\\]]", keys):
            self.child.sendcontrol(keys[-1])
        elif keys in KEYS:
            self.child.send(KEYS[keys])
        else:
            self.child.send(keys)
        ended = ""
        try:
            status, broken = self._read(wait, kept, self.check)
        except ShellExited:
            # The keys ended the shell (C-d at an empty prompt, `exit` typed): their effect, reported as such.
            status, ended = self._exit_status(), "\n[the shell exited]\n"
        if not broken and self.check is not None:
            broken = self.check()  # what the keys wrote since the last check
        output = kept.text() + ended
        if broken:
            self._stop()
            output, status = output + f"\n[{broken}]\n", 137
        status = status if status is not None else -1
        return CommandResult(keys, status, output, False, kept.cut, None, time.monotonic() - start)

    def _stop(self) -> None:
        """Interrupt what the keys started (C-c), then kill it: the shell's processes (for bubblewrap
        its whole sandbox process tree; a container's go with the container)."""
        if not self.exited:
            try:
                self.child.sendcontrol("c")
            except OSError:
                pass
        self.close()

    def _exit_status(self, within: float = 2.0) -> int | None:
        """The ended shell's exit status (None if its process has not ended within `within` seconds)."""
        deadline = time.monotonic() + within
        while self.child.isalive() and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.child.exitstatus

    def close(self) -> None:
        """End the shell and the process behind it."""
        # A bwrap's child is its namespace's init: killed first, bwrap reaps it and exits, where
        # closing the terminal would kill bwrap and leave the init to the host's PID 1 (a zombie
        # for good where PID 1 does not reap, as in many containers). `docker exec` has no child.
        if self.child.closed:
            return
        if kill_children(self.child.pid):
            deadline = time.monotonic() + 2.0
            while self.child.isalive() and time.monotonic() < deadline:
                time.sleep(0.005)
        self.child.close(force=True)

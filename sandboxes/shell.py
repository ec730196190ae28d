"""A persistent, interactive bash inside a sandbox, driven with pexpect (Terminus-style keystrokes).

Used for what one-shot commands cannot do: keys such as C-c, programs that prompt. The prompt
carries a random per-session marker and the last exit status; the marker is assembled from two
shell variables at prompt time, so neither the echoed set-up line nor a command's output that
does not know the marker can look like a prompt.
"""

from __future__ import annotations

import re
import time

from .output import new_marker, strip_ansi
from .processes import kill_children
from .protocol import CommandResult, SandboxError

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


class InteractiveShell:
    """bash -i in a sandbox (argv from `sandbox.interactive_argv()`); `close()` ends it.

    `exited` turns True once the shell has ended; `send_keys` reports that as its result.
    """

    def __init__(self, argv: list[str], timeout: float = 10.0) -> None:
        import pexpect

        self.exited = False
        self.marker = new_marker()
        head, tail = self.marker[:9], self.marker[9:]
        self._prompt = re.compile(re.escape(self.marker) + r" (\d+)\$ ")
        self.child = pexpect.spawn(
            argv[0],
            argv[1:],
            encoding="utf-8",
            codec_errors="replace",
            timeout=timeout,
            echo=False,
            dimensions=(50, 200),
            preexec_fn=default_signals,
        )
        self.child.sendline(
            f"stty -echo; __a={head}; __b={tail}; PS2=''; PROMPT_COMMAND=''; "
            "PS1='${__a}${__b} $?$ '; [ -r /.pivot/env.sh ] && . /.pivot/env.sh >/dev/null 2>&1; true"
        )
        self._wait(timeout)

    def _wait(self, timeout: float) -> tuple[str, int | None]:
        import pexpect

        index = self.child.expect([self._prompt, pexpect.TIMEOUT, pexpect.EOF], timeout=timeout)
        text = strip_ansi(self.child.before or "")
        if index == 0:
            return text, int(self.child.match.group(1))
        if index == 2:
            self.exited = True
            raise ShellExited(f"the interactive shell exited: {text[-300:]}")
        return text, None

    def run(self, command: str, timeout: float = 10.0) -> CommandResult:
        """Type a command and Enter; on timeout send C-c and wait for the prompt again."""
        start = time.monotonic()
        self.child.sendline(command)
        output, status = self._wait(timeout)
        if status is None:
            self.child.sendcontrol("c")
            more, _ = self._wait(5.0)
            return CommandResult(command, 137, output + more, True, 0, None, time.monotonic() - start)
        return CommandResult(command, status, output.lstrip("\r\n"), False, 0, None, time.monotonic() - start)

    def send_keys(self, keys: str, wait: float = 1.0) -> CommandResult:
        """Send tmux-style keys ("C-c", "Enter", or literal text) and read what appears within `wait` seconds."""
        start = time.monotonic()
        if re.fullmatch(r"C-[a-z\\\]]", keys):
            self.child.sendcontrol(keys[-1])
        elif keys in KEYS:
            self.child.send(KEYS[keys])
        else:
            self.child.send(keys)
        try:
            output, status = self._wait(wait)
        except ShellExited:
            # The keys ended the shell (C-d at an empty prompt, `exit` typed): their effect, reported as such.
            output, status = (
                strip_ansi(self.child.before or "") + "\n[the shell exited]\n",
                self._exit_status(),
            )
        return CommandResult(
            keys, status if status is not None else -1, output, False, 0, None, time.monotonic() - start
        )

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
        if kill_children(self.child.pid):
            deadline = time.monotonic() + 2.0
            while self.child.isalive() and time.monotonic() < deadline:
                time.sleep(0.005)
        self.child.close(force=True)

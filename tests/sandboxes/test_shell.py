"""The interactive shell (pexpect) for Terminus-style keystrokes, in both backends."""

from __future__ import annotations

import signal
import time

from pivot_envs.sandboxes.shell import InteractiveShell


def test_commands_run_with_their_exit_status_and_the_shell_persists(sandbox):
    shell = InteractiveShell(sandbox.interactive_argv())
    try:
        first = shell.run("cd /tmp; export A=1; false", timeout=10)
        assert first.exit_code == 1
        second = shell.run("pwd; echo $A", timeout=10)
        assert (second.exit_code, second.output.split()) == (0, ["/tmp", "1"])
    finally:
        shell.close()


def test_control_c_interrupts_a_running_program(sandbox):
    shell = InteractiveShell(sandbox.interactive_argv())
    try:
        shell.send_keys("sleep 100\n", wait=0.5)
        start = time.monotonic()
        result = shell.send_keys("C-c", wait=5)
        assert result.exit_code == 130 and time.monotonic() - start < 5
    finally:
        shell.close()


def test_control_c_works_when_the_host_process_ignores_or_blocks_it(sandbox):
    # ignored and blocked signals survive exec: the shell must not inherit the host's
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        shell = InteractiveShell(sandbox.interactive_argv())
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        signal.signal(signal.SIGINT, previous)
    try:
        shell.send_keys("sleep 100\n", wait=0.5)
        assert shell.send_keys("C-c", wait=5).exit_code == 130
        assert shell.run("echo alive", timeout=10).output.strip() == "alive"
    finally:
        shell.close()


def test_output_that_imitates_a_prompt_does_not_end_the_command_early(sandbox):
    shell = InteractiveShell(sandbox.interactive_argv())
    try:
        fake = "PIVOT0123456789abcdef 0$ "
        result = shell.run(f"echo '{fake}'; sleep 0.5; echo real-end", timeout=10)
        assert "real-end" in result.output and result.exit_code == 0
    finally:
        shell.close()


def test_a_command_past_its_timeout_is_interrupted(sandbox):
    shell = InteractiveShell(sandbox.interactive_argv())
    try:
        result = shell.run("sleep 100", timeout=1)
        assert result.timed_out
        assert shell.run("echo alive", timeout=10).output.strip() == "alive"
    finally:
        shell.close()

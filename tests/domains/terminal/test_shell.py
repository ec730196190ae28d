"""The interactive shell (pexpect) for Terminus-style keystrokes, in both backends."""

from __future__ import annotations

import time

from pivot_envs.domains.terminal.shell import InteractiveShell


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

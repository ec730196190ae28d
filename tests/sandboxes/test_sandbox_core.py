"""The shared sandbox helpers (pivot_envs.sandboxes): output cleaning, runner decoding, file changes."""

from __future__ import annotations

import pytest

from pivot_envs.sandboxes import SandboxError, SandboxLimits, file_changes
from pivot_envs.sandboxes.manifest import manifest
from pivot_envs.sandboxes.output import strip_ansi
from pivot_envs.sandboxes.runner import parse_runner_output


def test_strip_ansi_removes_colours_titles_and_cursor_moves():
    text = "\x1b[1;31mred\x1b[0m \x1b]0;title\x07plain \x1b[2K\x1b[Gdone"
    assert strip_ansi(text) == "red plain done"


def test_strip_ansi_keeps_what_a_progress_bar_left_visible():
    assert strip_ansi("10%\r50%\r100%\nnext") == "100%\nnext"


def test_runner_output_is_decoded_with_exit_code_and_cut_marker():
    limits = SandboxLimits(output_bytes=10)
    raw = b"junk before\nMARK 3 25\n01234abcde"
    result = parse_runner_output(raw, "cmd", "MARK", limits, timeout=5, seconds=0.1)
    assert result.exit_code == 3
    assert result.output == "01234\n[... 15 bytes of output cut ...]\nabcde"
    assert result.truncated == 15
    assert not result.timed_out


def test_runner_report_carries_the_shell_state_last_and_cut_with_its_size():
    limits = SandboxLimits(output_bytes=10)
    # the listing: NUL-separated ("type mode ./path", link target) pairs
    raw = b'MARK 0 2\nok\nMARK manifest\nf 644 ./a.txt\0\0MARK digests\nd41d8  ./a.txt\nMARK shell 23\ndeclare -x A="1"\ncd -- /app\n'
    result = parse_runner_output(raw, "cmd", "MARK", limits, timeout=5, seconds=0.1)
    assert result.files == {"a.txt": "f 644 d41d8"}
    assert result.shell == 'declare -x A="1"\ncd -- /app\n'
    from pivot_envs.sandboxes.protocol import SHELL_BYTES

    big = b"x" * (SHELL_BYTES + 100)
    raw = b"MARK 0 0\n\nMARK manifest\nMARK digests\nMARK shell %d\n%s" % (
        SHELL_BYTES + 500,
        big[:SHELL_BYTES],
    )
    shell = parse_runner_output(raw, "cmd", "MARK", limits, timeout=5, seconds=0.1).shell
    assert "500 bytes" in shell and len(shell) < SHELL_BYTES + 100  # the cut is marked with its size
    raw = b"MARK 0 0\n\nMARK manifest\nMARK digests\n"  # no shell line: not measured
    assert parse_runner_output(raw, "cmd", "MARK", limits, timeout=5, seconds=0.1).shell is None


def test_runner_output_without_its_header_is_a_sandbox_error():
    with pytest.raises(SandboxError, match="did not report"):
        parse_runner_output(b"bash: not found\n", "cmd", "MARK", SandboxLimits(), 5, 0.1)


def test_a_sigkill_at_the_time_limit_counts_as_timed_out_but_an_early_one_does_not():
    limits = SandboxLimits()
    assert parse_runner_output(b"M 137 0\n", "c", "M", limits, timeout=2, seconds=2.01).timed_out
    assert not parse_runner_output(b"M 137 0\n", "c", "M", limits, timeout=2, seconds=0.3).timed_out


def test_file_changes_reports_added_removed_and_modified_paths(tmp_path):
    (tmp_path / "keep").write_text("same")
    (tmp_path / "edit").write_text("v1")
    (tmp_path / "gone").write_text("x")
    before = manifest(tmp_path)
    (tmp_path / "edit").write_text("v2")
    (tmp_path / "gone").unlink()
    (tmp_path / "new").write_text("n")
    (tmp_path / "keep").chmod(0o600)
    changes = {(c.path, c.kind) for c in file_changes(before, manifest(tmp_path))}
    assert changes == {("edit", "modified"), ("gone", "removed"), ("new", "added"), ("keep", "modified")}


def test_manifest_leaves_out_git_internals(tmp_path):
    (tmp_path / ".git" / "objects").mkdir(parents=True)
    (tmp_path / ".git" / "HEAD").write_text("ref")
    (tmp_path / "a.txt").write_text("a")
    assert set(manifest(tmp_path)) == {".", "a.txt"}

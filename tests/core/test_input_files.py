"""Input and output files that are valid but awkward, or a disk that fills up: every command reads
what can be read, names what cannot with its file and line, finishes, and loses nothing.

The records are the bundled tau-bench airline candidates; the commands are the real `pivotrl`
ones; profiling samples from a real OpenAI-compatible HTTP server (scripted, no model).
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import pytest
from chat_completions_stub import ChatCompletionsStub

import pivot_envs
from pivot_envs.cli import main
from pivot_envs.jsonl import JsonlError, iter_records
from pivot_envs.pivot import PivotFormatError, PivotWriter, iter_pivots, read_pivots

ROOT = Path(__file__).resolve().parents[2]
TERMINAL_PIVOTS = ROOT / "domains" / "terminal" / "data" / "pivots.jsonl"
SURROGATE = "\\ud800"  # a lone surrogate escape: valid JSON, not Unicode text


def airline_lines(count: int) -> list[str]:
    """The first `count` bundled airline candidates, one JSON line each (ASCII, as json.dumps writes)."""
    from pivot_envs.domains.tool_use.env import bundled_pivots

    return [json.dumps(pivot.to_dict()) for pivot in bundled_pivots()[:count]]


def with_surrogate(line: str) -> str:
    """The line with a lone surrogate escape put into its first message's content."""
    marker = '"content": "'
    at = line.index(marker) + len(marker)
    return line[:at] + SURROGATE + line[at:]


def write_lines(path: Path, lines: list[str], prefix: bytes = b"") -> Path:
    path.write_bytes(prefix + "".join(line + "\n" for line in lines).encode())
    return path


def ids_in(path: Path) -> list[str]:
    return [json.loads(line)["id"] for line in path.read_text(encoding="utf-8").splitlines()]


# -- a lone surrogate --------------------------------------------------------------------------------


COMMANDS = {
    "extract": lambda src, out: ["extract", str(src), "--out", str(out)],
    "split": lambda src, out: [
        "split",
        str(src),
        "--heldout",
        "0",
        "--train-out",
        str(out),
        "--heldout-out",
        str(out.with_name("heldout.jsonl")),
    ],
    "export": lambda src, out: ["export", str(src), "--out", str(out)],
    "filter": lambda src, out: ["filter", str(src), "--mode", "cand", "--out", str(out)],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_record_holding_a_lone_surrogate_is_reported_with_its_line_and_skipped(tmp_path, capsys, command):
    lines = airline_lines(4)
    source = write_lines(tmp_path / "in.jsonl", [lines[0], with_surrogate(lines[1]), *lines[2:]])
    out = tmp_path / "out.jsonl"
    assert main(["-q", *COMMANDS[command](source, out)]) == 0
    err = capsys.readouterr().err
    assert f"{source}:2: invalid text: a lone surrogate" in err and "messages[0].content" in err
    assert "Traceback" not in err
    written = out.read_bytes()
    written.decode("utf-8")  # valid UTF-8 throughout
    assert len(written.splitlines()) == 3


def test_a_record_holding_a_lone_surrogate_in_a_json_list_is_reported_by_its_index(tmp_path, capsys):
    lines = airline_lines(2)
    source = tmp_path / "list.json"
    source.write_text(f"[{lines[0]},\n{with_surrogate(lines[1])}]")
    assert main(["-q", "extract", str(source), "--out", str(tmp_path / "out.jsonl")]) == 0
    assert f"{source}:[1]: invalid text: a lone surrogate" in capsys.readouterr().err


def test_a_surrogate_pair_is_text_and_reads_as_one_character(tmp_path):
    line = airline_lines(1)[0].replace('"content": "', '"content": "\\ud83d\\ude00', 1)
    pivots = read_pivots(write_lines(tmp_path / "emoji.jsonl", [line]))
    assert pivots[0].messages[0]["content"].startswith("\U0001f600")


def profile_argv(source: Path, out: Path, url: str) -> list[str]:
    return ["profile", str(source), "--policy", f"openai:{url}#scripted", "--out", str(out), "--k", "2"]


def scripted(first: str):
    """A scripted policy whose first sample of each chat is `first` and the other ones "Sure."."""
    stub = ChatCompletionsStub(lambda body, j: {"role": "assistant", "content": first if j == 0 else "Sure."})
    yield stub.url
    stub.close()


@pytest.fixture
def policy_server():
    """A scripted policy whose first sample holds a lone surrogate (a broken decoder's output)."""
    yield from scripted("I can help \ud800 with that")


@pytest.fixture
def plain_policy_server():
    yield from scripted("I can help with that.")


def test_profile_finishes_a_file_holding_a_lone_surrogate_and_scores_a_surrogate_action_zero(
    tmp_path, capsys, policy_server
):
    lines = airline_lines(4)
    source = write_lines(tmp_path / "candidates.jsonl", [lines[0], with_surrogate(lines[1]), *lines[2:]])
    out = tmp_path / "profiled.jsonl"
    for _ in range(2):  # a rerun resumes: the record is reported again, and nothing is profiled twice
        assert main(["-q", *profile_argv(source, out, policy_server), "--env-workers", "1"]) == 0
        err = capsys.readouterr().err
        assert f"{source}:2: invalid text: a lone surrogate" in err and "Traceback" not in err
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [row["id"] for row in rows] == [json.loads(lines[i])["id"] for i in (0, 2, 3)]
    for row in rows:
        profile = row["profile"]
        assert profile["rewards"][0] == 0.0 and profile["categories"][0] not in ("", "correct")
        assert profile["valid"] == [True, True]  # the action's fault, not the env's
        assert profile["actions"][0] == "I can help \ufffd with that"
    assert main(["-q", "filter", str(out), "--mode", "cand", "--out", str(tmp_path / "kept.jsonl")]) == 0
    assert len(ids_in(tmp_path / "kept.jsonl")) == 3  # every profiled row reads back


def test_the_writer_keeps_a_lone_surrogate_it_is_handed_as_an_escape(tmp_path):
    path = tmp_path / "out.jsonl"
    record = {"id": "a", "text": "left \ud800 right"}
    with PivotWriter(path, append=False) as writer:
        writer.write(record)
    data = path.read_bytes()
    assert json.loads(data.decode("utf-8")) == record  # valid UTF-8, the same string back
    with pytest.raises(JsonlError, match=r"out.jsonl:1: a lone surrogate .* in text"):
        list(iter_records(path))


# -- a byte order mark, a cut-off .gz, bytes that are not UTF-8 ----------------------------------------


def test_a_utf8_bom_does_not_cost_the_first_record(tmp_path, capsys):
    source = write_lines(tmp_path / "bom.jsonl", airline_lines(3), prefix=b"\xef\xbb\xbf")
    assert [pivot.id for pivot in read_pivots(source)] == [
        json.loads(line)["id"] for line in airline_lines(3)
    ]
    out = tmp_path / "out.jsonl"
    assert main(["extract", str(source), "--out", str(out)]) == 0
    assert len(ids_in(out)) == 3 and "skipped (malformed): 0" in capsys.readouterr().out
    listed = tmp_path / "bom.json"
    listed.write_bytes(b"\xef\xbb\xbf[" + ",".join(airline_lines(2)).encode() + b"]")
    assert main(["extract", str(listed), "--out", str(out)]) == 0
    assert len(ids_in(out)) == 2


def cut_gzip(tmp_path: Path, lines: list[str], keep: float) -> Path:
    """A .jsonl.gz of `lines` cut after `keep` of its compressed bytes (a copy that stopped early)."""
    data = gzip.compress("".join(line + "\n" for line in lines).encode())
    path = tmp_path / f"cut-{keep}.jsonl.gz"
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def test_a_cut_off_gz_gives_the_records_before_the_cut_and_says_it_was_cut(tmp_path, capsys):
    lines = airline_lines(40)
    source = cut_gzip(tmp_path, lines, 0.6)
    out = tmp_path / "out.jsonl"
    assert main(["extract", str(source), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    read = ids_in(out)
    assert 0 < len(read) < 40 and read == [json.loads(line)["id"] for line in lines[: len(read)]]
    assert f"{source}: cut-off file: the gzip stream is cut off after" in captured.err
    assert "empty" not in captured.err
    streamed = []
    cut = rf"{source}: the gzip stream is cut off after line {len(read)}; the lines before it were read"
    with pytest.raises(PivotFormatError, match=cut):
        streamed.extend(pivot.id for pivot in iter_pivots(source))
    assert streamed == read


def test_a_gz_cut_before_its_first_record_is_reported_as_cut_not_as_empty(tmp_path, capsys):
    source = cut_gzip(tmp_path, airline_lines(3), 0.02)
    assert main(["extract", str(source), "--out", str(tmp_path / "out.jsonl")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"pivotrl extract: error: {source}: no pivot could be read (first: {source}: ")
    assert "the gzip stream is cut off" in err[-1] and "empty" not in err[-1]


def test_the_pivot_reader_names_the_line_that_is_not_utf8(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(airline_lines(1)[0].encode() + b'\n{"id": "caf\xe9"}\n')
    with pytest.raises(PivotFormatError, match=r"latin1.jsonl:2: not UTF-8 at byte 11"):
        read_pivots(path)


# -- a full disk ---------------------------------------------------------------------------------------


@pytest.fixture(params=["tmpfs", "file-size limit"])
def small_disk(request, tmp_path):
    """(a directory, the preexec_fn of a command writing there) where writes fail after ~100 KiB: a
    real 100 KiB tmpfs (ENOSPC), or a file-size rlimit (EFBIG) where mounting is not allowed."""
    where = tmp_path / "disk"
    where.mkdir()
    if request.param == "file-size limit":
        yield where, lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (100 << 10, 100 << 10))
        return
    mounted = (
        os.geteuid() == 0
        and (
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=100k", "tmpfs", str(where)], capture_output=True
            )
        ).returncode
        == 0
    )
    if not mounted:
        pytest.skip(
            "cannot mount a tmpfs here (not root, or no CAP_SYS_ADMIN): the file-size limit case runs"
        )
    try:
        yield where, None
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def run_cli(argv: list[str], preexec) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pivot_envs", "-q", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=preexec,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )


def test_a_full_disk_is_one_line_naming_the_output_and_profile_keeps_every_whole_row(
    tmp_path, small_disk, plain_policy_server
):
    where, preexec = small_disk
    source = write_lines(tmp_path / "candidates.jsonl", airline_lines(30))
    out = where / "profiled.jsonl"
    done = run_cli([*profile_argv(source, out, plain_policy_server), "--env-workers", "1"], preexec)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert err[-1].startswith(f"pivotrl profile: error: {out}: cannot write it: ")
    assert err[-1].endswith("records written before (no partial line)")
    kept = out.read_bytes()
    assert kept.endswith(b"\n") and 0 < len(kept.splitlines()) < 30
    assert all(json.loads(line)["profile"] for line in kept.splitlines())  # whole rows only
    extracted = where / "candidates.jsonl"
    done = run_cli(["extract", str(source), "--out", str(extracted)], preexec)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(f"pivotrl extract: error: --out {extracted}: cannot write it: ")
    )


# -- pivots of another domain -----------------------------------------------------------------------------


def test_an_env_handed_a_file_of_another_domains_pivots_warns_naming_both(recwarn):
    gym.register_envs(pivot_envs)
    env = gym.make("pivot/tool-use-v0", pivots=str(TERMINAL_PIVOTS))
    env.close()
    found = [str(warning.message) for warning in recwarn.list]
    assert any(
        f"{TERMINAL_PIVOTS}: " in text and "pivots are of domain 'terminal', not 'tool-use'" in text
        for text in found
    ), found


def test_an_env_handed_its_own_domains_pivots_does_not_warn(tmp_path):
    source = write_lines(tmp_path / "own.jsonl", airline_lines(3))
    gym.register_envs(pivot_envs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gym.make("pivot/tool-use-v0", pivots=str(source), disable_env_checker=True).close()


def test_profile_with_an_env_of_another_domain_warns_before_scoring(tmp_path, capsys, plain_policy_server):
    source = write_lines(tmp_path / "candidates.jsonl", airline_lines(2))
    argv = [*profile_argv(source, tmp_path / "out.jsonl", plain_policy_server), "--env", "pivot/search-v0"]
    main(argv)
    err = capsys.readouterr().err
    assert (
        "pivotrl: warning: --env pivot/search-v0: 2 of 2 pivots are of domain 'tool-use', not 'search'" in err
    )


def test_pivots_of_another_domain_given_in_memory_are_warned_about():
    from pivot_envs.domains.tool_use.env import ToolUseEnv

    env = ToolUseEnv()
    foreign = [replace(env.pivots[0], domain="search", id="elsewhere/1")]
    with pytest.warns(UserWarning, match="domain 'search'"):
        ToolUseEnv(pivots=foreign)

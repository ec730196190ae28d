"""Line-numbered JSONL records: blank lines skipped, bad lines named by file and line in the caller's error."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from pivot_envs.errors import PivotEnvsError
from pivot_envs.jsonl import JsonlError, iter_records


class TaskTroubleError(PivotEnvsError, ValueError):
    """A caller's own error class."""


def test_records_come_with_their_line_numbers_and_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "a"}\n\n   \n{"id": "b", "n": [1, 2]}\n', encoding="utf-8")
    assert list(iter_records(path)) == [(1, {"id": "a"}), (4, {"id": "b", "n": [1, 2]})]


def test_a_gzipped_file_reads_as_the_plain_one(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl.gz"
    path.write_bytes(gzip.compress('{"id": "é"}\n'.encode()))
    assert list(iter_records(path)) == [(1, {"id": "é"})]


def test_a_line_that_is_not_json_raises_the_callers_error_naming_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "a"}\n{"id": \n', encoding="utf-8")
    with pytest.raises(TaskTroubleError, match=rf"^{path}:2: not JSON: Expecting value \(column 8\)$"):
        list(iter_records(path, "task", TaskTroubleError))


def test_a_line_that_is_not_an_object_names_what_it_should_be(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "a"}\n["a"]\n', encoding="utf-8")
    with pytest.raises(JsonlError, match=rf"^{path}:2: a task must be a JSON object, got list$"):
        list(iter_records(path, "task"))


def test_records_before_a_bad_line_are_yielded_first(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "a"}\n7\n', encoding="utf-8")
    records = iter_records(path)
    assert next(records) == (1, {"id": "a"})
    with pytest.raises(JsonlError, match="got int"):
        next(records)

"""`pivotrl search build`, `build-sample` and `query`."""

from __future__ import annotations

import gzip
import json

import gymnasium as gym
import pytest

import pivot_envs
from pivot_envs.cli import main
from pivot_envs.domains.search.cli import PIVOTS_FILE, StaleSampleError, check_sample
from pivot_envs.pivot import read_pivots

gym.register_envs(pivot_envs)

CORPUS = [
    {
        "id": "kite",
        "title": "Mira Kite",
        "text": "Mira Kite is a violinist who founded the Lantern Quartet in Ostrava.",
    },
    {
        "id": "quartet",
        "title": "Lantern Quartet",
        "text": "The Lantern Quartet is a string quartet founded in 1998 by Mira Kite.",
    },
    {
        "id": "ostrava",
        "title": "Ostrava",
        "text": "Ostrava is a city on the Oder river, famous for its steelworks.",
    },
    {
        "id": "oder",
        "title": "Oder",
        "text": "The Oder is a river that flows into the Baltic Sea at Szczecin.",
    },
    {"id": "harbor", "title": "Grey Harbor", "text": "Grey Harbor is a fishing village with a lighthouse."},
]
TASKS = [
    {
        "id": "q1",
        "question": "In which year was the string quartet founded by the violinist Mira Kite formed?",
        "answer": "1998",
        "evidence": ["Mira Kite", "Lantern Quartet"],
    },
    {
        "id": "q2",
        "question": "Into which sea flows the river of the city where the Lantern Quartet was founded?",
        "answer": "Baltic Sea",
        "aliases": ["the Baltic"],
        "evidence": ["Lantern Quartet", "Mira Kite", "Ostrava", "Oder"],
    },
]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def test_the_shipped_sample_is_what_build_sample_makes(capsys):
    assert main(["search", "build-sample", "--check"]) == 0
    assert "up to date" in capsys.readouterr().out


def test_a_stale_sample_fails_the_check_naming_the_pivot(tmp_path):
    lines = gzip.decompress(PIVOTS_FILE.read_bytes()).decode().splitlines(keepends=True)
    record = json.loads(lines[3])
    record["messages"][-1]["content"] += " (an output the engine no longer gives)"
    lines[3] = json.dumps(record, ensure_ascii=False) + "\n"
    stale = tmp_path / "pivots.jsonl.gz"
    stale.write_bytes(gzip.compress("".join(lines).encode()))
    with pytest.raises(StaleSampleError, match=rf"line 4 \(pivot {record['id']}\) differs"):
        check_sample(stale)


def test_build_turns_a_user_task_file_and_corpus_into_pivots_the_env_serves(tmp_path, capsys):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", CORPUS)
    tasks = write_jsonl(tmp_path / "tasks.jsonl", TASKS)
    out = tmp_path / "pivots.jsonl"
    assert (
        main(
            ["search", "build", "--tasks", str(tasks), "--out", str(out), "--corpus", str(corpus), "--k", "2"]
        )
        == 0
    )
    assert "2 tasks -> 2 expert trajectories -> 14 pivots" in capsys.readouterr().out
    pivots = read_pivots(out)
    assert len(pivots) == 5 + 9  # (search, open) per evidence document, then the answer
    assert {p.context["corpus"] for p in pivots} == {str(corpus.resolve())}
    assert {p.context["k"] for p in pivots} == {2}
    assert pivots[-1].context["task"]["evidence"] == ["quartet", "kite", "ostrava", "oder"]
    env = gym.make("pivot/search-v0", pivots=str(out))
    for pivot in pivots:
        _, info = env.reset(options={"pivot": pivot.id})
        assert info["replay"] == "executed", pivot.id
        _, reward, _, _, info = env.step(pivot.expert)
        assert reward == 1.0, (pivot.id, info["category"])
    env.close()


def test_build_finds_an_answer_its_evidence_writes_with_a_non_breaking_space(tmp_path, capsys):
    # The check normalises as the verifier scores: "Frýdek Místek" is the evidence's "Frýdek\xa0Místek".
    quartet = {**CORPUS[1], "text": CORPUS[1]["text"].replace("1998", "1998 in Frýdek\u00a0Místek")}
    corpus = write_jsonl(tmp_path / "corpus.jsonl", [CORPUS[0], quartet, *CORPUS[2:]])
    task = {
        "id": "town",
        "question": "In which town was the Lantern Quartet founded by the violinist Mira Kite?",
        "answer": "Frýdek Místek",
        "evidence": ["Lantern Quartet"],
    }
    tasks, out = write_jsonl(tmp_path / "tasks.jsonl", [task]), tmp_path / "pivots.jsonl"
    argv = ["search", "build", "--tasks", str(tasks), "--out", str(out), "--corpus", str(corpus)]
    assert main(argv) == 0, capsys.readouterr().err
    answer = read_pivots(out)[-1]
    env = gym.make("pivot/search-v0", pivots=str(out))
    env.reset(options={"pivot": answer.id})
    _, reward, _, _, info = env.step(answer.expert)
    env.close()
    assert (reward, info["category"]) == (1.0, "correct_answer"), info["detail"]


def test_build_reports_a_bad_task_line_with_its_number(tmp_path, capsys):
    tasks = write_jsonl(
        tmp_path / "tasks.jsonl", [TASKS[0], {"id": "q9", "question": "Why?", "answer": "Because"}]
    )
    code = main(["search", "build", "--tasks", str(tasks), "--out", str(tmp_path / "out.jsonl")])
    assert code == 1
    assert f"{tasks}:2: missing field 'evidence'" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


def test_build_names_an_unknown_evidence_title_with_a_suggestion(tmp_path, capsys):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", CORPUS)
    tasks = write_jsonl(
        tmp_path / "tasks.jsonl", [{**TASKS[0], "evidence": ["Mira Kite", "Lantern Quartett"]}]
    )
    code = main(
        [
            "search",
            "build",
            "--tasks",
            str(tasks),
            "--out",
            str(tmp_path / "o.jsonl"),
            "--corpus",
            str(corpus),
        ]
    )
    assert code == 1
    assert (
        "evidence 'Lantern Quartett' is not a document of the corpus; did you mean 'Lantern Quartet'?"
        in capsys.readouterr().err
    )


def test_build_skips_an_unsolvable_task_when_asked(tmp_path, capsys):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", CORPUS)
    tasks = write_jsonl(
        tmp_path / "tasks.jsonl", [TASKS[0], {**TASKS[1], "answer": "North Sea", "aliases": []}]
    )
    out = tmp_path / "pivots.jsonl"
    argv = ["search", "build", "--tasks", str(tasks), "--out", str(out), "--corpus", str(corpus)]
    assert main(argv) == 1
    assert "task 'q2': no evidence document states the answer 'North Sea'" in capsys.readouterr().err
    assert main([*argv, "--skip-unreachable"]) == 0
    assert "2 tasks -> 1 expert trajectories -> 5 pivots (1 tasks skipped)" in capsys.readouterr().out
    assert {p.source["trajectory"] for p in read_pivots(out)} == {"q1"}


def test_query_prints_the_top_hits(capsys):
    assert main(["search", "query", "composer of the opera La traviata", "--k", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("1. La traviata  [La_traviata]")
    assert "2. " in out and "3. " not in out


def test_an_empty_query_is_an_error_naming_it(capsys):
    assert main(["search", "query", "  ?! "]) == 1
    assert "the query has no words" in capsys.readouterr().err

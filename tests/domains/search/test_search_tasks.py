"""The search domain's tasks, its scripted expert and the bundled pivots built from them."""

from __future__ import annotations

import gzip
import json

import pytest

from pivot_envs.chat import calls_of
from pivot_envs.domains.search.cli import PIVOTS_FILE
from pivot_envs.domains.search.corpus import Document
from pivot_envs.domains.search.engine import open_engine
from pivot_envs.domains.search.expert import (
    BuildReport,
    ExpertError,
    build_pivots,
    expert_trajectory,
    question_keywords,
)
from pivot_envs.domains.search.tasks import (
    MAX_EVIDENCE,
    SearchTask,
    TaskError,
    answer_in_evidence,
    read_tasks,
    resolve_evidence,
)
from pivot_envs.domains.search.tools import BrowseState, run_call


@pytest.fixture(scope="module")
def engine():
    return open_engine("bundled")


@pytest.fixture(scope="module")
def tasks():
    return read_tasks()


@pytest.fixture(scope="module")
def bundled_pivots(engine, tasks):
    return build_pivots(tasks, engine)


def write_lines(path, *lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def task(**fields):
    record = {
        "id": "t1",
        "question": "In which town was the composer of La traviata born?",
        "answer": "Busseto",
        "evidence": ["La traviata", "Giuseppe Verdi"],
    }
    return json.dumps({**record, **fields})


# -- the bundled tasks ------------------------------------------------------------------------------


def test_at_least_sixty_bundled_tasks_and_most_need_two_documents(tasks):
    assert len(tasks) >= 60
    multi_hop = sum(1 for t in tasks if len(t.evidence) >= 2)
    assert multi_hop >= 0.8 * len(tasks)
    assert len({t.id for t in tasks}) == len(tasks)


def test_every_bundled_answer_is_stated_in_an_evidence_document(engine, tasks):
    for t in tasks:
        texts = [f"{d.title} {d.text}".casefold() for d in resolve_evidence(t, engine)]
        assert any(a.casefold() in text for a in t.answers for text in texts), t.id


def test_the_expert_opens_every_evidence_document_of_every_bundled_task(bundled_pivots, tasks):
    final_turns = [p for p in bundled_pivots if not p.expert.get("tool_calls")]
    assert len(final_turns) == len(tasks)  # no task was skipped
    for pivot in final_turns:
        opened = [
            args["docid"]
            for m in pivot.messages
            if m["role"] == "assistant"
            for name, args in calls_of(m)
            if name == "get_document"
        ]
        assert opened == pivot.context["task"]["evidence"], pivot.id
        assert pivot.expert["content"] == f"Answer: {pivot.context['task']['answer']}"


def test_at_least_150_bundled_pivots_ship(bundled_pivots):
    shipped = gzip.decompress(PIVOTS_FILE.read_bytes()).decode().splitlines()
    assert len(shipped) >= 150
    assert len(shipped) == len(bundled_pivots)
    record = json.loads(shipped[0])
    assert record["domain"] == "search"
    assert set(record["context"]) == {"corpus", "corpus_id", "k", "task"}


def test_bundled_pivots_record_the_corpus_and_the_task(bundled_pivots, engine):
    for pivot in bundled_pivots:
        assert pivot.context["corpus"] == "bundled"
        assert pivot.context["corpus_id"] == engine.corpus_id
        assert pivot.context["k"] == 5
        assert [tool["function"]["name"] for tool in pivot.tools] == ["search", "get_document"]


# -- the expert -------------------------------------------------------------------------------------


def test_expert_searches_the_question_then_the_bridge_then_answers(engine):
    t = SearchTask(
        "verdi",
        "The composer of the opera La traviata was born near which small town?",
        "Busseto",
        ("La traviata", "Giuseppe Verdi"),
    )
    trajectory = expert_trajectory(t, engine)
    calls = [calls_of(m)[0] for m in trajectory.messages if m["role"] == "assistant" and m.get("tool_calls")]
    assert calls == [
        ("search", {"query": "composer opera La traviata born near small town"}),
        ("get_document", {"docid": "La_traviata"}),
        ("search", {"query": "Giuseppe Verdi"}),  # the bridge: named in La traviata's text
        ("get_document", {"docid": "Giuseppe_Verdi"}),
    ]
    assert trajectory.messages[-1] == {"role": "assistant", "content": "Answer: Busseto"}


def test_recorded_tool_outputs_are_what_replaying_the_calls_gives(engine, bundled_pivots):
    pivot = max(bundled_pivots, key=lambda p: len(p.messages))
    state = BrowseState()
    for message, reply in zip(pivot.messages, pivot.messages[1:]):
        for name, arguments in calls_of(message):
            assert run_call(engine, name, arguments, state, k=5).text == reply["content"]


def test_expert_falls_back_to_the_name_when_the_question_does_not_reach_the_evidence(engine):
    question = "In what year was the scientist who discovered the atomic nucleus awarded the Nobel Prize in Chemistry?"
    t = SearchTask("nucleus", question, "1908", ("Atomic nucleus", "Ernest Rutherford"))
    assert "Atomic_nucleus" not in [hit.docid for hit in engine.search(question_keywords(question), k=5)]
    trajectory = expert_trajectory(t, engine)
    first = next(m for m in trajectory.messages if m["role"] == "assistant")
    assert calls_of(first) == [("search", {"query": "Atomic nucleus"})]  # the missed query left no trace


def test_a_task_whose_answer_no_evidence_states_fails_the_build_naming_it(engine):
    t = SearchTask(
        "wrong",
        "Where was the composer of La traviata born?",
        "Vienna",
        ("La traviata", "Giuseppe Verdi"),
        where="tasks.jsonl:7",
    )
    with pytest.raises(
        ExpertError, match=r"tasks.jsonl:7: task 'wrong': no evidence document states the answer 'Vienna'"
    ):
        build_pivots([t], engine)


@pytest.mark.parametrize(
    ("answer", "found"),
    [
        ("Frýdek Místek", True),  # the text's non-breaking space is a space once normalised
        ("St Louis", True),  # "St. Louis": punctuation does not count
        ("Hague", True),  # "The Hague": nor does an article
        ("The", False),  # an answer that normalises to nothing matches nothing when scored
    ],
)
def test_the_answer_is_found_in_evidence_as_the_verifier_normalises_answers(answer, found):
    document = Document("d", "Two towns", "Frýdek\u00a0Místek is far from St. Louis and The Hague.", "")
    t = SearchTask("t", "Which town?", answer, ("Two towns",))
    assert answer_in_evidence(t, [document]) is found


def test_skip_unreachable_leaves_an_unsolvable_task_out_and_counts_it(engine, caplog):
    good = SearchTask(
        "good",
        "Which 1935 opera was written by the composer of Rhapsody in Blue?",
        "Porgy and Bess",
        ("Rhapsody in Blue", "George Gershwin"),
    )
    bad = SearchTask("bad", "Which opera?", "Carmen", ("Rhapsody in Blue",))
    report = BuildReport()
    pivots = build_pivots([bad, good], engine, skip_unreachable=True, report=report)
    assert {p.source["trajectory"] for p in pivots} == {"good"}
    assert report.tasks == 2 and report.trajectories == 1 and report.pivots == len(pivots)
    assert len(report.skipped) == 1 and "'bad'" in report.skipped[0]
    assert "1 tasks skipped" in report.summary()
    assert "'bad'" in caplog.text


def test_an_evidence_document_no_query_reaches_is_reported(tmp_path):
    # Six documents share every word of the title "Report"; at k=1 the one named "Report" ranks below them.
    lines = [
        json.dumps({"id": f"r{i}", "title": f"Report {i}", "text": "report report report report"})
        for i in range(6)
    ]
    lines.append(
        json.dumps({"id": "target", "title": "Report", "text": "The answer is 42. Some other words here."})
    )
    corpus = write_lines(tmp_path / "corpus.jsonl", *lines)
    t = SearchTask("deep", "Which number is hidden?", "42", ("Report",), where="mine.jsonl:3")
    with pytest.raises(
        ExpertError, match=r"mine.jsonl:3: task 'deep': evidence 'Report' is not in the top 1"
    ):
        expert_trajectory(t, open_engine(str(corpus)), k=1)


# -- the task file format ----------------------------------------------------------------------------


def test_a_user_task_file_is_read_with_aliases(tmp_path):
    path = write_lines(tmp_path / "tasks.jsonl", task(aliases=["Busseto, Italy"]), "", task(id="t2"))
    first, second = read_tasks(path)
    assert first.answers == ("Busseto", "Busseto, Italy")
    assert first.evidence == ("La traviata", "Giuseppe Verdi")
    assert second.id == "t2" and second.where == f"{path}:3"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"tasks.jsonl:2: not JSON"),
        ('["a list"]', r"tasks.jsonl:2: a task must be a JSON object"),
        (
            json.dumps({"id": "x", "question": "q?", "answer": "a"}),
            r"tasks.jsonl:2: missing field 'evidence'",
        ),
        (task(evidense=["x"]), r"tasks.jsonl:2: unknown field 'evidense'; did you mean 'evidence'\?"),
        (task(evidence=[]), r"tasks.jsonl:2: 'evidence' is empty"),
        (task(evidence="La traviata"), r"tasks.jsonl:2: 'evidence' must be a list of non-empty strings"),
        (task(answer=3), r"tasks.jsonl:2: 'answer' must be a non-empty string"),
        (task(aliases=[""]), r"tasks.jsonl:2: 'aliases' must be a list of non-empty strings"),
        (task(evidence=["x"] * (MAX_EVIDENCE + 1)), rf"tasks.jsonl:2: {MAX_EVIDENCE + 1} evidence documents"),
        (task(), r"tasks.jsonl:2: duplicate task id 't1' \(first on line 1\)"),
    ],
)
def test_a_bad_task_line_is_reported_with_its_line_number(tmp_path, line, message):
    path = write_lines(tmp_path / "tasks.jsonl", task(), line)
    with pytest.raises(TaskError, match=message):
        read_tasks(path)


def test_an_empty_task_file_is_an_error(tmp_path):
    with pytest.raises(TaskError, match="no tasks"):
        read_tasks(write_lines(tmp_path / "tasks.jsonl", ""))


def test_an_unknown_evidence_title_is_named_with_the_closest_title(tmp_path, engine):
    path = write_lines(
        tmp_path / "tasks.jsonl", task(), task(id="t2", evidence=["La traviata", "Giusepe Verdi"])
    )
    second = read_tasks(path)[1]
    with pytest.raises(
        TaskError,
        match=rf"{path}:2: task 't2': evidence 'Giusepe Verdi' is not a document of the "
        r"corpus; did you mean 'Giuseppe Verdi'\?",
    ):
        resolve_evidence(second, engine)


def test_evidence_is_found_by_title_docid_or_url(engine):
    t = SearchTask(
        "refs", "q?", "a", ("la TRAVIATA", "Giuseppe_Verdi", "https://en.wikipedia.org/wiki/Busseto_missing")
    )
    with pytest.raises(TaskError, match="Busseto_missing"):
        resolve_evidence(t, engine)
    t = SearchTask(
        "refs", "q?", "a", ("la TRAVIATA", "Giuseppe_Verdi", "https://en.wikipedia.org/wiki/Rhapsody_in_Blue")
    )
    assert [d.docid for d in resolve_evidence(t, engine)] == [
        "La_traviata",
        "Giuseppe_Verdi",
        "Rhapsody_in_Blue",
    ]


def test_the_same_document_twice_in_evidence_is_an_error(engine):
    t = SearchTask("twice", "q?", "a", ("La traviata", "La_traviata"))
    with pytest.raises(TaskError, match="names document 'La_traviata' a second time"):
        resolve_evidence(t, engine)

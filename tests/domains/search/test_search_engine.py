"""The search domain's engine: the corpus, the FTS5 index (built once, opened read-only) and its queries."""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pivot_envs.config import ConfigError
from pivot_envs.domains.search.corpus import CorpusError, Document, read_corpus
from pivot_envs.domains.search.engine import (
    MAX_POSTINGS,
    MAX_TERMS,
    EngineError,
    FtsEngine,
    QueryError,
    build_index,
    index_for_corpus,
    open_engine,
    query_terms,
)
from pivot_envs.env import InfrastructureError

# The bundled corpus's fingerprint: pivots record it, so it must not change without notice.
BUNDLED_CORPUS_ID = "cc7a9ab34aa8e470"
SMALL = [
    {
        "id": "d1",
        "title": "Ada Lovelace",
        "text": "Ada Lovelace wrote the first computer program for the Analytical Engine.",
    },
    {
        "id": "d2",
        "title": "Charles Babbage",
        "text": "Babbage designed the Analytical Engine, a mechanical computer.",
    },
    {
        "id": "d3",
        "title": "Grace Hopper",
        "text": "Hopper wrote the first compiler.",
        "url": "https://example.org/hopper",
    },
]


@pytest.fixture(scope="module")
def engine() -> FtsEngine:
    return open_engine()


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in records))
    return path


def test_bm25_finds_an_article_by_a_paraphrase(engine):
    hits = engine.search("physicist who came up with relativity")
    assert hits[0].docid == "Albert_Einstein"
    assert hits[0].url == "https://en.wikipedia.org/wiki/Albert_Einstein"
    assert "relativity" in hits[0].snippet


@pytest.mark.parametrize(
    "query",
    ['"Albert Einstein', "Einstein*", "NOT Einstein", "Einstein OR", "AND Einstein", "(Einstein",
     "Einstein)", "title:Einstein", "Einstein^2", "NEAR(Einstein", 'Einstein" OR "'],
)  # fmt: skip
def test_fts5_syntax_is_searched_as_plain_words(engine, query):
    assert "Albert_Einstein" in [hit.docid for hit in engine.search(query)]


@pytest.mark.parametrize(
    ("query", "category"),
    [("", "empty_query"), ("   \n", "empty_query"), ('*** "" ()', "empty_query"), ("x" * (1 << 20), "query_too_long"),
     (" ".join(f"w{n}" for n in range(MAX_TERMS + 1)), "query_too_long"), (None, "bad_argument"),
     (["Einstein"], "bad_argument")],
)  # fmt: skip
def test_bad_queries_are_query_errors_with_a_category(engine, query, category):
    with pytest.raises(QueryError) as raised:
        engine.search(query)
    assert raised.value.category == category


@pytest.mark.parametrize("k", [0, -1, 51, 2.5, True, "5"])
def test_k_outside_one_to_fifty_is_a_bad_argument(engine, k):
    with pytest.raises(QueryError) as raised:
        engine.search("Einstein", k)
    assert raised.value.category == "bad_argument"


def test_k_bounds_the_number_of_hits(engine):
    assert len(engine.search("war", 3)) == 3
    assert len(engine.search("war", 50)) == 50


def test_common_words_are_not_scored(engine):
    assert engine.search("the theory of relativity") == engine.search("theory relativity")
    assert engine.search("the of and") == []


def test_a_stuffed_query_scores_a_bounded_number_of_postings(engine):
    words = "war city river king music science art law church empire language family battle island " * 2
    terms = engine.scored_terms(query_terms(words))
    assert 0 < len(terms) < len(query_terms(words))
    assert sum(engine._frequency(term) for term in terms) <= MAX_POSTINGS
    assert len(engine.search(words)) == 5


def test_lookup_takes_a_docid_a_url_or_a_title(engine):
    einstein = engine.get("Albert_Einstein")
    assert einstein is not None and einstein.title == "Albert Einstein"
    for ref in ["Albert_Einstein", "https://en.wikipedia.org/wiki/Albert_Einstein", "albert einstein",
                "https://en.wikipedia.org/wiki/Albert_Einstein#Life", " Albert Einstein ",
                "https://en.wikipedia.org/wiki/Albert%20Einstein"]:  # fmt: skip
        assert engine.lookup(ref) == einstein, ref
    assert engine.lookup("https://en.wikipedia.org/wiki/HIV%2FAIDS").docid == "HIV/AIDS"
    assert engine.get("albert einstein") is None
    assert engine.lookup("No such article") is None and engine.lookup("") is None and engine.get(7) is None


def test_the_index_cannot_be_written_through_the_engine(engine):
    before = engine.path.read_bytes()
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        with engine._connection() as connection:
            connection.execute("DELETE FROM docs")
    assert engine.path.read_bytes() == before


def test_envs_share_one_engine_and_one_index_file(engine):
    assert open_engine() is engine and open_engine("bundled") is engine
    # A second engine on the same file reads it in place: no copy appears, both see the same index.
    files = sorted(engine.path.parent.iterdir())
    other = FtsEngine(engine.path)
    assert other.search("Jupiter") == engine.search("Jupiter")
    assert sorted(engine.path.parent.iterdir()) == files
    opened = {os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")}
    assert str(engine.path.resolve()) in opened


def test_one_engine_answers_many_threads_at_once(engine):
    queries = [
        "Jupiter",
        "French painter pointillism",
        "physicist relativity",
        "river Nile",
        "Greek philosopher",
    ] * 4
    expected = [engine.search(query) for query in queries]
    with ThreadPoolExecutor(max_workers=8) as pool:
        assert list(pool.map(engine.search, queries)) == expected


def test_the_bundled_corpus_id_is_stable(engine):
    assert engine.corpus_id == BUNDLED_CORPUS_ID


def test_corpus_id_depends_on_the_documents_only(tmp_path):
    documents = [Document(r["id"], r["title"], r["text"], r.get("url", f"doc://{r['id']}")) for r in SMALL]
    first = FtsEngine(build_index(documents, tmp_path / "a.sqlite"))
    second = FtsEngine(build_index(iter(documents), tmp_path / "elsewhere" / "b.sqlite"))
    changed = FtsEngine(
        build_index([*documents[:2], Document("d3", "Grace Hopper", "changed", "u")], tmp_path / "c.sqlite")
    )
    assert first.corpus_id == second.corpus_id != changed.corpus_id


def test_a_user_corpus_gets_its_own_cached_index(tmp_path, monkeypatch):
    monkeypatch.setenv("PIVOT_ENVS_CACHE", str(tmp_path / "cache"))
    corpus = write_jsonl(tmp_path / "mine.jsonl", SMALL)
    engine = open_engine(str(corpus))
    assert [hit.docid for hit in engine.search("who wrote a compiler")][0] == "d3"
    assert engine.get("d3").url == "https://example.org/hopper" and engine.get("d1").url == "doc://d1"
    assert engine.path.parent == tmp_path / "cache" / "search"
    assert open_engine({"engine": "fts", "corpus": corpus}) is engine
    assert open_engine(engine.path).corpus_id == engine.corpus_id  # the .sqlite index itself


@pytest.mark.parametrize(
    ("line", "message"),
    [("{not json", "not a JSON object"), ('["d9"]', "expected an object"), ('{"id": "d9", "title": "T"}', "'text'"),
     ('{"id": 9, "title": "T", "text": "x"}', "'id' must be a string"), ('{"id": " ", "title": "T", "text": "x"}', "empty"),
     ('{"id": "d9", "title": "T", "text": "x", "url": 3}', "'url'")],
)  # fmt: skip
def test_a_bad_corpus_line_is_reported_with_its_number(tmp_path, monkeypatch, line, message):
    monkeypatch.setenv("PIVOT_ENVS_CACHE", str(tmp_path / "cache"))
    corpus = write_jsonl(tmp_path / "bad.jsonl", [SMALL[0], "", line])
    with pytest.raises(CorpusError, match=rf"bad.jsonl, line 3: .*{message}"):
        open_engine(corpus)
    assert not list((tmp_path / "cache" / "search").glob("*.sqlite"))  # nothing half-built is left


def test_a_duplicate_id_names_both_lines(tmp_path):
    corpus = write_jsonl(tmp_path / "dup.jsonl", [SMALL[0], SMALL[1], SMALL[0]])
    with pytest.raises(CorpusError, match=r"line 3: duplicate id 'd1' \(first on line 1\)"):
        list(read_corpus(corpus))


def test_a_missing_or_unknown_corpus_is_refused(tmp_path):
    with pytest.raises(CorpusError, match="no such file"):
        open_engine(tmp_path / "absent.jsonl")
    with pytest.raises(ConfigError, match="expected 'bundled'"):
        open_engine(tmp_path / "corpus.csv")
    with pytest.raises(ConfigError, match="'engine' must be"):
        open_engine({"engine": "elastic"})


def test_an_unwritable_cache_is_an_engine_error(tmp_path, monkeypatch):
    (tmp_path / "cache").write_text("a file where the cache directory should be")
    monkeypatch.setenv("PIVOT_ENVS_CACHE", str(tmp_path / "cache"))
    with pytest.raises(EngineError, match="set PIVOT_ENVS_CACHE to a writable directory"):
        open_engine(write_jsonl(tmp_path / "mine.jsonl", SMALL))


def test_a_missing_index_is_an_engine_error(tmp_path):
    with pytest.raises(EngineError, match="no such file"):
        FtsEngine(tmp_path / "absent.sqlite")


@pytest.mark.parametrize("damage", ["junk", "truncated", "foreign"])
def test_a_corrupt_index_is_an_engine_error(engine, tmp_path, damage):
    path = tmp_path / "index.sqlite"
    if damage == "junk":
        path.write_bytes(b"this is not a database" * 100)
    elif damage == "truncated":
        path.write_bytes(engine.path.read_bytes()[:8192])
    else:
        sqlite3.connect(path).execute("CREATE TABLE other (x)").connection.close()
    with pytest.raises(EngineError) as raised:
        FtsEngine(path).search("Einstein")
    assert isinstance(raised.value, InfrastructureError)  # the env marks the sample invalid, not 0


def _index_in_child(corpus: str, queue) -> None:
    path = index_for_corpus(corpus)
    queue.put((str(path), path.stat().st_ino))  # a second build would have renamed a new file there


def test_concurrent_builds_make_one_index(tmp_path, monkeypatch):
    monkeypatch.setenv("PIVOT_ENVS_CACHE", str(tmp_path / "cache"))
    # Big enough that unlocked builds would overlap (each renaming its own file into place).
    many = [{"id": f"d{n}", "title": f"Document {n}", "text": f"word {n} " * 40} for n in range(2000)]
    corpus = str(write_jsonl(tmp_path / "shared.jsonl", many))
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    children = [context.Process(target=_index_in_child, args=(corpus, queue)) for _ in range(3)]
    for child in children:
        child.start()
    built = {queue.get(timeout=30) for _ in children}
    for child in children:
        child.join(timeout=30)
    assert len(built) == 1 and [child.exitcode for child in children] == [0, 0, 0]
    name = Path(next(iter(built))[0]).name
    assert sorted(p.name for p in (tmp_path / "cache" / "search").iterdir()) == [name, name + ".lock"]


def _search_in_child(engine: FtsEngine, queue) -> None:
    inherited = list(engine._pool)
    docids = [hit.docid for hit in engine.search("Jupiter")]
    queue.put((docids, bool(inherited) and not any(connection in inherited for connection in engine._pool)))


def test_a_forked_worker_opens_its_own_connection(engine):
    expected = [hit.docid for hit in engine.search("Jupiter")]  # the parent's connection exists now
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_search_in_child, args=(engine, queue))
    child.start()
    assert queue.get(timeout=30) == (expected, True)
    child.join(timeout=30)
    assert [hit.docid for hit in engine.search("Jupiter")] == expected

"""The search engine a search pivot's tool calls run on: SQLite FTS5 with bm25, or an HTTP endpoint.

`open_engine(spec)` gives a `SearchEngine`. The default (`None` or "bundled") is an FTS5 index of
the bundled Wikipedia summaries; a corpus file (.jsonl/.json) gets the same kind of index. An index
is built once into the cache ($PIVOT_ENVS_CACHE, else ~/.cache/pivot-envs, under search/), keyed by
a hash of the corpus file, written to a temporary file and renamed into place under a lock, so
concurrent builds are safe and a killed one leaves nothing half-written. Every env then opens that
one file read-only (`mode=ro`, `immutable=1`): many envs, one index, no copy per env. Within a
process one engine per index is shared; each query borrows one of its pooled SQLite connections,
and a forked process opens its own (gymnasium's AsyncVectorEnv forks its workers).

Queries are free text. FTS5's own syntax (`"`, `*`, `NEAR`, `OR`, `AND`, `NOT`, parentheses, `:`,
`^`) is never interpreted: the query is cut into words (`\\w+`, lowercased, repeats dropped), each
word is quoted, and the words are joined with OR. A document matches when it holds any of the words
(porter-stemmed), and bm25 ranks the matches, with a word in the title weighing `TITLE_WEIGHT`
times one in the text. OR is how web search feels: a paraphrase that shares only some words with
the article still finds it, where AND would find nothing. Its cost is that piling words into one
query never loses a match, so query stuffing can reach a document; bm25 dilutes it (every extra
word lowers the weight of the ones that matter, and documents holding few of them rank low), and a
query has at most `MAX_TERMS` words and `MAX_QUERY_CHARS` characters (beyond: `QueryError`
"query_too_long"). A query with no word at all is "empty_query".

A query's time is bounded too: bm25 costs about 3 us per matching (document, word) pair, and a word
like "the" is in 95% of the summaries. So words in more than `COMMON_FRACTION` of the documents are
not scored (their bm25 weight is near 0 anyway; a query made only of them keeps its rarest), and,
rarest first, words are scored only while their documents add up to `MAX_POSTINGS`: the commonest
words of a long query drop out first (`FtsEngine.scored_terms` says which words count). These
constants, the tokenizer and the weights shape every recorded search result: changing one makes
the bundled pivots stale until they are rebuilt (`pivotrl search build-sample`).

Errors: `QueryError` is the query's fault (the action scores 0 with its category); `EngineError`
is the engine's (a missing or corrupt index, an HTTP endpoint down): the sample is invalid.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import sqlite3
import threading
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pivot_envs.config import ConfigError
from pivot_envs.domains.search.corpus import CorpusError, Document, bundled_corpus_path, read_corpus
from pivot_envs.env import InfrastructureError
from pivot_envs.errors import PivotEnvsError

SCHEMA_VERSION = 1
MAX_TERMS = 32  # like web search engines, which ignore words past 32
MAX_QUERY_CHARS = 1000
MAX_K = 50
TITLE_WEIGHT = 5.0
SNIPPET_TOKENS = 32
COMMON_FRACTION = 0.1  # a word in more than this share of the documents is not scored...
COMMON_MIN_DOCUMENTS = 200  # ...when it is also in more than this many (small corpora keep every word)
MAX_POSTINGS = 2000  # at most this many (document, word) matches are scored per query: bounds its time
MAX_MEMO_TERMS = 100_000
POOLED_CONNECTIONS = 8  # idle connections an engine keeps (a query uses one at a time)
TOKENIZER = "porter unicode61 remove_diacritics 2"
QUERY_CATEGORIES = ("empty_query", "query_too_long", "bad_argument")
_WORD = re.compile(r"\w+")
# Words a search engine gains nothing from: the question's frame, not its content.
STOPWORDS = frozenset(
    """
a an the of in on at to for from by with and or but nor is was were are be been being am which what who
whom whose when where how why that this these those it its his her their he she they him them did does
do has have had as into than then also after before during about over under between first one s
""".split()
)


class QueryError(PivotEnvsError, ValueError):
    """A query the engine refuses (the action's fault); `category` is one of QUERY_CATEGORIES."""

    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category


class EngineError(InfrastructureError):
    """The engine failed (missing or corrupt index, HTTP endpoint down): the sample is invalid."""


@dataclass(frozen=True)
class Hit:
    """One search result: the document's id, title and url, a snippet of its text, its score
    (higher is better; comparable only within one engine)."""

    docid: str
    title: str
    url: str
    snippet: str
    score: float


class SearchEngine(Protocol):
    """What a search env needs from an engine."""

    name: str
    corpus_id: str

    def search(self, query: str, k: int = 5) -> list[Hit]:
        """The top `k` hits for free-text `query`; QueryError for a refused query."""
        ...

    def get(self, docid: str) -> Document | None:
        """The document with this id, or None."""
        ...

    def lookup(self, ref: str) -> Document | None:
        """The document a docid, a url or an exact title (case-insensitive) names, or None."""
        ...


def query_terms(query: Any) -> list[str]:
    """The words of a free-text query (lowercased, first occurrence kept), checked against the bounds.

    Raises QueryError: "bad_argument" (not a string), "query_too_long" (more than MAX_QUERY_CHARS
    characters or MAX_TERMS words), "empty_query" (no word).
    """
    if not isinstance(query, str):
        raise QueryError("bad_argument", f"the query must be a string, got {type(query).__name__}")
    if len(query) > MAX_QUERY_CHARS:
        raise QueryError(
            "query_too_long", f"the query has {len(query)} characters; at most {MAX_QUERY_CHARS} are allowed"
        )
    terms = list(dict.fromkeys(word.lower() for word in _WORD.findall(query)))
    if not terms:
        raise QueryError("empty_query", "the query has no words to search for")
    if len(terms) > MAX_TERMS:
        raise QueryError(
            "query_too_long", f"the query has {len(terms)} distinct words; at most {MAX_TERMS} are allowed"
        )
    return terms


def counted_terms(engine: SearchEngine, query: str) -> tuple[str, ...]:
    """The words of a valid `query` that shape its results: those `engine` scores when it says
    (`FtsEngine.scored_terms`), else its words without STOPWORDS (an HTTP endpoint does not say)."""
    terms = query_terms(query)
    scored = getattr(engine, "scored_terms", None)
    return tuple(scored(terms) if callable(scored) else (term for term in terms if term not in STOPWORDS))


def check_k(k: Any) -> int:
    """`k` if it is an int in 1..MAX_K; QueryError "bad_argument" otherwise."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise QueryError("bad_argument", f"k must be an integer from 1 to {MAX_K}, got {k!r}")
    return k


# -- building an index ------------------------------------------------------------------------------


def build_index(documents: Iterable[Document], target: str | Path) -> Path:
    """Write an FTS5 index of `documents` to `target` (atomically: a temporary file renamed into
    place); returns `target`. Raises CorpusError for a bad corpus (nothing is written then).

    The index's corpus_id is a sha256 prefix over every document's id, title, text and url in
    order: the same documents give the same id on any machine, whatever file they came from."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f"{target.name}.tmp{os.getpid()}-{threading.get_ident()}")
    staging.unlink(missing_ok=True)
    try:
        _write_index(documents, staging)
        os.replace(staging, target)
    finally:
        staging.unlink(missing_ok=True)
    return target


def _write_index(documents: Iterable[Document], path: Path) -> None:
    digest = hashlib.sha256()

    def rows() -> Iterator[tuple[str, str, str, str]]:
        for document in documents:
            digest.update(json.dumps([document.docid, document.title, document.text, document.url]).encode())
            digest.update(b"\n")
            yield document.docid, document.title, document.text, document.url

    connection = sqlite3.connect(path)
    try:
        connection.executescript(f"""
            PRAGMA journal_mode = OFF;
            PRAGMA synchronous = OFF;
            CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
            CREATE TABLE docs (rowid INTEGER PRIMARY KEY, docid TEXT NOT NULL UNIQUE, title TEXT NOT NULL,
                               text TEXT NOT NULL, url TEXT NOT NULL);
            CREATE VIRTUAL TABLE docs_fts USING fts5(title, text, content='docs', content_rowid='rowid',
                                                     tokenize='{TOKENIZER}');
        """)
        try:
            connection.executemany("INSERT INTO docs (docid, title, text, url) VALUES (?, ?, ?, ?)", rows())
        except sqlite3.IntegrityError as error:
            raise CorpusError(f"search corpus for {path}: two documents have the same id ({error})") from None
        count = connection.execute("SELECT count(*) FROM docs").fetchone()[0]
        connection.executescript("""
            CREATE INDEX docs_title ON docs (title COLLATE NOCASE);
            CREATE INDEX docs_url ON docs (url);
            INSERT INTO docs_fts (docs_fts) VALUES ('rebuild');
            INSERT INTO docs_fts (docs_fts) VALUES ('optimize');
        """)
        meta = {"schema": str(SCHEMA_VERSION), "corpus_id": digest.hexdigest()[:16], "documents": str(count)}
        connection.executemany("INSERT INTO meta VALUES (?, ?)", meta.items())
        connection.commit()
    finally:
        connection.close()


def cache_dir() -> Path:
    """Where built indexes live: $PIVOT_ENVS_CACHE/search, else ~/.cache/pivot-envs/search."""
    root = os.environ.get("PIVOT_ENVS_CACHE") or Path.home() / ".cache" / "pivot-envs"
    return Path(root) / "search"


_FILE_KEYS: dict[tuple[str, int, int], str] = {}


def _file_key(path: Path) -> str:
    """sha256 prefix of the file's bytes and the index schema (memoised per path, size and mtime)."""
    stat = path.stat()
    memo = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if memo not in _FILE_KEYS:
        digest = hashlib.sha256(f"schema {SCHEMA_VERSION} {TOKENIZER}\n".encode())
        with path.open("rb") as data:
            for block in iter(lambda: data.read(1 << 20), b""):
                digest.update(block)
        _FILE_KEYS[memo] = digest.hexdigest()[:16]
    return _FILE_KEYS[memo]


def index_for_corpus(corpus: str | Path | None = None) -> Path:
    """The cached index of the corpus file `corpus` (None: the bundled corpus), built on first use.

    Concurrent callers (threads or processes) build it once: the build holds a lock file. Raises
    CorpusError for a bad corpus, EngineError when the cache directory cannot be written.
    """
    path = Path(corpus) if corpus is not None else bundled_corpus_path()
    if not path.is_file():
        raise CorpusError(f"search corpus {path}: no such file")
    stem = "bundled" if corpus is None else path.stem
    target = cache_dir() / f"{stem}-{_file_key(path)}.sqlite"
    if target.is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.with_name(target.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not target.is_file():  # another builder may have finished while this one waited
                build_index(read_corpus(path), target)
    except OSError as error:
        raise EngineError(
            f"cannot write the search index of {path} into {target.parent}: {error} "
            "(set PIVOT_ENVS_CACHE to a writable directory)"
        ) from None
    return target


# -- the FTS5 engine --------------------------------------------------------------------------------


class FtsEngine:
    """Search over an FTS5 index file, opened read-only; safe to share between threads and forks
    (each query takes a pooled connection of its own process)."""

    name = "fts"

    def __init__(self, index: str | Path, immutable: bool = True) -> None:
        """Open `index` (a file written by `build_index`); `immutable` tells SQLite the file never
        changes (true of cached indexes). Raises EngineError for a missing, corrupt or foreign file."""
        self.path = Path(index)
        if not self.path.is_file():
            raise EngineError(f"search index {self.path}: no such file")
        quoted = urllib.parse.quote(str(self.path.resolve()))
        self._uri = f"file:{quoted}?mode=ro" + ("&immutable=1" if immutable else "")
        self._lock = threading.Lock()
        self._pid, self._pool = os.getpid(), []  # idle connections of process _pid
        meta = dict(self._execute("SELECT key, value FROM meta"))
        if meta.get("schema") != str(SCHEMA_VERSION) or "corpus_id" not in meta:
            raise EngineError(
                f"search index {self.path}: schema {meta.get('schema')!r}, this version reads {SCHEMA_VERSION} "
                "(delete the file to rebuild it)"
            )
        self.corpus_id: str = meta["corpus_id"]
        self.documents = int(meta.get("documents", 0))
        self._frequencies: dict[str, int] = {}

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        """A connection of this process for the caller's use alone, taken from the pool (opened when
        the pool is empty) and put back after (closed when the pool holds POOLED_CONNECTIONS)."""
        with self._lock:
            if self._pid != os.getpid():
                # A connection must not cross a fork: a forked child leaves its parent's alone.
                self._pid, self._pool = os.getpid(), []
            connection = self._pool.pop() if self._pool else None
        if connection is None:
            try:
                # Used by one thread at a time (the pool hands it out), not always the one that opened it.
                connection = sqlite3.connect(self._uri, uri=True, check_same_thread=False)
                # Pages come from the OS page cache through mmap (shared by every process) rather
                # than from a private cache per connection.
                connection.execute("PRAGMA mmap_size = 268435456")
                connection.execute("PRAGMA cache_size = -256")
            except sqlite3.Error as error:
                raise EngineError(f"search index {self.path}: cannot open it: {error}") from None
        try:
            yield connection
        finally:
            with self._lock:
                keep = self._pid == os.getpid() and len(self._pool) < POOLED_CONNECTIONS
                if keep:
                    self._pool.append(connection)
            if not keep:
                connection.close()

    def _execute(self, sql: str, parameters: tuple = ()) -> list[tuple]:
        try:
            with self._connection() as connection:
                return connection.execute(sql, parameters).fetchall()
        except sqlite3.Error as error:
            raise EngineError(f"search index {self.path} is not a readable search index: {error}") from None

    def _frequency(self, term: str) -> int:
        """How many documents hold `term` (stemmed as the index does), memoised per engine."""
        if term not in self._frequencies:
            if len(self._frequencies) >= MAX_MEMO_TERMS:
                self._frequencies.clear()
            rows = self._execute("SELECT count(*) FROM docs_fts WHERE docs_fts MATCH ?", (f'"{term}"',))
            self._frequencies[term] = rows[0][0]
        return self._frequencies[term]

    def scored_terms(self, terms: list[str]) -> list[str]:
        """The words of a query that are scored, in query order: words absent from the index are
        left out, and so are common ones (in more than COMMON_FRACTION of the documents and more
        than COMMON_MIN_DOCUMENTS) unless
        every word is common, when the rarest stays; then, rarest first, words are kept while the
        documents they are in add up to at most MAX_POSTINGS (none is kept when the rarest alone is
        in more: such a query finds nothing)."""
        counts = {term: self._frequency(term) for term in terms}
        present = [term for term in terms if counts[term]]
        threshold = max(COMMON_FRACTION * self.documents, COMMON_MIN_DOCUMENTS)
        common = [term for term in present if counts[term] > threshold]
        by_rarity = sorted(present, key=lambda term: counts[term])  # stable: ties keep query order
        if len(common) < len(present):
            by_rarity = [term for term in by_rarity if term not in common]
        kept, postings = set(), 0
        for term in by_rarity[: 1 if len(common) == len(present) else None]:
            postings += counts[term]
            if postings > MAX_POSTINGS:
                break
            kept.add(term)
        return [term for term in terms if term in kept]

    def search(self, query: str, k: int = 5) -> list[Hit]:
        """The top `k` (1..MAX_K) documents holding any scored word of `query` (see scored_terms),
        best bm25 first, ties in corpus order. Raises QueryError for a refused query, EngineError
        when the index fails."""
        terms, k = query_terms(query), check_k(k)
        scored = self.scored_terms(terms)
        if not scored:
            return []
        match = " OR ".join(f'"{term}"' for term in scored)
        # Rank first, then make snippets for the top k only: snippet() costs more than bm25().
        rows = self._execute(
            "WITH top AS (SELECT rowid AS id, bm25(docs_fts, ?2, 1.0) AS rank FROM docs_fts WHERE docs_fts MATCH ?1 "
            "ORDER BY rank, rowid LIMIT ?3) "
            "SELECT d.docid, d.title, d.url, snippet(docs_fts, 1, '', '', '...', ?4), top.rank FROM top "
            "JOIN docs_fts ON docs_fts.rowid = top.id JOIN docs d ON d.rowid = top.id "
            "WHERE docs_fts MATCH ?1 ORDER BY top.rank, top.id",
            (match, TITLE_WEIGHT, k, SNIPPET_TOKENS),
        )
        return [Hit(docid, title, url, snippet, round(-rank, 6)) for docid, title, url, snippet, rank in rows]

    def _document(self, where: str, value: str) -> Document | None:
        rows = self._execute(
            f"SELECT docid, title, text, url FROM docs WHERE {where} ORDER BY rowid LIMIT 1", (value,)
        )
        return Document(*rows[0]) if rows else None

    def get(self, docid: str) -> Document | None:
        """The document with id `docid`, or None (also for a non-string)."""
        return self._document("docid = ?", docid) if isinstance(docid, str) else None

    def lookup(self, ref: str) -> Document | None:
        """The document `ref` names, tried in order as a docid, a url (as written, then decoded and
        without its #fragment, then with spaces as underscores), an exact title (case-insensitive),
        a title with spaces as underscores; None when nothing matches or `ref` is not a string."""
        if not isinstance(ref, str) or not ref.strip():
            return None
        ref = ref.strip()
        decoded = urllib.parse.unquote(ref.partition("#")[0])
        tries = (
            ("docid = ?", ref),
            ("url = ?", ref),
            ("url = ?", decoded),
            ("url = ?", decoded.replace(" ", "_")),  # .../wiki/Albert%20Einstein names Albert_Einstein
            ("title = ? COLLATE NOCASE", ref),
            ("docid = ?", ref.replace(" ", "_")),
        )
        for where, value in tries:
            document = self._document(where, value)
            if document is not None:
                return document
        return None


# -- choosing an engine ------------------------------------------------------------------------------

_ENGINES: dict[Path, FtsEngine] = {}
_ENGINES_LOCK = threading.Lock()


def shared_fts_engine(index: Path) -> FtsEngine:
    """The process's one FtsEngine for the cached index `index` (opened on first use)."""
    key = index.resolve()
    with _ENGINES_LOCK:
        if key not in _ENGINES:
            _ENGINES[key] = FtsEngine(key)
        return _ENGINES[key]


def open_engine(spec: None | str | os.PathLike | dict | SearchEngine = None) -> SearchEngine:
    """The engine `spec` names.

    - None or "bundled": the bundled corpus's index (built into the cache on first use);
    - a path to a `.sqlite` index (opened read-only as it is, never modified);
    - a path to a corpus, `.jsonl` or `.json` (its index built once into the cache);
    - "http://HOST:PORT/PATH" (or https): an HttpEngine on that endpoint;
    - a dict: `{"engine": "fts", "corpus": PATH}` or `{"engine": "fts", "index": PATH}`, or
      `{"engine": "http", "url": URL, ...HttpEngine options}`;
    - an object with `search`, `get` and `lookup`: used as it is.

    Raises ConfigError for a spec it cannot read, CorpusError for a bad corpus file, EngineError
    for a missing or corrupt index.
    """
    if isinstance(spec, dict):
        return _engine_from_dict(spec)
    if spec is None or (isinstance(spec, str) and spec == "bundled"):
        return shared_fts_engine(index_for_corpus(None))
    if not isinstance(spec, (str, os.PathLike)):
        # Not isinstance(spec, SearchEngine): on Python 3.11 that reads corpus_id, which an
        # HttpEngine fetches over the network.
        if all(callable(getattr(spec, method, None)) for method in ("search", "get", "lookup")):
            return spec
        raise ConfigError(
            f"search engine: expected None, 'bundled', a path, a URL, a dict or an engine, got {spec!r:.100}"
        )
    text = os.fspath(spec)
    if text.startswith(("http://", "https://")):
        from pivot_envs.domains.search.http_engine import HttpEngine

        return HttpEngine(text)
    path = Path(text)
    if path.suffix in (".sqlite", ".db"):
        return FtsEngine(path, immutable=False)
    if path.suffix in (".jsonl", ".json"):
        return shared_fts_engine(index_for_corpus(path))
    raise ConfigError(
        f"search engine {text!r}: expected 'bundled', a corpus (.jsonl, .json), an index (.sqlite) or an http(s):// URL"
    )


def _engine_from_dict(spec: dict) -> SearchEngine:
    options = dict(spec)
    kind = options.pop("engine", "fts")
    if kind == "http":
        from pivot_envs.domains.search.http_engine import HttpEngine

        if "url" not in options:
            raise ConfigError("search engine {'engine': 'http'} needs a 'url'")
        try:
            return HttpEngine(**options)
        except TypeError as error:
            raise ConfigError(f"search engine {spec!r}: {error}") from None
    if kind != "fts":
        raise ConfigError(f"search engine {spec!r}: 'engine' must be 'fts' or 'http', got {kind!r}")
    index, corpus = options.pop("index", None), options.pop("corpus", None)
    if options:
        raise ConfigError(
            f"search engine {spec!r}: unknown option(s) {sorted(options)} (fts takes 'corpus' or 'index')"
        )
    if index is not None and corpus is not None:
        raise ConfigError(f"search engine {spec!r}: give 'corpus' or 'index', not both")
    if index is not None:
        return FtsEngine(Path(index), immutable=False)
    if corpus is not None and not isinstance(corpus, (str, os.PathLike)):
        raise ConfigError(f"search engine {spec!r}: 'corpus' must be a path or 'bundled'")
    return open_engine(corpus)

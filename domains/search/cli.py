"""`pivotrl search`: turn search tasks into expert trajectories and pivots, and query the engine.

    pivotrl search build --tasks TASKS.jsonl --out PIVOTS.jsonl [--corpus PATH] [--k 5]
    pivotrl search build-sample [--check]   # the bundled pivots from the bundled tasks (--check: fail when stale)
    pivotrl search query "who composed La traviata" [--corpus PATH] [--k 5]

The search domain's command: the entry point `search` of the group `pivot_envs.commands` names
this module, so the core CLI knows no search. The task file format is in `tasks.py`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pivot_envs.config import add_config, between, command_parser, option
from pivot_envs.errors import PivotEnvsError

NAME = "search"
HELP = "Build search pivots from a task file (build, build-sample) or look up the search engine (query)."
PIVOTS_FILE = Path(__file__).resolve().parent / "data" / "pivots.jsonl.gz"
BUNDLED_K = 5


class StaleSampleError(PivotEnvsError, RuntimeError):
    """The bundled pivots differ from what the bundled tasks give on today's engine and tools."""


@dataclass
class SearchBuildConfig:
    """How `pivotrl search build` turns a task file into pivots."""

    corpus: str = option(
        "bundled",
        "what the tasks are about: 'bundled' (the Wikipedia summaries), a corpus file (.jsonl lines "
        "{id, title, text, url?}, or .json), an index (.sqlite) or an http(s):// search endpoint",
    )
    k: int = option(
        5, "results per search; each evidence document must come into the top k of an expert's search"
    )
    skip_unreachable: bool = option(
        False,
        "skip, with a warning, a task the expert cannot solve (evidence out of reach, answer in no evidence) instead of failing",
    )

    def __post_init__(self) -> None:
        from pivot_envs.domains.search.engine import MAX_K

        between(self, "k", 1, MAX_K)


@dataclass
class SearchQueryConfig:
    """What `pivotrl search query` searches and how many hits it shows."""

    corpus: str = option(
        "bundled", "'bundled', a corpus file (.jsonl, .json), an index (.sqlite) or an http(s):// endpoint"
    )
    k: int = option(5, "how many hits to show")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(
        dest="search_action", metavar="ACTION", required=True, parser_class=command_parser
    )
    build = actions.add_parser("build", help="a task file -> expert trajectories -> pivots")
    build.add_argument(
        "--tasks",
        required=True,
        metavar="FILE",
        help="task file (JSONL: id, question, answer, aliases?, evidence)",
    )
    build.add_argument("--out", required=True, metavar="PIVOTS", help="where to write the pivots (.jsonl)")
    add_config(build, SearchBuildConfig, "build")
    sample = actions.add_parser(
        "build-sample", help=f"rebuild the bundled pivots ({PIVOTS_FILE.name}) from the bundled tasks"
    )
    sample.add_argument(
        "--check", action="store_true", help="build in memory and fail when the shipped file differs"
    )
    query = actions.add_parser("query", help="the top hits for a query (to find evidence titles for a task)")
    query.add_argument("text", metavar="TEXT", help="free-text query")
    add_config(query, SearchQueryConfig, "query")


def corpus_label(spec: str) -> str:
    """What a pivot records as its corpus: 'bundled', a URL as given, or a file's absolute path
    (so the env opens the same corpus from any working directory)."""
    if spec == "bundled" or spec.startswith(("http://", "https://")):
        return spec
    return str(Path(spec).resolve())


def sample_bytes() -> bytes:
    """The bundled pivots' JSONL, built now from the bundled tasks on the bundled corpus."""
    from pivot_envs.domains.search.engine import open_engine
    from pivot_envs.domains.search.expert import build_pivots
    from pivot_envs.domains.search.tasks import read_tasks
    from pivot_envs.pivot import write_pivots

    pivots = build_pivots(read_tasks(), open_engine("bundled"), k=BUNDLED_K)
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "pivots.jsonl"
        write_pivots(pivots, path)
        return path.read_bytes()


def first_difference(shipped: bytes, built: bytes) -> str:
    """Where two pivot files first differ, in words ("" when they are equal)."""
    old, new = shipped.decode().splitlines(), built.decode().splitlines()
    for number, (a, b) in enumerate(zip(old, new), start=1):
        if a != b:
            return f"line {number} (pivot {json.loads(b)['id']}) differs"
    return "" if len(old) == len(new) else f"{len(old)} pivots shipped, {len(new)} built"


def check_sample(path: Path = PIVOTS_FILE) -> None:
    """Raise StaleSampleError unless `path` holds exactly the pivots build-sample makes now."""
    if not path.is_file():
        raise StaleSampleError(f"{path}: no such file (run: pivotrl search build-sample)")
    difference = first_difference(gzip.decompress(path.read_bytes()), sample_bytes())
    if difference:
        raise StaleSampleError(f"{path} is stale: {difference} (run: pivotrl search build-sample)")


def write_sample(path: Path = PIVOTS_FILE) -> int:
    """Write the bundled pivots to `path` (gzip with mtime 0: the same pivots give the same bytes); returns their count."""
    data = sample_bytes()
    with gzip.GzipFile(path, "wb", compresslevel=9, mtime=0) as handle:
        handle.write(data)
    return data.count(b"\n")


def _build(args: argparse.Namespace) -> int:
    from pivot_envs.cli._checks import check_output, file_errors
    from pivot_envs.domains.search.engine import open_engine
    from pivot_envs.domains.search.expert import BuildReport, build_pivots
    from pivot_envs.domains.search.tasks import read_tasks
    from pivot_envs.pivot import write_pivots

    config: SearchBuildConfig = args.build
    check_output(args.out, "--out")
    with file_errors(args.tasks, "--tasks"):
        tasks = read_tasks(args.tasks)
    report = BuildReport()
    engine = open_engine(config.corpus)
    pivots = build_pivots(
        tasks,
        engine,
        corpus=corpus_label(config.corpus),
        k=config.k,
        skip_unreachable=config.skip_unreachable,
        report=report,
    )
    with file_errors(args.out, "--out"):
        write_pivots(pivots, args.out)
    print(f"{report.summary()} -> {args.out}")
    return 0


def _query(args: argparse.Namespace) -> int:
    from pivot_envs.domains.search.engine import open_engine

    config: SearchQueryConfig = args.query
    hits = open_engine(config.corpus).search(args.text, k=config.k)
    for rank, hit in enumerate(hits, start=1):
        print(f"{rank}. {hit.title}  [{hit.docid}]  {hit.score:.3f}\n   {hit.snippet}")
    if not hits:
        print("no document holds any word of the query")
    return 0


def main(args: argparse.Namespace) -> int:
    if args.search_action == "build":
        return _build(args)
    if args.search_action == "query":
        return _query(args)
    if args.check:
        check_sample()
        print(f"{PIVOTS_FILE} is up to date")
        return 0
    count = write_sample()
    print(f"{count} pivots -> {PIVOTS_FILE}")
    return 0

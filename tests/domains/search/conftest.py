"""Fixtures of the search domain's env, verifier and integration tests.

The pivots here come from expert trajectories written in this file (searches and get_document
calls run through the domain's own `run_call` on the bundled engine), so these tests stand apart
from the bundled pivot file.
"""

from __future__ import annotations

import pytest

import pivot_envs  # noqa: F401  (registers pivot/search-v0)
from pivot_envs.chat import assistant_message, tool_call
from pivot_envs.domains.search.engine import SearchEngine, open_engine
from pivot_envs.domains.search.tools import BrowseState, bundled_tools, run_call
from pivot_envs.extract import ExtractConfig, extract_pivots
from pivot_envs.pivot import Pivot
from pivot_envs.trajectory import Trajectory

K = 5
VERDI = {
    "id": "verdi",
    "question": "The composer of the opera La traviata was born near which small town?",
    "answer": "Busseto",
    "aliases": ["Busseto, Italy"],
    "evidence": ["La_traviata", "Giuseppe_Verdi"],
}
# The expert's browsing steps before its answer: pivots verdi/t0 .. verdi/t4 (t4 answers).
VERDI_STEPS = [
    ("search", {"query": "La traviata opera composer"}),
    ("get_document", {"docid": "La_traviata"}),
    ("search", {"query": "Giuseppe Verdi"}),
    ("get_document", {"docid": "Giuseppe_Verdi"}),
]
CURIE = {
    "id": "curie",
    "question": "In which city was the physicist who shared the 1903 Nobel Prize with Pierre Curie born?",
    "answer": "Warsaw",
    "evidence": ["Marie Curie"],  # a title: the env resolves it to a docid
}
CURIE_STEPS = [
    ("search", {"query": "Pierre Curie 1903 Nobel Prize shared"}),
    ("get_document", {"docid": "Marie_Curie"}),
]


def expert_trajectory(engine: SearchEngine, task: dict, steps: list[tuple[str, dict]]) -> Trajectory:
    """The trajectory of an expert that makes `steps` (each call run on `engine`) and then answers."""
    messages = [
        {"role": "system", "content": "You are a search agent."},
        {"role": "user", "content": task["question"]},
    ]
    state = BrowseState()
    for turn, (name, arguments) in enumerate(steps):
        result = run_call(engine, name, arguments, state, k=K)
        assert result.error is None, result.text
        messages.append(assistant_message(None, [tool_call(name, arguments, f"call_{turn}")]))
        messages.append(
            {"role": "tool", "tool_call_id": f"call_{turn}", "name": name, "content": result.text}
        )
    messages.append(assistant_message(f"Answer: {task['answer']}"))
    context = {"corpus": "bundled", "corpus_id": engine.corpus_id, "k": K, "task": task}
    return Trajectory(task["id"], messages, bundled_tools(), 1.0, context, "test")


@pytest.fixture(scope="session")
def engine() -> SearchEngine:
    return open_engine("bundled")


@pytest.fixture(scope="session")
def search_pivots(engine) -> list[Pivot]:
    trajectories = [
        expert_trajectory(engine, VERDI, VERDI_STEPS),
        expert_trajectory(engine, CURIE, CURIE_STEPS),
    ]
    return list(extract_pivots(trajectories, ExtractConfig(domain="search")))


@pytest.fixture
def by_id(search_pivots) -> dict[str, Pivot]:
    return {pivot.id: pivot for pivot in search_pivots}

"""The search domain's red team (issue 35): no attack family scores above its floor, on either engine,
and none can make a step invalid. Runs on every fourth bundled task's pivots (the 1 MB actions on a
few of them); `benchmarks/redteam.py` runs every family on every pivot."""

from __future__ import annotations

from contextlib import closing

import attacks_search
import pytest
from attacks_search import BACKENDS, FAMILIES, make_env
from redteam_common import assert_floors_documented, assert_held, open_env, run_family

# The 1 MB actions cost a parse of 1 MB each: a few pivots show what every pivot would.
HEAVY = {"a_one_megabyte_query", "a_one_megabyte_answer"}


@pytest.fixture(scope="module", params=BACKENDS)
def env(request):
    with closing(open_env(request, make_env)) as made:
        yield made


def sample(env, family: str) -> list:
    tasks = sorted({pivot.id.split("/")[0] for pivot in env.pivots})[::4]
    pivots = [pivot for pivot in env.pivots if pivot.id.split("/")[0] in tasks]
    return pivots[::8] if family in HEAVY else pivots


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_no_family_scores_above_its_floor_and_none_makes_a_step_invalid(env, name):
    family = FAMILIES[name]
    assert_held(run_family(env, family, sample(env, name)), name, family)


def test_every_family_with_a_floor_says_what_it_is_and_where_it_is_documented():
    assert_floors_documented(FAMILIES, attacks_search.DOCS)

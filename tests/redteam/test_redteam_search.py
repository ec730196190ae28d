"""The search domain's red team (issue 35): no attack family scores above its floor, on either engine,
and none can make a step invalid. Runs on every fourth bundled task's pivots (the 1 MB actions on a
few of them); `benchmarks/redteam.py` runs every family on every pivot."""

from __future__ import annotations

import attacks_search
import pytest
from attacks_search import BACKENDS, FAMILIES, make_env
from redteam_common import run_family

# The 1 MB actions cost a parse of 1 MB each: a few pivots show what every pivot would.
HEAVY = {"a_one_megabyte_query", "a_one_megabyte_answer"}


@pytest.fixture(scope="module", params=BACKENDS)
def env(request):
    made = make_env(request.param)
    yield made
    made.close()


def sample(env, family: str) -> list:
    tasks = sorted({pivot.id.split("/")[0] for pivot in env.pivots})[::4]
    pivots = [pivot for pivot in env.pivots if pivot.id.split("/")[0] in tasks]
    return pivots[::8] if family in HEAVY else pivots


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_no_family_scores_above_its_floor_and_none_makes_a_step_invalid(env, name):
    family = FAMILIES[name]
    tally = run_family(env, family, sample(env, name))
    assert tally.applicable > 0, f"{name} applies at none of the sampled pivots"
    assert tally.invalid == 0, f"{name} made {tally.invalid} steps invalid"
    assert tally.share <= family.floor, (
        f"{name} scored at {tally.scored} of {tally.applicable} pivots (floor {family.floor}), e.g. {tally.examples}"
    )


def test_every_family_with_a_floor_says_what_it_is_and_where_it_is_documented():
    for name, family in FAMILIES.items():
        if family.floor > 0:
            assert attacks_search.DOCS in family.why_floor, name

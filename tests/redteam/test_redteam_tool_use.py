"""The tool-use domain's red team (issue 35, R8 and the call rules): no attack family scores above its
floor on either backend (the airline tools, recorded outputs), and none can make a step invalid. Runs
on every bundled pivot (about 10 s per backend); `benchmarks/redteam.py` runs the same."""

from __future__ import annotations

import attacks_tool_use
import pytest
from attacks_tool_use import BACKENDS, FAMILIES, ONLY_ON, make_env
from redteam_common import run_family


@pytest.fixture(scope="module", params=BACKENDS)
def env(request):
    made = make_env(request.param)
    yield made
    made.close()


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_no_family_scores_above_its_floor_and_none_makes_a_step_invalid(env, name):
    family = FAMILIES[name]
    tally = run_family(env, family, env.pivots)
    if ONLY_ON.get(name, env.backend_choice) != env.backend_choice:
        assert tally.applicable == 0, f"{name} applies only on the {ONLY_ON[name]} backend"
        return
    assert tally.applicable > 0, f"{name} applies at none of the bundled pivots"
    assert tally.invalid == 0, f"{name} made {tally.invalid} steps invalid"
    assert tally.share <= family.floor, (
        f"{name} scored at {tally.scored} of {tally.applicable} pivots (floor {family.floor}), e.g. {tally.examples}"
    )


def test_every_family_with_a_floor_says_what_it_is_and_where_it_is_documented():
    for name, family in FAMILIES.items():
        if family.floor > 0:
            assert attacks_tool_use.DOCS in family.why_floor, name

"""What every red-team attack module shares (issue 35: a reward is worth the cheapest way to earn it).

An attack module `attacks_<domain>.py` beside this file declares:

    DOMAIN = "terminal"                  # the env id is pivot/<DOMAIN>-v0
    BACKENDS = ("bwrap", "docker")       # sandbox kinds to attack on; (None,) for an unsandboxed domain
    def make_env(backend): ...           # a PivotEnv (unwrapped is fine) on the bundled pivots
    FAMILIES = {"name": Family(...), ...}

A family turns a pivot into one hostile action (raw text or an assistant message dict), or None
where it does not apply. The domain's tests (`test_redteam_<domain>.py`) run each family on a sample of
pivots and assert its scoring share stays at or under the family's `floor`;
`benchmarks/redteam.py` runs every family on every bundled pivot and prints the table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

Action = "str | dict[str, Any]"


@dataclass(frozen=True)
class Family:
    """One exploit family: how to build the attack at a pivot, and the share it may still score."""

    description: str
    attack: Callable[[Any, Any], Any]  # (env, pivot) -> action, or None where it does not apply
    floor: float = 0.0  # the documented share that may score (a rule's floor), 0 for an exploit
    why_floor: str = ""  # what the floor is and where the docs say so (required when floor > 0)
    generic: bool = False  # a generic or degenerate action (empty, repeated, echoed, stuffed)


@dataclass
class Tally:
    """How one family fared over a set of pivots."""

    applicable: int = 0
    scored: int = 0  # reward > 0 on a valid step
    invalid: int = 0  # valid=False: the infrastructure failed, which an attack must not be able to cause
    examples: list[str] | None = None  # ids of the pivots where it scored (first few)

    @property
    def share(self) -> float:
        return self.scored / self.applicable if self.applicable else 0.0


def run_family(env: Any, family: Family, pivots: Iterable[Any], keep: int = 5) -> Tally:
    """Reset `env` to each pivot, step the family's attack, and count where it scores or is invalid."""
    tally = Tally(examples=[])
    base = getattr(env, "unwrapped", env)
    for pivot in pivots:
        base.reset(options={"pivot": pivot.id})
        action = family.attack(base, pivot)
        if action is None:
            continue
        tally.applicable += 1
        _, reward, _, _, info = base.step(action)
        if not info.get("valid", True):
            tally.invalid += 1
        elif reward > 0:
            tally.scored += 1
            if len(tally.examples) < keep:
                tally.examples.append(pivot.id)
    return tally


def open_env(request: Any, make_env: Callable[[str], Any], sandboxed: bool = False) -> Any:
    """The env of the backend `request.param`, for a module fixture parametrised by a module's BACKENDS;
    on a sandbox backend it first asks for the fixture that skips (or, under CI, fails) where it is missing."""
    if sandboxed:
        request.getfixturevalue("has_bwrap" if request.param == "bwrap" else "has_docker")
    return make_env(request.param)


def assert_held(tally: Tally, name: str, family: Family, applicable: bool = True) -> None:
    """The family scored at most its floor and made no step invalid (and applied somewhere, if asked)."""
    assert not applicable or tally.applicable > 0, f"{name} applies at none of the pivots tried"
    assert tally.invalid == 0, f"{name} made {tally.invalid} step(s) invalid"
    assert tally.share <= family.floor, (
        f"{name} scored at {tally.scored} of {tally.applicable} pivots (floor {family.floor}), "
        f"e.g. {tally.examples}"
    )


def assert_floors_documented(families: dict[str, Family], docs: str) -> None:
    """Every family with a floor says what the floor is and names the docs page that says so."""
    for name, family in families.items():
        if family.floor > 0:
            assert docs in family.why_floor, name

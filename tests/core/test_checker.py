"""check_pivot_env catches each broken contract, names the check and the pivot, and passes sound envs."""

from __future__ import annotations

import datetime
import random
import subprocess
import sys
from dataclasses import dataclass

import gymnasium as gym
import pytest

import pivot_envs
from pivot_envs import InfrastructureError, Outcome, Pivot, PivotEnv, check_pivot_env
from pivot_envs.chat import tool_call
from pivot_envs.checker import CHECKS, PivotEnvCheckError, PivotEnvReport
from pivot_envs.errors import PivotEnvsError, UnknownNameError
from pivot_envs.verifiers import Verdict

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
PIVOTS = [
    Pivot(
        id="weather/t0",
        domain="generic",
        tools=TOOLS,
        messages=[
            {"role": "system", "content": "Answer with the tools."},
            {"role": "user", "content": "Weather in Oslo?"},
        ],
        expert={
            "role": "assistant",
            "content": None,
            "tool_calls": [tool_call("lookup", {"city": "Oslo"}, "call_0")],
        },
    ),
    Pivot(
        id="weather/t1",
        domain="generic",
        tools=TOOLS,
        messages=[
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [tool_call("lookup", {"city": "Oslo"}, "call_0")],
            },
            {"role": "tool", "tool_call_id": "call_0", "content": "rain, 4 C"},
        ],
        expert={"role": "assistant", "content": "Rain and 4 degrees."},
    ),
    Pivot(
        id="sum/t0",
        domain="generic",
        messages=[{"role": "user", "content": "What is 2 + 2?"}],
        expert={"role": "assistant", "content": "4"},
    ),
]


class WeatherEnv(PivotEnv):
    """A sound env: strict verifier, a lookup tool on a backend that can go offline (infrastructure)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(pivots=PIVOTS, **kwargs)
        self.online = True

    def restore(self, pivot: Pivot) -> None:
        self.online = True

    def execute(self, pivot: Pivot, action: dict) -> Outcome:
        if not action.get("tool_calls"):
            return Outcome()
        if not self.online:
            raise InfrastructureError(f"pivot {pivot.id}: the weather backend is offline")
        return Outcome(
            messages=[{"role": "tool", "tool_call_id": "call_0", "content": "rain, 4 C"}], output="rain, 4 C"
        )


def take_offline(env: PivotEnv) -> bool | None:
    if not env.pivot.expert.get("tool_calls"):
        return False  # a message turn runs nothing that could fail
    env.online = False
    return None


def check(env: PivotEnv, **kwargs: object) -> PivotEnvReport:
    return check_pivot_env(
        env, **{"pivots": 3, "break_infrastructure": take_offline, "raise_on_failure": False, **kwargs}
    )


def failed_checks(report: PivotEnvReport) -> set[str]:
    return {failure.check for failure in report.failures}


# -- sound envs pass ------------------------------------------------------------------------------


def test_a_sound_env_passes_every_check() -> None:
    report = check(WeatherEnv())
    assert report.ok, report
    assert set(report.passed) == set(CHECKS) and report.pivots == [p.id for p in PIVOTS]
    assert not report.skipped


def test_the_bundled_tool_use_env_passes_in_seconds() -> None:
    env = gym.make("pivot/tool-use-v0")
    report = check_pivot_env(env, pivots=5, raise_on_failure=False)
    assert report.ok, report
    assert report.seconds < 10, report  # 0.3 s measured on a 2-core box


# -- each broken contract is caught, naming the check and the pivot ------------------------------------


class SeedIgnoringEnv(WeatherEnv):
    def reset(self, *, seed=None, options=None):
        return super().reset(options=options or {"index": random.randrange(len(self.pivots))})


def test_an_env_that_ignores_the_seed_fails_check_env_and_seed_determinism() -> None:
    report = check(SeedIgnoringEnv())
    assert {"gymnasium_check_env", "seed_determinism"} <= failed_checks(report)
    assert "reset(seed=0)" in str(report.failed("seed_determinism")[0])


class TruncatedPrefixEnv(WeatherEnv):
    """Restores only the last message of the prefix."""

    def reset(self, *, seed=None, options=None):
        observation, info = super().reset(seed=seed, options=options)
        return {**observation, "messages": observation["messages"][-1:]}, info


def test_an_env_whose_reset_drops_part_of_the_prefix_fails_reset_restores_prefix_at_that_pivot() -> None:
    report = check(TruncatedPrefixEnv())
    failures = report.failed("reset_restores_prefix")
    assert [f.pivot for f in failures] == [
        "weather/t0",
        "weather/t1",
    ]  # sum/t0 has one message: nothing dropped
    assert "item 0" in failures[0].detail and "system" in failures[0].detail


@dataclass(frozen=True)
class ConstantVerifier:
    """Gives every action the same verdict."""

    name: str
    verdict: Verdict

    def verify(self, pivot: Pivot, action: dict, outcome: object = None) -> Verdict:
        return self.verdict


NEVER_RIGHT = ConstantVerifier("never", Verdict(0.0, "never_right"))
ALWAYS_RIGHT = ConstantVerifier("always", Verdict(1.0, "fine"))


def test_an_env_whose_expert_scores_zero_fails_expert_scores_one() -> None:
    report = check(WeatherEnv(verifier=NEVER_RIGHT))
    assert {f.pivot for f in report.failed("expert_scores_one")} == {p.id for p in PIVOTS}
    assert "scored 0.0" in report.failed("expert_scores_one")[0].detail and "never_right" in str(report)
    assert "junk_scores_zero" in report.passed


def test_an_env_that_rewards_junk_fails_junk_scores_zero_naming_the_action() -> None:
    report = check(WeatherEnv(verifier=ALWAYS_RIGHT))
    detail = report.failed("junk_scores_zero")[0].detail
    assert (
        "empty text '' scored 1.0" in detail
        and "; random text" in detail
        and "a call to a tool that does not exist" in detail
    )
    assert "expert_scores_one" in report.passed


class RaisesOnEmptyTextEnv(WeatherEnv):
    def step(self, action):
        if action == "":
            raise ValueError("empty completion")
        return super().step(action)


def test_an_env_that_raises_on_junk_fails_step_never_raises() -> None:
    report = check(RaisesOnEmptyTextEnv())
    failure = report.failed("step_never_raises")[0]
    assert (
        failure.detail == "step(empty text) raised ValueError: empty completion"
        and failure.pivot == "weather/t0"
    )
    assert report.unchecked == ["junk_scores_zero"] and "junk_scores_zero" not in report.passed
    assert "gymnasium_check_env" in report.passed and "expert_scores_one" in report.passed


class NotJSONInfoEnv(WeatherEnv):
    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        return observation, reward, terminated, truncated, {**info, "when": datetime.date(2026, 1, 1)}


def test_an_env_with_non_json_info_fails_json_encodable() -> None:
    report = check(NotJSONInfoEnv())
    assert failed_checks(report) == {"json_encodable"}
    assert (
        "the info of step(" in report.failures[0].detail
        and "date is not JSON serializable" in report.failures[0].detail
    )


class EndlessEpisodeEnv(WeatherEnv):
    def step(self, action):
        observation, reward, _, truncated, info = super().step(action)
        return observation, reward, False, truncated, info


def test_an_env_whose_step_does_not_end_the_episode_fails_step_result() -> None:
    report = check(EndlessEpisodeEnv(), skip_check_env=True)
    assert "terminated=False" in report.failed("step_result")[0].detail
    assert failed_checks(report) == {"step_result"} and "expert_scores_one" in report.unchecked
    assert report.skipped["gymnasium_check_env"] == "skip_check_env=True"


class CachedObservationEnv(WeatherEnv):
    """Hands out the same observation object at every reset of a pivot."""

    def reset(self, *, seed=None, options=None):
        observation, info = super().reset(seed=seed, options=options)
        self._cache = getattr(self, "_cache", {})
        return self._cache.setdefault(info["pivot_id"], observation), info


def test_an_env_that_returns_a_cached_observation_fails_fresh_observations() -> None:
    report = check(CachedObservationEnv())
    assert "fresh_observations" in failed_checks(report)
    assert "changed the next reset's" in report.failed("fresh_observations")[0].detail


class PrefixlessStepEnv(WeatherEnv):
    """Returns only what the step added, not the prefix before it."""

    def step(self, action):
        observation, *rest = super().step(action)
        return {**observation, "messages": observation["messages"][len(self.pivot.messages) :]}, *rest


def test_an_env_whose_step_observation_drops_the_prefix_fails_step_observation_extends_prefix() -> None:
    report = check(PrefixlessStepEnv())
    assert failed_checks(report) == {"step_observation_extends_prefix"}


class MoodyVerifier:
    """Zero for anything but the expert, under a category that changes from call to call."""

    name = "moody"

    def __init__(self) -> None:
        self.calls = 0

    def verify(self, pivot: Pivot, action: dict, outcome: object = None) -> Verdict:
        self.calls += 1
        if action.get("content") == pivot.expert.get("content") and action.get(
            "tool_calls"
        ) == pivot.expert.get("tool_calls"):
            return Verdict(1.0, "exact_match")
        return Verdict(0.0, f"wrong_{self.calls}")


def test_an_env_whose_verdict_changes_under_the_same_seed_fails_seed_determinism() -> None:
    report = check(WeatherEnv(verifier=MoodyVerifier()))
    assert failed_checks(report) == {"gymnasium_check_env", "seed_determinism"}  # check_env steps twice too
    assert "random text under reset(seed=0)" in report.failed("seed_determinism")[0].detail


class SwallowsFailuresEnv(WeatherEnv):
    """Answers a dead backend with an error text the verifier scores, as if the action were wrong."""

    def execute(self, pivot: Pivot, action: dict) -> Outcome:
        try:
            return super().execute(pivot, action)
        except InfrastructureError as error:
            return Outcome(output=str(error))


class StaysOfflineEnv(WeatherEnv):
    def restore(self, pivot: Pivot) -> None:
        pass  # never brings the backend back


def test_an_infrastructure_failure_scored_as_valid_fails_infrastructure_failure_invalid() -> None:
    report = check(SwallowsFailuresEnv())
    assert failed_checks(report) == {"infrastructure_failure_invalid"}
    assert report.failures[0].pivot == "weather/t0" and "valid True" in report.failures[0].detail


def test_an_env_that_does_not_recover_at_the_next_reset_fails_infrastructure_failure_invalid() -> None:
    report = check(StaysOfflineEnv())
    assert "the next reset did not recover" in report.failed("infrastructure_failure_invalid")[0].detail


def test_without_a_break_infrastructure_hook_the_check_is_skipped_and_says_so() -> None:
    report = check(SwallowsFailuresEnv(), break_infrastructure=None)
    assert report.ok and "infrastructure_failure_invalid" not in report.ran
    assert "no break_infrastructure hook" in report.skipped["infrastructure_failure_invalid"]
    assert "skipped infrastructure_failure_invalid" in str(report)


def test_a_hook_that_can_break_no_pivot_checked_is_reported_as_skipped() -> None:
    report = check(SwallowsFailuresEnv(), pivots=["weather/t1", "sum/t0"])
    assert report.ok and "returned False at every pivot" in report.skipped["infrastructure_failure_invalid"]


# -- how it reports --------------------------------------------------------------------------------


def test_a_failure_raises_an_assertion_error_holding_the_report() -> None:
    with pytest.raises(PivotEnvCheckError) as caught:
        check_pivot_env(WeatherEnv(verifier=NEVER_RIGHT), pivots=1)
    assert isinstance(caught.value, AssertionError) and isinstance(caught.value, PivotEnvsError)
    assert caught.value.report.failed("expert_scores_one")
    assert "FAILED expert_scores_one at pivot weather/t0: the expert's action scored 0.0" in str(caught.value)


def test_pivots_may_be_named_and_an_unknown_id_gets_a_did_you_mean() -> None:
    assert check(WeatherEnv(), pivots=["sum/t0", "weather/t1"]).pivots == ["sum/t0", "weather/t1"]
    assert check(WeatherEnv(), pivots="sum/t0").pivots == ["sum/t0"]
    assert check(WeatherEnv(), pivots=10).pivots == [p.id for p in PIVOTS]  # no more than there are
    with pytest.raises(UnknownNameError, match="did you mean 'sum/t0'"):
        check_pivot_env(WeatherEnv(), pivots=["sum/t1"])


def test_a_wrapped_env_is_checked_through_its_unwrapped_pivot_env() -> None:
    report = check_pivot_env(gym.wrappers.PassiveEnvChecker(WeatherEnv()), pivots=1, raise_on_failure=False)
    assert report.ok and report.env == "WeatherEnv"
    with pytest.raises(TypeError, match="needs a PivotEnv"):
        check_pivot_env(gym.make("CartPole-v1"))


def test_importing_pivot_envs_does_not_import_the_checker() -> None:
    code = "import sys, pivot_envs; print('pivot_envs.checker' in sys.modules); pivot_envs.check_pivot_env; print('pivot_envs.checker' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["False", "True"], result.stderr
    assert "check_pivot_env" in pivot_envs.__all__

"""check_pivot_env: gymnasium's check_env plus the pivot contract, for domain authors.

    import gymnasium as gym
    import pivot_envs
    from pivot_envs import check_pivot_env

    report = check_pivot_env(gym.make("pivot/my-domain-v0"), pivots=3)

It runs gymnasium's `check_env`, then at each of a few pivots: reset restores the prefix, the
expert's action scores 1, junk actions score 0 (valid, with a category), step never raises, every
info and observation is JSON, observations are fresh, the same seed gives the same pivot and the
same verdict, and (given a `break_infrastructure` hook) a failed infrastructure makes the step
invalid. Each failure names its check and its pivot (see CHECKS).
"""

from __future__ import annotations

import copy
import json
import reprlib
import string
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from pivot_envs.env import PivotEnv
from pivot_envs.errors import PivotEnvsError, UnknownNameError
from pivot_envs.pivot import Pivot

CHECKS: dict[str, str] = {
    "gymnasium_check_env": "gymnasium.utils.env_checker.check_env passes",
    "reset_restores_prefix": "reset(options={'pivot': id}) returns the pivot's messages and tools; info names the pivot",
    "step_observation_extends_prefix": "the step's observation is the pivot's messages followed by the action (and its results)",
    "expert_scores_one": "the expert's action scores 1 and is valid",
    "junk_scores_zero": "empty text, random text, a call to a tool that does not exist, None and a malformed "
    "message each score 0, valid, with a category that is not env_error",
    "step_never_raises": "step returns for every action tried",
    "step_result": "step returns (observation, a float reward, terminated=True, truncated=False, info with "
    "'category' and 'valid')",
    "json_encodable": "every observation and info json.dumps, and encodes as UTF-8",
    "fresh_observations": "editing a returned observation or info changes nothing the env keeps",
    "seed_determinism": "reset with the same seed picks the same pivots, and the same action gets the same verdict",
    "infrastructure_failure_invalid": "a step whose infrastructure failed (break_infrastructure) is valid=False "
    "and scores 0, and the next reset recovers",
}

BreakInfrastructure = Callable[[PivotEnv], "bool | None"]

_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 120
_NO_SUCH_TOOL = "no_such_tool_pivot_envs_check"


@dataclass(frozen=True)
class CheckFailure:
    """One broken contract: the check (a key of CHECKS), the pivot id (None: not a pivot's) and what was wrong."""

    check: str
    pivot: str | None
    detail: str

    def __str__(self) -> str:
        where = f" at pivot {self.pivot}" if self.pivot is not None else ""
        return f"{self.check}{where}: {self.detail}"


@dataclass
class PivotEnvReport:
    """What check_pivot_env found: the checks run, their failures, the checks skipped (with why),
    and those a broken step kept from being judged at some pivot (`unchecked`; the step's own
    failure is reported under step_never_raises or step_result)."""

    env: str
    pivots: list[str] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    failures: list[CheckFailure] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    unchecked: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def passed(self) -> list[str]:
        """The checks that ran and never failed."""
        failed = {failure.check for failure in self.failures} | set(self.unchecked)
        return [check for check in self.ran if check not in failed]

    def failed(self, check: str) -> list[CheckFailure]:
        """The failures of one check."""
        return [failure for failure in self.failures if failure.check == check]

    def __str__(self) -> str:
        verdict = "passed" if self.ok else f"{len(self.failures)} failure(s)"
        lines = [
            f"check_pivot_env({self.env}, pivots {', '.join(self.pivots)}): {verdict} in {self.seconds:.1f} s"
        ]
        lines += [f"  FAILED {failure}" for failure in self.failures]
        lines += [f"  skipped {check}: {why}" for check, why in self.skipped.items()]
        if self.unchecked:
            lines.append(f"  not judged at every pivot (a step broke first): {', '.join(self.unchecked)}")
        lines.append(f"  passed: {', '.join(self.passed) or 'none'}")
        return "\n".join(lines)


class PivotEnvCheckError(PivotEnvsError, AssertionError):
    """check_pivot_env found broken contracts; `.report` holds them all."""

    def __init__(self, report: PivotEnvReport) -> None:
        self.report = report
        super().__init__(str(report))


def check_pivot_env(
    env: gym.Env,
    pivots: int | str | Sequence[str] = 3,
    *,
    seed: int = 0,
    break_infrastructure: BreakInfrastructure | None = None,
    skip_check_env: bool = False,
    raise_on_failure: bool = True,
) -> PivotEnvReport:
    """Check that `env` (a PivotEnv, or gym.make's wrapper of one) keeps the pivot contract.

    pivots:                how many pivots to check (spread evenly over env.pivots), or their id(s).
    seed:                  the seed of the determinism check and of the random junk text.
    break_infrastructure:  called with the PivotEnv after a reset, it makes the next step's
                           infrastructure fail (close the sandbox, point the tool backend at a
                           dead server); the next reset must repair it. It may return False when
                           it cannot break that pivot's step (that pivot is left out of the check).
                           Without it the check is skipped, and the report says so.
    skip_check_env:        leave out gymnasium's check_env (when the caller already ran it).
    raise_on_failure:      raise PivotEnvCheckError (holding the report) if any check failed.

    Returns the PivotEnvReport. Each step runs on the unwrapped env, which is left reset at the
    last pivot checked; the caller closes it.
    """
    base = env.unwrapped
    if not isinstance(base, PivotEnv):
        raise TypeError(f"check_pivot_env needs a PivotEnv (or a wrapper of one), got {type(base).__name__}")
    started = time.perf_counter()
    report = PivotEnvReport(env=type(base).__name__)
    chosen = _chosen_pivots(base, pivots)
    report.pivots = [pivot.id for pivot in chosen]
    checker = _Checker(base, report, seed)
    if skip_check_env:
        report.skipped["gymnasium_check_env"] = "skip_check_env=True"
    else:
        checker.run("gymnasium_check_env", None, checker.check_env)
    checker.run("seed_determinism", None, checker.seeded_resets_pick_the_same_pivots)
    for pivot in chosen:
        checker.check_pivot(pivot)
    if break_infrastructure is None:
        report.skipped["infrastructure_failure_invalid"] = (
            "no break_infrastructure hook given (a callable(env) that makes the next step's infrastructure fail)"
        )
    else:
        for pivot in chosen:
            checker.run(
                "infrastructure_failure_invalid",
                pivot.id,
                lambda pivot=pivot: checker.broken_infrastructure_is_invalid(pivot, break_infrastructure),
            )
        if checker.unbreakable == len(chosen):
            report.ran.remove("infrastructure_failure_invalid")
            report.skipped["infrastructure_failure_invalid"] = (
                "break_infrastructure returned False at every pivot"
            )
    report.seconds = time.perf_counter() - started
    if raise_on_failure and not report.ok:
        raise PivotEnvCheckError(report)
    return report


def _chosen_pivots(env: PivotEnv, pivots: int | str | Sequence[str]) -> list[Pivot]:
    if isinstance(pivots, int):
        if pivots < 1:
            raise ValueError(f"check_pivot_env: pivots must be at least 1, got {pivots}")
        count = min(pivots, len(env.pivots))
        return [env.pivots[i] for i in sorted({round(x) for x in np.linspace(0, len(env.pivots) - 1, count)})]
    if isinstance(pivots, str):
        pivots = [pivots]
    by_id = {pivot.id: pivot for pivot in env.pivots}
    for pivot_id in pivots:
        if pivot_id not in by_id:
            raise UnknownNameError("pivot", pivot_id, by_id)
    return [by_id[pivot_id] for pivot_id in pivots]


def junk_actions(seed: int) -> dict[str, Any]:
    """Actions that must score 0 (valid) at any pivot, by label: no expert answers with them."""
    rng = np.random.default_rng(seed)
    letters = np.array(list(string.ascii_lowercase))
    words = " ".join("".join(rng.choice(letters, size=int(rng.integers(4, 10)))) for _ in range(8))
    call = {"id": "call_check", "type": "function", "function": {"name": _NO_SUCH_TOOL, "arguments": "{}"}}
    return {
        "empty text": "",
        "random text": words,
        "a call to a tool that does not exist": {"role": "assistant", "content": None, "tool_calls": [call]},
        "None": None,
        "a malformed message": {"role": "assistant", "content": 3},
    }


class _Failed(Exception):
    """A check found its contract broken (the message says how)."""


class _StepRaised(Exception):
    """env.step raised (reported under step_never_raises)."""


class _StepUnusable(Exception):
    """env.step returned something a check cannot judge (reported under step_result)."""


class _Checker:
    def __init__(self, env: PivotEnv, report: PivotEnvReport, seed: int) -> None:
        self.env, self.report, self.seed = env, report, seed
        self.junk = junk_actions(seed)
        self.unbreakable = 0
        self.report.ran += ["step_never_raises", "step_result", "json_encodable"]

    # -- bookkeeping ---------------------------------------------------------------------------

    def fail(self, check: str, pivot: str | None, detail: str) -> None:
        """Record a failure, the first of each check at each pivot only (one bug, one line)."""
        if not any(f.check == check and f.pivot == pivot for f in self.report.failures):
            self.report.failures.append(CheckFailure(check, pivot, detail))

    def run(self, check: str, pivot: str | None, body: Callable[[], None]) -> None:
        if check not in self.report.ran:
            self.report.ran.append(check)
        try:
            body()
        except _Failed as failure:
            self.fail(check, pivot, str(failure))
        except _StepRaised as raised:
            self.fail("step_never_raises", pivot, str(raised))
            self.unjudged(check)
        except _StepUnusable:
            self.unjudged(check)
        except Exception as error:
            self.fail(check, pivot, f"raised {type(error).__name__}: {_brief(error)}")

    def unjudged(self, check: str) -> None:
        if check not in self.report.unchecked:
            self.report.unchecked.append(check)

    def reset(self, pivot: Pivot | None = None, seed: int | None = None) -> tuple[dict, dict]:
        options = {"pivot": pivot.id} if pivot is not None else None
        observation, info = self.env.reset(seed=seed, options=options)
        self.encodable(pivot, "reset", observation, info)
        return observation, info

    def step(self, pivot: Pivot, action: Any, label: str) -> tuple[dict, float, bool, bool, dict]:
        try:
            result = self.env.step(action)
        except Exception as error:
            raise _StepRaised(f"step({label}) raised {type(error).__name__}: {_brief(error)}") from error
        observation, reward, terminated, truncated, info = result
        self.encodable(pivot, f"step({label})", observation, info)
        problem = _step_result_problem(reward, terminated, truncated, info)
        if problem:
            self.fail("step_result", pivot.id, f"step({label}): {problem}")
            raise _StepUnusable()
        return result

    def encodable(self, pivot: Pivot | None, call: str, observation: Any, info: Any) -> None:
        for name, value in (("observation", observation), ("info", info)):
            try:
                json.dumps(value, ensure_ascii=False).encode("utf-8")
            except Exception as error:
                self.fail(
                    "json_encodable",
                    pivot.id if pivot else None,
                    f"the {name} of {call} is not JSON: {type(error).__name__}: {_brief(error)}",
                )

    # -- the checks --------------------------------------------------------------------------------

    def check_env(self) -> None:
        from gymnasium.utils.env_checker import check_env

        check_env(self.env, skip_render_check=True)

    def seeded_resets_pick_the_same_pivots(self) -> None:
        def picks() -> list[str]:
            first = self.reset(seed=self.seed)[1].get("pivot_id")
            return [first] + [self.reset()[1].get("pivot_id") for _ in range(3)]

        first, second = picks(), picks()
        if first != second:
            raise _Failed(f"reset(seed={self.seed}) and three more resets picked {first}, then {second}")

    def check_pivot(self, pivot: Pivot) -> None:
        expected = copy.deepcopy(pivot.observation)
        record = copy.deepcopy(pivot.to_dict())
        self.run("reset_restores_prefix", pivot.id, lambda: self.reset_restores_prefix(pivot, expected))
        self.run("expert_scores_one", pivot.id, lambda: self.expert_scores_one(pivot))
        self.run(
            "step_observation_extends_prefix", pivot.id, lambda: self.step_extends_prefix(pivot, expected)
        )
        self.run("junk_scores_zero", pivot.id, lambda: self.junk_scores_zero(pivot))
        self.run("fresh_observations", pivot.id, lambda: self.observations_are_fresh(pivot, expected, record))
        self.run("seed_determinism", pivot.id, lambda: self.same_seed_same_verdict(pivot))

    def reset_restores_prefix(self, pivot: Pivot, expected: dict) -> None:
        observation, info = self.reset(pivot)
        if not isinstance(observation, dict) or observation.get("messages") != expected["messages"]:
            difference = _difference(expected["messages"], _get(observation, "messages"))
            raise _Failed(f"the observation's messages are not the pivot's: {difference}")
        if observation.get("tools") != expected["tools"]:
            difference = _difference(expected["tools"], observation.get("tools"))
            raise _Failed(f"the observation's tools are not the pivot's: {difference}")
        if not isinstance(info, dict) or info.get("pivot_id") != pivot.id:
            raise _Failed(f"info['pivot_id'] is {_get(info, 'pivot_id')!r}")

    def expert_scores_one(self, pivot: Pivot) -> None:
        self.reset(pivot)
        _, reward, _, _, info = self.step(pivot, copy.deepcopy(pivot.expert), "the expert's action")
        if reward != 1.0 or info["valid"] is not True:
            raise _Failed(f"the expert's action scored {reward} (valid {info['valid']}, {_verdict(info)})")

    def step_extends_prefix(self, pivot: Pivot, expected: dict) -> None:
        self.reset(pivot)
        observation = self.step(pivot, self.junk["random text"], "random text")[0]
        messages, prefix = _get(observation, "messages"), expected["messages"]
        if (
            not isinstance(messages, list)
            or messages[: len(prefix)] != prefix
            or len(messages) <= len(prefix)
        ):
            raise _Failed(
                f"the step's observation is not the pivot's {len(prefix)} messages and the action: "
                f"{_difference(prefix, messages)}"
            )

    def junk_scores_zero(self, pivot: Pivot) -> None:
        problems = []
        for label, action in self.junk.items():
            self.reset(pivot)
            try:
                _, reward, _, _, info = self.step(pivot, copy.deepcopy(action), label)
            except _StepRaised as raised:  # the other junk actions are still tried
                self.fail("step_never_raises", pivot.id, str(raised))
                self.unjudged("junk_scores_zero")
                continue
            except _StepUnusable:
                self.unjudged("junk_scores_zero")
                continue
            category = info.get("category")
            named = isinstance(category, str) and category not in ("", "env_error")
            if reward != 0.0 or info["valid"] is not True or not named:
                problems.append(
                    f"{label} {_SHORT.repr(action)} scored {reward} (valid {info['valid']}, {_verdict(info)})"
                )
        if problems:
            raise _Failed("; ".join(problems))

    def observations_are_fresh(self, pivot: Pivot, expected: dict, record: dict) -> None:

        def edit_then_reset(call: str, observation: Any, info: Any) -> None:
            vandalise(observation)
            vandalise(info)
            again, _ = self.reset(pivot)
            if again != expected:
                raise _Failed(
                    f"editing {call}'s observation and info changed the next reset's: "
                    f"{_difference(expected, again)}"
                )

        edit_then_reset("reset", *self.reset(pivot))
        stepped, _, _, _, step_info = self.step(pivot, copy.deepcopy(pivot.expert), "the expert's action")
        edit_then_reset("step", stepped, step_info)
        if pivot.to_dict() != record:
            raise _Failed("editing the returned observations and infos changed the pivot in env.pivots")
        stepped, _, _, _, step_info = self.step(pivot, copy.deepcopy(pivot.expert), "the expert's action")
        if "injected" in json.dumps([stepped, step_info], default=str):
            raise _Failed("a step's observation or info holds what the caller wrote into an earlier one")

    def same_seed_same_verdict(self, pivot: Pivot) -> None:
        for label, action in (
            ("the expert's action", pivot.expert),
            ("random text", self.junk["random text"]),
        ):
            verdicts = []
            for _ in range(2):
                self.reset(pivot, seed=self.seed)
                _, reward, _, _, info = self.step(pivot, copy.deepcopy(action), label)
                verdicts.append((reward, info.get("category"), info["valid"], info.get("strict_reward")))
            if verdicts[0] != verdicts[1]:
                raise _Failed(
                    f"{label} under reset(seed={self.seed}) got (reward, category, valid, strict_reward) "
                    f"{verdicts[0]}, then {verdicts[1]}"
                )

    def broken_infrastructure_is_invalid(
        self, pivot: Pivot, break_infrastructure: BreakInfrastructure
    ) -> None:
        self.reset(pivot)
        try:
            broke = break_infrastructure(self.env)
        except Exception as error:
            raise _Failed(f"break_infrastructure raised {type(error).__name__}: {_brief(error)}") from error
        if broke is False:
            self.unbreakable += 1
            return
        expert = copy.deepcopy(pivot.expert)
        _, reward, _, _, info = self.step(pivot, expert, "the expert's action, infrastructure broken")
        if info["valid"] is not False or reward != 0.0:
            raise _Failed(
                f"with its infrastructure broken the expert's action scored {reward} "
                f"(valid {info['valid']}, {_verdict(info)}): an infrastructure failure must be valid=False"
            )
        self.reset(pivot)
        _, reward, _, _, info = self.step(
            pivot, copy.deepcopy(expert), "the expert's action, after the failure"
        )
        if reward != 1.0 or info["valid"] is not True:
            raise _Failed(
                f"the next reset did not recover: the expert's action then scored {reward} "
                f"(valid {info['valid']}, {_verdict(info)})"
            )


def _step_result_problem(reward: Any, terminated: Any, truncated: Any, info: Any) -> str:
    if not isinstance(info, dict) or "valid" not in info or "category" not in info:
        return f"info has no 'category' and 'valid': {_SHORT.repr(info)}"
    if not isinstance(reward, float) or np.isnan(reward):
        return f"the reward is {reward!r} ({type(reward).__name__}), not a float"
    if terminated is not True or truncated is not False:
        return (
            f"terminated={terminated!r}, truncated={truncated!r}: a pivot episode is one step (True, False)"
        )
    return ""


def _brief(error: BaseException, limit: int = 400) -> str:
    text = str(error)
    return text if len(text) <= limit else text[:limit] + " [...]"


def _verdict(info: dict) -> str:
    return f"category {info.get('category')!r}, detail {_SHORT.repr(info.get('detail'))}"


def _get(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, dict) else value


def _difference(expected: Any, got: Any) -> str:
    """Where `got` first departs from `expected` (lists by index, dicts by key), in a line."""
    if isinstance(expected, list) and isinstance(got, list):
        for index, (want, have) in enumerate(zip(expected, got)):
            if want != have:
                return f"item {index} is {_SHORT.repr(have)}, expected {_SHORT.repr(want)}"
        return f"{len(got)} items, expected {len(expected)}"
    if isinstance(expected, dict) and isinstance(got, dict):
        for key in sorted({*expected, *got}, key=str):
            if expected.get(key) != got.get(key):
                return f"{key!r}: {_difference(expected.get(key), got.get(key))}"
    return f"{_SHORT.repr(got)}, expected {_SHORT.repr(expected)}"


def vandalise(value: Any) -> None:
    """Edit every dict and list inside `value` in place, as careless caller code might."""
    if isinstance(value, dict):
        for key in list(value):
            vandalise(value[key])
            if isinstance(value[key], str):
                value[key] = "vandalised"
        value["injected"] = ["by the caller"]
    elif isinstance(value, list):
        for item in value:
            vandalise(item)
        value.append({"role": "user", "content": "injected"})

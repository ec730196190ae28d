"""Scoring many (pivot, action) pairs through envs, concurrently.

`EnvPool` keeps up to `size` envs, each used by one thread at a time, resets one to a pivot and
steps an action; the profiler, the evaluation, the GRPO trainer and the TRL adapter all score
through it. `resolve_env` turns an env id, a factory or the pivots' domain into a factory of envs
holding the pivots.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pivot_envs.config import ConfigError
from pivot_envs.errors import PivotEnvsError, PivotSetError
from pivot_envs.pivot import Pivot

EnvFactory = Callable[[], Any]


class EnvScoringError(PivotEnvsError, RuntimeError):
    """An env raised one of the library's errors out of reset or step (its restore's infrastructure
    failed: a sandbox, a tool backend); the env's error is chained."""


@dataclass
class Score:
    """The env's verdict on one action at one pivot."""

    reward: float
    strict_reward: float
    valid: bool
    category: str
    detail: str = ""

    @classmethod
    def from_step(cls, reward: Any, info: dict[str, Any]) -> Score:
        """The Score of one `env.step`: its reward and the info's strict reward, validity, category and detail."""
        return cls(
            float(reward),
            float(info.get("strict_reward", 0.0)),
            bool(info.get("valid", True)),
            str(info.get("category", "")),
            str(info.get("detail", "")),
        )


def resolve_env(env: str | EnvFactory | None, pivots: Sequence[Pivot], **env_kwargs: Any) -> EnvFactory:
    """A factory of envs that hold `pivots`: from an env id (`pivot/tool-use-v0`), a callable, or the pivots' domain.

    With no pivots an env id builds the domain's bundled pivot set.
    """
    if callable(env):
        return env
    if env is None:
        domains = sorted({pivot.domain for pivot in pivots})
        if len(domains) != 1 or not domains[0]:
            raise PivotSetError(
                f"cannot tell which env scores these pivots (domains {domains}): pass an env id"
            )
        env = f"pivot/{domains[0]}-v0"
    env_id, kept = env, list(pivots)

    def make() -> Any:
        import gymnasium as gym

        import pivot_envs

        gym.register_envs(pivot_envs)
        # The passive checker re-validates every step; pools step many, and check_env is tested per env.
        return gym.make(env_id, disable_env_checker=True, **({"pivots": kept} if kept else {}), **env_kwargs)

    return make


class EnvPool:
    """Up to `size` envs from `make_env`, each used by one thread at a time, stepping (pivot id, action) pairs."""

    def __init__(self, make_env: EnvFactory, size: int = 4) -> None:
        if size < 1:
            raise ConfigError(f"an env pool needs at least one env, got size={size}")
        self.make_env = make_env
        self.size = size
        self._idle: queue.Queue = queue.Queue()
        self._envs: list[Any] = []
        self._executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix="pivot-env")

    def _score_one(self, pivot_id: str, action: Any) -> Score:
        try:
            env = self._idle.get_nowait()
        except queue.Empty:
            env = self.make_env()
            inner = getattr(env, "unwrapped", env)
            if hasattr(inner, "copy_observations"):  # the pool reads rewards and infos, never observations
                inner.copy_observations = False
            self._envs.append(env)
        try:
            env.reset(options={"pivot": pivot_id})
            _, reward, _, _, info = env.step(action)
        except PivotEnvsError as error:
            raise EnvScoringError(f"pivot {pivot_id}: the env failed on an action: {error}") from error
        except Exception as error:
            # Anything else breaks the env contract (step never raises; reset is given pivots the env holds): a bug.
            raise RuntimeError(f"pivot {pivot_id}: the env failed on an action: {error!r}") from error
        finally:
            self._idle.put(env)
        return Score.from_step(reward, info)

    def submit(self, pivot_id: str, action: Any) -> Future:
        """Step one action at a pivot on a pool thread; the future's result is its Score."""
        return self._executor.submit(self._score_one, pivot_id, action)

    def score(self, jobs: Sequence[tuple[str, Any]]) -> list[Score]:
        """The scores of (pivot id, action) pairs, in order, stepped concurrently."""
        return list(self._executor.map(lambda job: self._score_one(*job), jobs))

    def close(self) -> None:
        """Shut the threads down and close the envs."""
        self._executor.shutdown(wait=True)
        for env in self._envs:
            env.close()
        self._envs.clear()

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

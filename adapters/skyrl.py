"""Pivot envs as SkyRL-gym text envs (checked against skyrl-gym 0.4.0 and SkyRL's `SkyRLGymGenerator`).

SkyRL's generator builds one env per sample, `skyrl_gym.make(row["env_class"], env_config=...,
extras=<the row's other fields>)`, calls `env.init(row["prompt"])` for the first prompt, steps
each model turn with `env.step(text)` until `done`, then `env.close()`. A pivot is one turn:

    from pivot_envs.adapters.skyrl import register_skyrl_envs, write_skyrl_dataset

    write_skyrl_dataset(pivots, "train.parquet")  # prompt, env_class, pivot_id, domain, data_source
    register_skyrl_envs("pivots.jsonl")  # in the process that runs SkyRL's generator
    # trainer: data.train_data="['train.parquet']" (env_class comes from each row)

Each row's `pivot_id` picks the pivot, so the `n_samples_per_prompt` samples of a row all start
from that pivot's state, each in its own pooled gym env reset to it (a fork, for sandboxes).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from pivot_envs.adapters.chat_template import prompt_messages
from pivot_envs.env import InfrastructureError
from pivot_envs.errors import MissingExtraError, PivotEnvsError, PivotSetError, UnknownNameError, did_you_mean
from pivot_envs.pivot import Pivot, read_pivots
from pivot_envs.registry import env_id as domain_env_id
from pivot_envs.scoring import resolve_env

try:
    import skyrl_gym
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
except ImportError:
    raise MissingExtraError("pivot envs in SkyRL-gym", "skyrl_gym", "skyrl") from None

ON_INVALID = ("raise", "zero")


class SkyRLInputError(PivotEnvsError, ValueError):
    """What SkyRL handed a pivot text env (its extras, a second step) is not what it can use."""


class PivotEnvSource:
    """The pivots behind one SkyRL env id and a thread-safe pool of gym envs that score them.

    SkyRL builds an env per sample, in up to `max_env_workers` threads: a sample's env takes an
    idle gym env at `init` and gives it back after its step (or at `close`), so a gym env (its
    tool backend, its sandbox's built prefix state) serves many samples.
    """

    def __init__(self, make_env: Callable[[], Any], on_invalid: str = "raise") -> None:
        if on_invalid not in ON_INVALID:
            raise UnknownNameError("on_invalid", on_invalid, ON_INVALID)
        self.make_env = make_env
        self.on_invalid = on_invalid
        self._lock = threading.Lock()
        self._idle: list[Any] = []
        self._made: list[Any] = []
        self._by_id: dict[str, Pivot] | None = None

    def acquire(self) -> Any:
        """An idle gym env, or a new one."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
        env = self.make_env()
        with self._lock:
            self._made.append(env)
        return env

    def release(self, env: Any) -> None:
        """Give a gym env back for the next sample."""
        with self._lock:
            self._idle.append(env)

    def pivot(self, pivot_id: Any) -> Pivot:
        """The pivot with this id; SkyRLInputError naming a close id when there is none."""
        if self._by_id is None:
            env = self.acquire()
            try:
                by_id = {p.id: p for p in env.unwrapped.pivots}
            finally:
                self.release(env)
            with self._lock:
                self._by_id = by_id
        if not isinstance(pivot_id, str) or pivot_id not in self._by_id:
            raise SkyRLInputError(
                f"pivot text env: unknown pivot_id {pivot_id!r} ({len(self._by_id)} pivots registered)"
                f"{did_you_mean(str(pivot_id), self._by_id) if len(self._by_id) <= 1000 else ''}"
            )
        return self._by_id[pivot_id]

    @property
    def idle(self) -> int:
        """How many gym envs wait for a sample."""
        return len(self._idle)

    @property
    def made(self) -> int:
        """How many gym envs this source has built."""
        return len(self._made)

    def close(self) -> None:
        """Close every gym env this source built."""
        with self._lock:
            made, self._made, self._idle = self._made, [], []
        for env in made:
            env.close()


class PivotTextEnv(BaseTextEnv):
    """One SkyRL sample at one pivot: `init` gives the pivot's prompt, `step(text)` scores the one turn.

    Built by `skyrl_gym.make(id, env_config=..., extras=row)` where the row holds `pivot_id`.
    `init(prompt)` restores the pivot in a pooled gym env and returns the pivot's messages with
    its tools described Hermes-style in the system message (what `write_skyrl_dataset` wrote as
    the row's prompt), and {"pivot_id"}. `step(action)` scores the model's turn with the domain's
    verifier: reward, done=True, no observations, metadata {pivot_id, category, valid,
    strict_reward, detail, output}. An infrastructure failure (valid False) raises InfrastructureError
    when the source's `on_invalid` is "raise" (SkyRL has no per-sample mask, so a 0 would enter
    the group's baseline); with "zero" it scores 0 and `get_metrics()["invalid"]` is 1.
    """

    def __init__(
        self,
        env_config: Any = None,
        extras: dict[str, Any] | None = None,
        *,
        source: PivotEnvSource,
    ) -> None:
        super().__init__()
        extras = extras or {}
        if "pivot_id" not in extras:
            raise SkyRLInputError(
                "pivot text env: the dataset row must carry a pivot_id (see write_skyrl_dataset), "
                f"got extras {sorted(extras)}"
            )
        self.source = source
        self.pivot = source.pivot(extras["pivot_id"])
        self.max_turns = 1
        self._env: Any = None
        self._restore_error = ""
        self._metrics: dict[str, float] = {}

    def init(self, prompt: Any = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Restore the pivot; returns its prompt messages (the row's own prompt is not used) and {"pivot_id"}."""
        if self._env is None:
            self._env = self.source.acquire()
        try:
            self._env.reset(options={"pivot": self.pivot.id})
        except InfrastructureError as error:
            self._restore_error = str(error)
        return prompt_messages(self.pivot.messages, self.pivot.tools), {"pivot_id": self.pivot.id}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """Score the model's turn at the restored pivot (the episode ends here)."""
        if self.turns >= self.max_turns:
            raise SkyRLInputError(
                f"pivot {self.pivot.id}: a pivot episode is one turn; it was stepped already"
            )
        if self._env is None:
            raise SkyRLInputError(f"pivot {self.pivot.id}: step before init (SkyRL calls init first)")
        self.turns += 1
        try:
            if self._restore_error:
                failed = {"category": "infrastructure_error", "valid": False, "detail": self._restore_error}
                reward, info = 0.0, failed
            else:
                _, reward, _, _, info = self._env.step(action)
        finally:
            self._give_back()
        valid = bool(info.get("valid", True))
        metadata = {
            "pivot_id": self.pivot.id,
            "category": str(info.get("category", "")),
            "valid": valid,
            "strict_reward": float(info.get("strict_reward", 0.0)),
            "detail": str(info.get("detail", "")),
            "output": info.get("output"),
        }
        self._metrics = {"strict_reward": metadata["strict_reward"], "invalid": 0.0 if valid else 1.0}
        if not valid and self.source.on_invalid == "raise":
            raise InfrastructureError(
                f"pivot {self.pivot.id}: the env's infrastructure failed ({metadata['category']}: "
                f"{metadata['detail']}); SkyRL cannot leave a sample out of its group, so it is not scored 0 "
                "(register with on_invalid='zero' to score it 0 and count it in the 'invalid' metric)"
            )
        return BaseTextEnvStepOutput(observations=[], reward=float(reward), done=True, metadata=metadata)

    def get_metrics(self) -> dict[str, float]:
        """{"strict_reward", "invalid"} of the scored turn (SkyRL averages them per env class); {} before."""
        return dict(self._metrics)

    def close(self) -> None:
        """Give the gym env back to the pool if the sample still holds it (a second close does nothing)."""
        self._give_back()

    def _give_back(self) -> None:
        if self._env is not None:
            env, self._env = self._env, None
            self.source.release(env)


_SOURCES: dict[
    str, PivotEnvSource
] = {}  # by SkyRL env id: what register_skyrl_env put in skyrl_gym's registry


def register_skyrl_env(
    env: str | Callable[[], Any] = "pivot/tool-use-v0",
    pivots: Sequence[Pivot] | str | os.PathLike[str] | None = None,
    *,
    skyrl_id: str | None = None,
    on_invalid: str = "raise",
    **env_kwargs: Any,
) -> PivotEnvSource:
    """Register one pivot env in skyrl_gym's registry under `skyrl_id` (default: the env id).

    `env` is a gymnasium pivot env id built with `env_kwargs`, or a factory of pivot envs (that
    hold their pivots);
    `pivots` (a list or a pivots JSONL path; None for the domain's bundled ones) are what the
    dataset rows' `pivot_id`s name. Registering an id again replaces it (its old gym envs are
    closed). Returns the source (its pool of gym envs: `close()` it when training ends).
    """
    if skyrl_id is None:
        if not isinstance(env, str):
            raise SkyRLInputError("register_skyrl_env: an env factory needs a skyrl_id to register under")
        skyrl_id = env
    if callable(env) and pivots is not None:
        raise SkyRLInputError("register_skyrl_env: an env factory holds its own pivots; pass pivots=None")
    if isinstance(pivots, (str, os.PathLike)):
        pivots = read_pivots(pivots)
    source = PivotEnvSource(resolve_env(env, list(pivots or []), **env_kwargs), on_invalid)
    previous = _SOURCES.pop(skyrl_id, None)
    if skyrl_id in skyrl_gym.registry:
        if previous is None:
            raise SkyRLInputError(
                f"register_skyrl_env: {skyrl_id!r} is already a SkyRL env that is not a pivot env"
            )
        skyrl_gym.envs.registration.deregister(skyrl_id)
    if previous is not None:
        previous.close()
    skyrl_gym.register(id=skyrl_id, entry_point=partial(PivotTextEnv, source=source))
    _SOURCES[skyrl_id] = source
    return source


def register_skyrl_envs(
    pivots: Sequence[Pivot] | str | os.PathLike[str] | None = None,
    *,
    on_invalid: str = "raise",
    **env_kwargs: Any,
) -> list[str]:
    """Register `pivot/<domain>-v0` in skyrl_gym's registry for each domain of `pivots`.

    With no pivots, every installed domain with its bundled pivots. Returns the ids registered.
    """
    if pivots is None:
        import pivot_envs

        # lazily: a domain's env (and its bundled pivots) is built at the first sample naming it
        for env_id in pivot_envs.ENV_IDS:
            register_skyrl_env(env_id, None, on_invalid=on_invalid, **env_kwargs)
        return list(pivot_envs.ENV_IDS)
    if isinstance(pivots, (str, os.PathLike)):
        pivots = read_pivots(pivots)
    by_domain: dict[str, list[Pivot]] = {}
    for pivot in pivots:
        if not pivot.domain:
            raise PivotSetError(f"pivot {pivot.id} has no domain: register it with register_skyrl_env")
        by_domain.setdefault(pivot.domain, []).append(pivot)
    ids = []
    for domain, group in sorted(by_domain.items()):
        ids.append(domain_env_id(domain))
        register_skyrl_env(ids[-1], group, on_invalid=on_invalid, **env_kwargs)
    return ids


def close_skyrl_envs() -> None:
    """Deregister every pivot env from skyrl_gym and close its gym envs (their sandboxes, tool backends)."""
    while _SOURCES:
        skyrl_id, source = _SOURCES.popitem()
        skyrl_gym.registry.pop(skyrl_id, None)
        source.close()


def skyrl_rows(pivots: Sequence[Pivot], skyrl_id: str | None = None) -> list[dict[str, Any]]:
    """One SkyRL dataset row per pivot: prompt (messages), env_class, pivot_id, domain, data_source.

    `env_class` is `skyrl_id`, or `pivot/<domain>-v0`; SkyRL passes every column but prompt and
    env_class to the env as its extras.
    """
    if not pivots:
        raise PivotSetError("skyrl_rows: no pivots")
    rows = []
    for pivot in pivots:
        env_class = skyrl_id or (domain_env_id(pivot.domain) if pivot.domain else "")
        if not env_class:
            raise PivotSetError(f"pivot {pivot.id} has no domain: pass skyrl_id")
        rows.append(
            {
                "prompt": prompt_messages(pivot.messages, pivot.tools),
                "env_class": env_class,
                "pivot_id": pivot.id,
                "domain": pivot.domain,
                "data_source": env_class,
            }
        )
    return rows


def write_skyrl_dataset(
    pivots: Sequence[Pivot], path: str | os.PathLike[str], skyrl_id: str | None = None
) -> int:
    """Write `skyrl_rows(pivots)` where SkyRL's `data.train_data` reads it: `.parquet`, `.json` or `.jsonl`.

    Returns the number of rows written.
    """
    try:
        from datasets import Dataset
    except ImportError:
        raise MissingExtraError("write_skyrl_dataset", "datasets", "skyrl") from None

    suffix = os.fspath(path).rsplit(".", 1)[-1].lower()
    if suffix not in ("parquet", "json", "jsonl"):
        raise SkyRLInputError(
            f"write_skyrl_dataset: SkyRL reads .parquet, .json or .jsonl, not {os.fspath(path)!r}"
        )
    rows = skyrl_rows(pivots, skyrl_id)
    dataset = Dataset.from_list(rows)
    if suffix == "parquet":
        dataset.to_parquet(os.fspath(path))
    else:
        dataset.to_json(os.fspath(path), lines=True)
    return len(rows)

"""Offline pivot profiling (paper Eq. 4, Algorithm 1 lines 2-4).

For every candidate (s_t, a*_t), sample K actions from a frozen reference policy, step each one
through the candidate's env (tool calls against backends, commands in sandboxes), and record the
functional rewards, the strict rewards (Eq. 2), the verdict categories and validity. The mean and
variance over the valid samples (Eq. 4) are what `filter` uses to keep D_adv (Eq. 5).

Generation is batched across candidates (`batch_pivots` per generate call) and overlaps with the
env steps of the previous batch, which run on a thread pool of env instances (`env_workers`).
Each finished candidate is appended to the output at once (flushed and fsynced), in input order;
a rerun with the same output skips the ids already there, so a killed run resumes with nothing
lost and nothing profiled twice. A seeded run samples each candidate's K actions from a seed of
its own (`pivot_seed`: the run's seed and the candidate's id), whatever batch it lands in, so a
run killed and resumed writes what an uninterrupted one writes.

Every profile records the settings it was sampled under (the reference policy, its weights when
they are a local directory, K, temperature, top-p, token budget, seed, env): a rerun with other
settings stops with an error naming the differences (or, with `restart`, moves the earlier output
aside and starts over) instead of mixing two reference policies in one file.

A sample is invalid when the env, not the action, failed (an env that raised, or a verdict with
`valid=False`); its cause is recorded in the profile's `errors`. A candidate none of whose samples
is valid is not done: a rerun drops its row and profiles it again. When `STOP_AFTER_INVALID`
samples in a row are invalid (or every sample of a shorter run is), the env is broken, not the
actions: profiling stops with an EnvFailureError naming the first causes.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pivot_envs.config import at_least, between, json_object, option
from pivot_envs.env import json_safe
from pivot_envs.errors import PivotEnvsError, PivotSetError
from pivot_envs.pivot import Pivot, PivotFormatError, PivotWriteError, PivotWriter, Profile, iter_pivots
from pivot_envs.policy import Completion, Policy, SamplingParams, load_policy
from pivot_envs.scoring import EnvPool, resolve_env


@dataclass
class ProfileConfig:
    """Options of `profile` (and of `pivotrl profile`)."""

    k: int = option(8, "actions sampled per candidate from the reference policy (K of paper Eq. 4)")
    temperature: float = option(1.0, "sampling temperature of the reference policy (0 = greedy)")
    top_p: float = option(1.0, "nucleus sampling mass")
    max_new_tokens: int = option(256, "token budget of one sampled action")
    seed: int | None = option(
        None,
        "seed of the sampler: each candidate's K samples are drawn from a seed of its own, made from this "
        "and its id, so a resumed run samples what an uninterrupted one does; None: unseeded",
    )
    batch_pivots: int = option(8, "candidates per generate call (their K samples are generated together)")
    env_workers: int = option(4, "env instances stepping samples concurrently (a thread pool)")
    env: str | None = option(
        None, "gymnasium env id for every candidate (default: pivot/<domain>-v0 of each)"
    )
    env_kwargs: dict[str, Any] | str = option(
        factory=dict, help="keyword arguments of gym.make, as a JSON object"
    )
    keep_actions: bool = option(True, "store the sampled actions in the profile (for the miss-rate analysis)")
    restart: bool = option(
        False,
        "when the output holds profiles made with other settings, move it aside to OUT.stale and "
        "start over (when false: stop with an error naming the differences)",
    )
    progress: bool = option(True, "show a progress bar on stderr")

    def __post_init__(self) -> None:
        self.env_kwargs = json_object(self.env_kwargs, "ProfileConfig.env_kwargs")
        at_least(self, 1, "k", "max_new_tokens", "batch_pivots", "env_workers")
        at_least(self, 0, "temperature")
        between(self, "top_p", 0, 1, open_low=True)

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p, self.max_new_tokens, self.seed)

    def settings(self, reference: dict[str, str]) -> dict[str, Any]:
        """What a profile depends on, recorded in each one: resuming needs the same."""
        return {
            **reference,
            "k": self.k,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_new_tokens": self.max_new_tokens,
            "seed": self.seed,
            "env": self.env,
            "env_kwargs": json.loads(json.dumps(self.env_kwargs, sort_keys=True, default=_type_name)),
        }


def _type_name(value: Any) -> str:
    """How a value JSON cannot hold is recorded: its type (its repr may hold a memory address,
    which would differ in every run and make a resume impossible)."""
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


class ProfileMismatchError(PivotEnvsError, ValueError):
    """The output holds profiles made with other settings than this run's."""


class PolicyOutputError(PivotEnvsError, RuntimeError):
    """A policy returned another number of completions than it was asked for."""


class EnvFailureError(PivotEnvsError, RuntimeError):
    """Profiling stopped because the env failed on every recent sample; the message names the first causes."""


STOP_AFTER_INVALID = 32  # invalid samples in a row that stop a run: the env is broken, not the actions


def pivot_seed(seed: int, pivot_id: str) -> int:
    """The seed a candidate's K samples are drawn from: a stable hash (SHA-256, the same in every
    process, unlike `hash()`) of the run's seed and the candidate's id, in [0, 2**31) so every
    backend and server accepts it."""
    digest = hashlib.sha256(f"{seed}/{pivot_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 2**31


WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.gguf", "config.json")


def reference_of(policy: Policy | str) -> dict[str, str]:
    """The reference policy's identity as profiles record it, known without loading the policy.

    A spec gives its name (`hf:PATH`; `openai:MODEL`, since the endpoints may change and the
    model may not) and, when it names a local checkpoint directory, `weights`: a fingerprint of
    its weight files (names, sizes, modification times), so a checkpoint retrained in place is
    another reference. A Policy object gives its `name`. Any other string is taken as the name.
    """
    if not isinstance(policy, str):
        return {"reference": policy.name}
    scheme, _, rest = policy.partition(":")
    identity = {"reference": f"openai:{rest.rpartition('#')[2]}" if scheme == "openai" else policy}
    directory = Path(rest)
    if scheme != "openai" and rest and directory.is_dir():
        digest = hashlib.sha256()
        for pattern in WEIGHT_FILES:
            for file in sorted(directory.glob(pattern)):
                stat = file.stat()
                digest.update(f"{file.name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        identity["weights"] = digest.hexdigest()[:16]
    return identity


@dataclass
class ProfileRun:
    """What a `profile` call did: candidates profiled now, skipped (already in the output), samples."""

    profiled: int = 0
    skipped: int = 0
    samples: int = 0
    invalid: int = 0
    env_errors: int = 0
    seconds: float = 0.0
    generated_tokens: int = 0
    moved_aside: str | None = None  # where an output made with other settings went (restart)
    redone: int = 0  # candidates whose earlier row held no valid sample, dropped and profiled again

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0


def completed_ids(path: str | os.PathLike[str]) -> set[str]:
    """The ids already profiled in an output file, repairing a partially written last line.

    A run killed while writing leaves a last line without its newline; it is truncated away (its
    candidate is profiled again). Any other unreadable line is an error naming file and line.
    A candidate none of whose samples was valid (the env failed on each) is not done.
    """
    return set(completed(path))


def completed(path: str | os.PathLike[str]) -> dict[str, tuple[int, dict[str, Any]]]:
    """Each profiled id in an output file with its line number and recorded settings (see
    `completed_ids`; settings are {} in files written before they were recorded)."""
    return _read_output(path)[0]


def _read_output(
    path: str | os.PathLike[str],
) -> tuple[dict[str, tuple[int, dict[str, Any]]], dict[str, int]]:
    """(done, failed) of an output file: `completed`'s ids, and the ids and line numbers of the
    rows none of whose samples was valid (to profile again)."""
    path = Path(path)
    if not path.exists():
        return {}, {}
    with path.open("rb+") as handle:
        data = handle.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            handle.truncate(end)
            handle.flush()
            os.fsync(handle.fileno())
    done: dict[str, tuple[int, dict[str, Any]]] = {}
    failed: dict[str, int] = {}
    # Split at b"\n" only: str.splitlines would also split inside a sampled action holding U+2028 or U+0085.
    for number, line in enumerate(data[:end].split(b"\n")[:-1], start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            profiled = record.get("profile") or {}
            valid = profiled.get("valid") or []
            if valid and not any(valid):
                failed[str(record["id"])] = number
                continue
            done[str(record["id"])] = (number, profiled.get("settings") or {})
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as error:
            raise PivotFormatError(f"{path}:{number}: cannot resume from this output: {error!r}") from None
    return done, failed


def _drop_lines(path: str | os.PathLike[str], numbers: list[int]) -> None:
    """Rewrite `path` without the given (1-based) lines, atomically (a kill leaves the old file or the
    new; a full disk leaves the old one and raises PivotWriteError naming it)."""
    path = Path(path)
    dropped = set(numbers)
    lines = path.read_bytes().split(b"\n")[:-1]
    kept = [line + b"\n" for number, line in enumerate(lines, start=1) if number not in dropped]
    staging = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        with staging.open("wb") as handle:
            handle.writelines(kept)
            handle.flush()
            os.fsync(handle.fileno())
        staging.replace(path)
    except OSError as error:
        staging.unlink(missing_ok=True)
        raise PivotWriteError(
            f"{path}: cannot rewrite it without the {len(dropped)} rows to profile again: "
            f"{error.strerror or error}; it is unchanged"
        ) from error


def check_settings(
    path: str | os.PathLike[str], done: dict[str, tuple[int, dict[str, Any]]], settings: dict[str, Any]
) -> None:
    """Raise ProfileMismatchError when a profile in `path` was made with other settings."""
    for number, recorded in sorted(done.values(), key=lambda entry: entry[0]):
        if recorded == settings:
            continue
        if not recorded:
            differences = "it records no settings (written by an earlier version)"
        else:
            keys = [*settings, *(key for key in recorded if key not in settings)]
            differences = "; ".join(
                f"{key}: {recorded.get(key)!r} there, {settings.get(key)!r} now"
                for key in keys
                if recorded.get(key) != settings.get(key)
            )
        raise ProfileMismatchError(
            f"{path}:{number}: profiled with other settings than this run's ({differences}); mixing them "
            f"would profile candidates under two reference policies. Write to a new output, or restart "
            f"(--restart moves this file aside to {Path(path).name}.stale)"
        )


def env_id_for(pivot: Pivot, config: ProfileConfig) -> str:
    """The env that scores a candidate: `config.env`, else pivot/<domain>-v0."""
    if config.env:
        return config.env
    if not pivot.domain:
        raise PivotSetError(f"pivot {pivot.id}: no domain recorded; pass an env id (--env)")
    return f"pivot/{pivot.domain}-v0"


def _sample_result(future: Future) -> dict[str, Any]:
    """A sample's reward, strict reward, category, validity and, when invalid, the cause."""
    try:
        score = future.result()
    except Exception as error:  # an env bug is not the action's fault: mask the sample, count it
        root = error.__cause__ or error  # the env's own error, not the pool's wrapper
        return {
            "reward": 0.0,
            "strict": 0.0,
            "category": "env_error",
            "valid": False,
            "error": f"{type(root).__name__}: {root}",
        }
    error = "" if score.valid else f"{score.category}: {score.detail}" if score.detail else score.category
    return {
        "reward": score.reward,
        "strict": score.strict_reward,
        "category": score.category,
        "valid": score.valid,
        "error": error,
    }


def _action_text(completion: Completion) -> str:
    """A sampled action as the profile stores it: its text, or its message as JSON; a lone
    surrogate (a policy's broken decoding) becomes U+FFFD, so the row stays valid text for every
    reader (the env scored the action as sampled)."""
    if completion.message is not None:
        text = json.dumps(completion.message, ensure_ascii=False, sort_keys=True)
    else:
        text = completion.text
    return json_safe(text)


def _batches(pivots: Iterable[Pivot], size: int) -> Iterator[list[Pivot]]:
    batch: list[Pivot] = []
    for pivot in pivots:
        batch.append(pivot)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def profile(
    pivots: Iterable[Pivot] | str | os.PathLike[str],
    policy: Policy | str,
    out: str | os.PathLike[str],
    config: ProfileConfig | None = None,
    policy_options: dict[str, Any] | None = None,
    reference: str | None = None,
) -> ProfileRun:
    """Profile candidates with a reference policy, appending each finished one to `out`.

    pivots:  candidates (Pivot objects or a pivot JSONL path).
    policy:  a Policy or a policy spec (`hf:smollm2`, `openai:URL#MODEL`, ...).
    out:     the profiled JSONL; ids already in it are skipped (resume), except those none of
             whose samples was valid: their rows are dropped and they are profiled again.
    policy_options: options of the backend when `policy` is a spec (device, dtype, batch_size, ...);
             the policy is only built when some candidate is left to profile; a dtype given is
             recorded with the reference.
    reference: the reference policy's spec or name as recorded (default: `policy`'s; see
             `reference_of`); needed when the policy object was changed in memory (a warm-up)
             or its name does not say which weights it holds, so a resume can tell it apart.
    Returns a ProfileRun with counts and timing. A policy failure (unreachable endpoint) raises
    after the candidates finished so far were written. Profiles already in `out` that were made
    with other settings raise ProfileMismatchError, or with `config.restart` are moved aside.
    `STOP_AFTER_INVALID` invalid samples in a row, or a run whose every sample is invalid, raise
    EnvFailureError naming the env's first errors (the rows written so far stay in `out`).
    """
    config = config or ProfileConfig()
    if isinstance(pivots, (str, os.PathLike)):
        pivots = iter_pivots(pivots)
    identity = reference_of(reference or policy)
    if (policy_options or {}).get("dtype"):  # bfloat16 weights are another reference (recorded only when set)
        identity["dtype"] = str(policy_options["dtype"])
    settings = config.settings(identity)
    done, failed = _read_output(out)
    run = ProfileRun()
    try:
        check_settings(out, done, settings)
    except ProfileMismatchError:
        if not config.restart:
            raise
        run.moved_aside = f"{out}.stale"
        Path(out).replace(run.moved_aside)
        done, failed = {}, {}
    todo: list[Pivot] = []
    seen: set[str] = set()
    for pivot in pivots:
        if pivot.id in seen:
            raise PivotSetError(f"pivot id {pivot.id!r} appears twice in the input: ids must be unique")
        seen.add(pivot.id)
        if pivot.id in done:
            run.skipped += 1
        else:
            todo.append(pivot)
    redone = [failed[pivot.id] for pivot in todo if pivot.id in failed]
    if redone:  # rows without a valid sample: dropped, their candidates profiled again and written once
        _drop_lines(out, redone)
        run.redone = len(redone)
    if not todo:
        return run
    if isinstance(policy, str):
        policy = load_policy(policy, **(policy_options or {}))
    by_env: dict[str, list[Pivot]] = {}
    for pivot in todo:
        by_env.setdefault(env_id_for(pivot, config), []).append(pivot)
    pools = {
        env_id: EnvPool(resolve_env(env_id, pivots_of_env, **config.env_kwargs), size=config.env_workers)
        for env_id, pivots_of_env in by_env.items()
    }
    started = time.perf_counter()
    bar = _progress(config, len(todo), run.skipped)
    pending: list[tuple[Pivot, list[Completion], list[Future]]] = []
    try:
        with PivotWriter(out, append=True) as writer:
            recorder = _Recorder(writer, run, policy.name, settings, config, bar, started)
            for batch in _batches(todo, config.batch_pivots):
                if run.invalid == run.samples:
                    # Nothing valid yet: score the queued batch before generating the next one, so
                    # an env that fails on everything stops the run after one batch's generation.
                    recorder.finish(pending)
                sampling = config.sampling
                if sampling.seed is not None:
                    # Each candidate's own seed (`seed` for backends that seed a whole call only).
                    seeds = [pivot_seed(sampling.seed, pivot.id) for pivot in batch]
                    sampling = replace(sampling, seed=seeds[0], seeds=seeds)
                try:
                    groups = policy.generate([p.observation for p in batch], config.k, sampling)
                except Exception:
                    recorder.finish(pending)  # keep what was sampled
                    raise
                if len(groups) != len(batch) or any(len(g) != config.k for g in groups):
                    raise PolicyOutputError(
                        f"policy {policy.name} returned {[len(g) for g in groups]} completions for "
                        f"{len(batch)} chats x {config.k}"
                    )
                # Finish the previous batch while this one's env steps are queued behind it.
                recorder.finish(pending)
                for pivot, group in zip(batch, groups):
                    env_id = env_id_for(pivot, config)
                    futures = [pools[env_id].submit(pivot.id, c.action) for c in group]
                    pending.append((pivot, group, futures))
            recorder.finish(pending)
            if run.invalid == run.samples:
                raise recorder.failure(whole_run=True)
    finally:
        for _, _, futures in pending:  # a stopped run leaves queued env steps: drop them
            for future in futures:
                future.cancel()
        bar.close()
        for pool in pools.values():
            pool.close()
    run.seconds = time.perf_counter() - started
    return run


@dataclass
class _Recorder:
    """Writes finished candidates to the output, keeps the run's counts, and watches for a broken env."""

    writer: PivotWriter
    run: ProfileRun
    policy: str
    settings: dict[str, Any]
    config: ProfileConfig
    bar: Any
    started: float
    streak: list[tuple[str, int, str]] = field(
        default_factory=list
    )  # (pivot id, sample, cause) of the invalid run

    def finish(self, pending: list[tuple[Pivot, list[Completion], list[Future]]]) -> None:
        """Wait for the queued candidates' env steps and write each finished candidate, in order;
        raise EnvFailureError once STOP_AFTER_INVALID samples in a row were invalid."""
        for pivot, group, futures in pending:
            results = [_sample_result(future) for future in futures]
            self.write(pivot, group, results)
            for index, result in enumerate(results):
                if result["valid"]:
                    self.streak.clear()
                else:
                    self.streak.append((pivot.id, index, result["error"]))
            if len(self.streak) >= STOP_AFTER_INVALID:
                raise self.failure(whole_run=self.run.invalid == self.run.samples)
        pending.clear()

    def write(self, pivot: Pivot, group: list[Completion], results: list[dict[str, Any]]) -> None:
        profiled = Profile.from_samples(
            [r["reward"] for r in results],
            policy=self.policy,
            strict_rewards=[r["strict"] for r in results],
            categories=[r["category"] for r in results],
            valid=[r["valid"] for r in results],
            actions=[_action_text(c) for c in group] if self.config.keep_actions else None,
            settings=self.settings,
            # Each invalid sample's cause ('' for a valid one; none when every sample is valid).
            errors=[json_safe(r["error"]) for r in results] if not all(r["valid"] for r in results) else [],
        )
        record = replace(pivot, profile=profiled).to_dict()
        self.writer.write(record)
        run = self.run
        run.profiled += 1
        run.samples += len(results)
        run.invalid += sum(1 for r in results if not r["valid"])
        run.env_errors += sum(1 for r in results if r["category"] == "env_error")
        run.generated_tokens += sum(len(c.token_ids) for c in group)
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        self.bar.set_postfix(samples_s=f"{run.samples / elapsed:.1f}", refresh=False)
        self.bar.update(1)

    def failure(self, whole_run: bool) -> EnvFailureError:
        """The error that stops a run whose recent samples were all invalid, naming the first causes."""
        first: dict[str, tuple[str, int]] = {}
        for pivot_id, index, cause in self.streak:
            first.setdefault(cause, (pivot_id, index))
        causes = "; ".join(
            f"pivot {pivot_id} sample {index}: {cause}"
            for cause, (pivot_id, index) in list(first.items())[:3]
        )
        if len(first) > 3:
            causes += f"; and {len(first) - 3} other causes"
        what = (
            f"every one of the run's {len(self.streak)} samples"
            if whole_run
            else f"{len(self.streak)} samples in a row"
        )
        return EnvFailureError(
            f"profiling stopped: {what} failed in the env, not in the policy's actions ({causes}); "
            f"the candidates written without a valid sample are profiled again on a rerun"
        )


def _progress(config: ProfileConfig, total: int, skipped: int) -> Any:
    from pivot_envs.config import progress_bar

    return progress_bar(
        total=total,
        unit="pivot",
        desc=f"profiling (resumed, {skipped} done)" if skipped else "profiling",
        enabled=config.progress,
    )

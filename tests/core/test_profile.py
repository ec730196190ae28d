"""The profiler: K samples per candidate scored through the env, resumable output, clear failures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import pytest

from pivot_envs.env import InfrastructureError, Outcome, PivotEnv
from pivot_envs.errors import PivotEnvsError
from pivot_envs.pivot import Pivot, Profile, read_pivots, write_pivots
from pivot_envs.policy import Completion, SamplingParams
from pivot_envs.profile import (
    STOP_AFTER_INVALID,
    EnvFailureError,
    ProfileConfig,
    ProfileMismatchError,
    completed_ids,
    pivot_seed,
    profile,
    reference_of,
)

ROOT = Path(__file__).resolve().parents[2]

# A deterministic reference policy for the resume tests: sample j of a candidate replays the
# expert's action when (j + len(id)) is even, and a wrong message otherwise. Written to a file so
# the SIGKILL test's subprocess and this module use the very same policy.
REPLAY_POLICY = """
import time
from pivot_envs.policy import Completion


class ReplayPolicy:
    name = "replay"

    def __init__(self, delay=0.0):
        self.delay = delay

    def generate(self, chats, n, sampling):
        time.sleep(self.delay)
        out = []
        for chat in chats:
            expert = chat["expert"]
            group = []
            for j in range(n):
                if (j + len(chat["id"])) % 2 == 0:
                    group.append(Completion(text="", message=dict(expert)))
                else:
                    group.append(Completion(text="I cannot help with that, sorry."))
            out.append(group)
        return out
"""

RUNNER = '''
import sys
sys.path.insert(0, {here!r})
from replay_policy import ReplayPolicy
from pivot_envs.pivot import read_pivots
from pivot_envs.profile import ProfileConfig, profile

pivots = read_pivots({pivots!r})
observed = {{p.id: p for p in pivots}}


class ExpertAware(ReplayPolicy):
    """Sees the pivot behind each chat (by identity of its messages) to replay its expert."""

    def generate(self, chats, n, sampling):
        by_messages = {{id(p.messages): p for p in pivots}}
        tagged = [{{**c, "id": by_messages[id(c["messages"])].id,
                   "expert": by_messages[id(c["messages"])].expert}} for c in chats]
        return super().generate(tagged, n, sampling)


config = ProfileConfig(k=3, batch_pivots=2, env_workers=2, progress=False)
run = profile(pivots, ExpertAware(delay={delay}), {out!r}, config)
print("profiled", run.profiled, "skipped", run.skipped)
'''


def airline_pivots(count: int, start: int = 0) -> list[Pivot]:
    """Real bundled tau-bench airline candidates (tool-use domain)."""
    from pivot_envs.domains.tool_use.env import bundled_pivots

    return list(bundled_pivots()[start : start + count])


@pytest.fixture()
def replay_dir(tmp_path: Path) -> Path:
    (tmp_path / "replay_policy.py").write_text(REPLAY_POLICY)
    return tmp_path


def run_script(directory: Path, pivots: Path, out: Path, delay: float) -> subprocess.Popen:
    script = directory / f"run_{out.stem}.py"
    script.write_text(RUNNER.format(here=str(directory), pivots=str(pivots), out=str(out), delay=delay))
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )


def lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_a_run_killed_with_sigkill_resumes_to_exactly_the_uninterrupted_output(replay_dir: Path):
    pivots_path = replay_dir / "candidates.jsonl"
    write_pivots(airline_pivots(12), pivots_path)
    uninterrupted, resumed = replay_dir / "a.jsonl", replay_dir / "b.jsonl"

    reference = run_script(replay_dir, pivots_path, uninterrupted, delay=0.0)
    killed = run_script(replay_dir, pivots_path, resumed, delay=0.4)
    deadline = time.time() + 120
    while lines(resumed) < 4 and killed.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert killed.returncode == -signal.SIGKILL
    written = lines(resumed)
    assert 4 <= written < 12, f"the kill should land halfway, {written} of 12 were written"

    finisher = run_script(replay_dir, pivots_path, resumed, delay=0.0)
    out, err = finisher.communicate(timeout=300)
    assert finisher.returncode == 0, err.decode()[-2000:]
    assert out.decode().split() == ["profiled", str(12 - written), "skipped", str(written)]
    _, err = reference.communicate(timeout=300)
    assert reference.returncode == 0, err.decode()[-2000:]
    assert resumed.read_bytes() == uninterrupted.read_bytes()
    assert [p.id for p in read_pivots(resumed)] == [p.id for p in read_pivots(pivots_path)]


def test_a_partially_written_last_line_is_truncated_and_its_candidate_profiled_again(tmp_path: Path):
    pivots = airline_pivots(2)
    out = tmp_path / "profiled.jsonl"
    whole = json.dumps(replace(pivots[0], profile=None).to_dict())
    out.write_text(whole + "\n" + json.dumps(pivots[1].to_dict())[:57])
    assert completed_ids(out) == {pivots[0].id}
    assert out.read_text() == whole + "\n"


def test_an_output_whose_actions_hold_unicode_line_separators_resumes(tmp_path: Path):
    pivots = airline_pivots(2)

    class Separators:
        name = "separators"

        def generate(self, chats, n, sampling):
            return [[Completion("one\u2028two\u2029three\x85four")] * n for _ in chats]

    out = tmp_path / "profiled.jsonl"
    profile(pivots, Separators(), out, ProfileConfig(k=2, env="test/flaky-v0", progress=False))
    assert completed_ids(out) == {p.id for p in pivots}
    assert read_pivots(out)[1].profile.actions == ["one\u2028two\u2029three\x85four"] * 2


def test_an_unreadable_line_in_the_middle_of_the_output_is_an_error_naming_its_line(tmp_path: Path):
    out = tmp_path / "profiled.jsonl"
    out.write_text('{"id": "a"}\nnot json\n{"id": "b"}\n')
    with pytest.raises(ValueError, match=r"profiled\.jsonl:2"):
        completed_ids(out)


class FlakyBackendEnv(PivotEnv):
    """The strict verifier over real pivots, with a backend that fails on messages mentioning 'outage',
    and on every action while it is `down`."""

    domain = "flaky"
    down = False

    def execute(self, pivot, action):
        if self.down:
            raise InfrastructureError("tool backend unreachable: connection refused")
        if "outage" in str(action.get("content")):
            raise InfrastructureError("tool backend unreachable")
        return Outcome()


gym.register("test/flaky-v0", entry_point=FlakyBackendEnv, disable_env_checker=True)


@pytest.fixture()
def backend_down(monkeypatch):
    monkeypatch.setattr(FlakyBackendEnv, "down", True)


class ScriptedPolicy:
    """Answers each chat with fixed actions: the expert's, a wrong one, one hitting the outage."""

    name = "scripted"

    def __init__(self, pivots: list[Pivot]) -> None:
        self.experts = {id(p.messages): p.expert for p in pivots}
        self.calls = 0

    def generate(self, chats, n, sampling):
        self.calls += 1
        texts = [None, "wrong answer", "backend outage here", None]
        return [
            [
                Completion("", message=dict(self.experts[id(c["messages"])])) if t is None else Completion(t)
                for t in texts[:n]
            ]
            for c in chats
        ]


def test_infrastructure_failures_are_invalid_samples_kept_out_of_mean_and_variance(tmp_path: Path):
    pivots = airline_pivots(3)
    out = tmp_path / "profiled.jsonl"
    run = profile(
        pivots, ScriptedPolicy(pivots), out, ProfileConfig(k=4, env="test/flaky-v0", progress=False)
    )
    assert (run.profiled, run.samples, run.invalid) == (3, 12, 3)
    for record in read_pivots(out):
        assert record.profile.valid == [True, True, False, True]
        assert record.profile.rewards == [1.0, 0.0, 0.0, 1.0]
        assert record.profile.categories[2] == "infrastructure_error"
        assert record.profile.mean == pytest.approx(2 / 3) and record.profile.var == pytest.approx(2 / 9)
    # Each invalid sample's cause is in the row, where a user reads it.
    errors = [json.loads(line)["profile"]["errors"] for line in out.read_text().splitlines()]
    assert errors == [["", "", "infrastructure_error: tool backend unreachable", ""]] * 3
    # A rerun finds everything done and loads nothing (the spec is never loaded: its reference
    # name is given, as a caller does for a policy whose spec does not say what it holds).
    again = profile(
        pivots,
        "hf:does-not-exist",
        out,
        ProfileConfig(k=4, env="test/flaky-v0", progress=False),
        reference="scripted",
    )
    assert (again.profiled, again.skipped) == (0, 3)


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_run_whose_every_sample_fails_in_the_env_stops_early_naming_the_cause(tmp_path: Path):
    pivots = airline_pivots(40)
    policy = ScriptedPolicy(pivots)
    out = tmp_path / "profiled.jsonl"
    config = ProfileConfig(k=4, batch_pivots=4, env="pivot/no-such-domain-v0", progress=False)
    with pytest.raises(EnvFailureError) as stopped:
        profile(pivots, policy, out, config)
    message = str(stopped.value)
    assert isinstance(stopped.value, PivotEnvsError)
    assert f"every one of the run's {STOP_AFTER_INVALID} samples failed in the env" in message
    assert (
        f"pivot {pivots[0].id} sample 0: NameNotFound: Environment `no-such-domain` doesn't exist" in message
    )
    # 16 samples a batch: two batches generated, each scored before the next, of the 10 the input holds.
    assert policy.calls == 2
    rows = rows_of(out)
    assert [row["id"] for row in rows] == [p.id for p in pivots[:8]]
    assert all(row["profile"]["valid"] == [False] * 4 for row in rows)
    assert all(
        error.startswith("NameNotFound: Environment `no-such-domain`")
        for row in rows
        for error in row["profile"]["errors"]
    )


def test_a_run_shorter_than_the_stop_whose_every_sample_fails_is_an_error_at_its_end(
    tmp_path: Path, backend_down
):
    pivots = airline_pivots(3)
    out = tmp_path / "profiled.jsonl"
    with pytest.raises(
        EnvFailureError,
        match=r"every one of the run's 6 samples failed in the env, not in the policy's "
        rf"actions \(pivot {pivots[0].id} sample 0: infrastructure_error: tool backend unreachable: "
        r"connection refused\)",
    ):
        profile(pivots, ScriptedPolicy(pivots), out, ProfileConfig(k=2, env="test/flaky-v0", progress=False))
    assert len(rows_of(out)) == 3


def test_an_env_that_breaks_mid_run_stops_it_after_a_streak_of_invalid_samples(tmp_path: Path):
    pivots = airline_pivots(20)

    class DyingBackend(ScriptedPolicy):
        """The first two candidates' backend answers; from the third on every action hits the outage."""

        def generate(self, chats, n, sampling):
            healthy = super().generate(chats, n, sampling)
            return [
                group if 2 * (self.calls - 1) + i < 2 else [Completion("backend outage here")] * n
                for i, group in enumerate(healthy)
            ]

    out = tmp_path / "profiled.jsonl"
    with pytest.raises(
        EnvFailureError,
        match=rf"{STOP_AFTER_INVALID} samples in a row failed in the env, not in the "
        rf"policy's actions \(pivot {pivots[2].id} sample 0: infrastructure_error: tool backend unreachable\)",
    ):
        profile(
            pivots,
            DyingBackend(pivots),
            out,
            ProfileConfig(k=4, batch_pivots=2, env="test/flaky-v0", progress=False),
        )
    # The two healthy candidates, then the 8 whose 32 samples all failed; the other 10 were left.
    assert [any(row["profile"]["valid"]) for row in rows_of(out)] == [True] * 2 + [False] * 8


def test_candidates_without_a_valid_sample_are_profiled_again_on_a_rerun_and_written_once(
    tmp_path: Path, monkeypatch
):
    pivots = airline_pivots(4)
    out = tmp_path / "profiled.jsonl"
    config = ProfileConfig(k=4, env="test/flaky-v0", progress=False)
    profile(pivots[:1], ScriptedPolicy(pivots), out, config)
    monkeypatch.setattr(FlakyBackendEnv, "down", True)
    with pytest.raises(EnvFailureError):  # the backend went down: the rows written now hold only errors
        profile(pivots, ScriptedPolicy(pivots), out, config)
    assert len(rows_of(out)) == 4 and completed_ids(out) == {pivots[0].id}
    monkeypatch.setattr(
        FlakyBackendEnv, "down", False
    )  # back up: the failed rows are dropped and profiled again
    run = profile(pivots, ScriptedPolicy(pivots), out, config)
    assert (run.profiled, run.skipped, run.redone) == (3, 1, 3)
    rows = rows_of(out)
    assert [row["id"] for row in rows] == [p.id for p in pivots]
    assert all(row["profile"]["valid"] == [True, True, False, True] for row in rows)


def test_a_pivots_seed_is_a_stable_hash_of_the_run_seed_and_its_id():
    # SHA-256, not hash(): the same in every process (PYTHONHASHSEED) and every Python version.
    assert pivot_seed(0, "tau-airline/task6/trial0/t0") == 1503783224
    assert pivot_seed(1, "tau-airline/task6/trial0/t0") == 1574638645
    assert pivot_seed(0, "tau-airline/task6/trial0/t1") == 1917339679
    seeds = [pivot_seed(7, f"trajectory-{i}/t0") for i in range(1000)]
    assert all(0 <= seed < 2**31 for seed in seeds) and len(set(seeds)) == 1000


class SeedRecorder(ScriptedPolicy):
    """Records the seed each candidate's chat was sampled with."""

    def __init__(self, pivots: list[Pivot]) -> None:
        super().__init__(pivots)
        self.ids = {id(p.messages): p.id for p in pivots}
        self.seeds: dict[str, int | None] = {}

    def generate(self, chats, n, sampling):
        for chat, seed in zip(chats, sampling.chat_seeds(len(chats))):
            self.seeds[self.ids[id(chat["messages"])]] = seed
        return super().generate(chats, n, sampling)


def test_each_candidate_is_sampled_from_its_own_seed_whatever_batch_it_lands_in(tmp_path: Path):
    pivots = airline_pivots(5)
    by_two, by_three = SeedRecorder(pivots), SeedRecorder(pivots)
    profile(
        pivots,
        by_two,
        tmp_path / "a.jsonl",
        ProfileConfig(k=2, seed=5, batch_pivots=2, env="test/flaky-v0", progress=False),
    )
    profile(
        pivots[3:],
        by_three,
        tmp_path / "b.jsonl",
        ProfileConfig(k=2, seed=5, batch_pivots=3, env="test/flaky-v0", progress=False),
    )
    assert by_two.seeds == {p.id: pivot_seed(5, p.id) for p in pivots}
    assert by_three.seeds == {p.id: pivot_seed(5, p.id) for p in pivots[3:]}
    unseeded = SeedRecorder(pivots)
    profile(pivots, unseeded, tmp_path / "c.jsonl", ProfileConfig(k=2, env="test/flaky-v0", progress=False))
    assert set(unseeded.seeds.values()) == {None}


def test_each_profile_records_the_settings_it_was_sampled_under(tmp_path: Path):
    pivots = airline_pivots(2)
    out = tmp_path / "profiled.jsonl"
    config = ProfileConfig(
        k=2, temperature=0.7, max_new_tokens=12, seed=3, env="test/flaky-v0", progress=False
    )
    profile(pivots, ScriptedPolicy(pivots), out, config)
    expected = {
        "reference": "scripted",
        "k": 2,
        "temperature": 0.7,
        "top_p": 1.0,
        "max_new_tokens": 12,
        "seed": 3,
        "env": "test/flaky-v0",
        "env_kwargs": {},
    }
    assert [p.profile.settings for p in read_pivots(out)] == [expected, expected]
    # A keyword argument JSON cannot hold (a judge object, say) is recorded by its type, the same in every run.
    judged = ProfileConfig(env_kwargs={"judge": ScriptedPolicy([]), "threshold": 0.5}).settings({})
    assert judged["env_kwargs"] == {"judge": f"<{__name__}.ScriptedPolicy>", "threshold": 0.5}


@pytest.mark.parametrize(
    ("change", "difference"),
    [
        ({"k": 3}, "k: 2 there, 3 now"),
        ({"temperature": 0.5}, "temperature: 1.0 there, 0.5 now"),
        ({"reference": "another policy"}, "reference: 'scripted' there, 'another policy' now"),
    ],
)
def test_resuming_with_other_settings_is_an_error_naming_them_and_the_output_is_untouched(
    tmp_path, change, difference
):
    pivots = airline_pivots(3)
    out = tmp_path / "profiled.jsonl"
    first = ProfileConfig(k=2, env="test/flaky-v0", progress=False)
    profile(pivots[:2], ScriptedPolicy(pivots), out, first)
    before = out.read_bytes()
    reference = change.pop("reference", None)
    with pytest.raises(
        ProfileMismatchError, match=rf"profiled\.jsonl:1: profiled with other settings.*{difference}"
    ):
        profile(pivots, ScriptedPolicy(pivots), out, replace(first, **change), reference=reference)
    assert out.read_bytes() == before


def test_restart_moves_an_output_of_other_settings_aside_and_profiles_everything_again(tmp_path: Path):
    pivots = airline_pivots(3)
    out = tmp_path / "profiled.jsonl"
    profile(pivots[:2], ScriptedPolicy(pivots), out, ProfileConfig(k=2, env="test/flaky-v0", progress=False))
    earlier = out.read_bytes()
    run = profile(
        pivots,
        ScriptedPolicy(pivots),
        out,
        ProfileConfig(k=3, env="test/flaky-v0", progress=False, restart=True),
    )
    assert (run.profiled, run.skipped, run.moved_aside) == (3, 0, f"{out}.stale")
    assert Path(run.moved_aside).read_bytes() == earlier
    assert [p.profile.k for p in read_pivots(out)] == [3, 3, 3]
    # With the same settings, restart changes nothing: the rerun resumes.
    again = profile(
        pivots,
        ScriptedPolicy(pivots),
        out,
        ProfileConfig(k=3, env="test/flaky-v0", progress=False, restart=True),
    )
    assert (again.profiled, again.skipped, again.moved_aside) == (0, 3, None)


def test_an_output_written_before_settings_were_recorded_is_not_resumed_silently(tmp_path: Path):
    pivots = airline_pivots(2)
    out = tmp_path / "profiled.jsonl"
    old = replace(pivots[0], profile=Profile.from_samples([1.0, 0.0], policy="scripted"))
    write_pivots([old], out)
    with pytest.raises(ProfileMismatchError, match="records no settings"):
        profile(pivots, ScriptedPolicy(pivots), out, ProfileConfig(k=2, env="test/flaky-v0", progress=False))


def test_the_reference_of_a_spec_is_known_without_loading_it_and_fingerprints_local_weights(tmp_path: Path):
    assert reference_of("openai:http://a:8000/v1,http://b:8000/v1#qwen") == {"reference": "openai:qwen"}
    assert reference_of("hf:smollm2") == {"reference": "hf:smollm2"}
    assert reference_of(ScriptedPolicy([])) == {"reference": "scripted"}
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    first = reference_of(f"hf:{checkpoint}")
    assert first["reference"] == f"hf:{checkpoint}" and len(first["weights"]) == 16
    assert reference_of(f"hf:{checkpoint}") == first
    (checkpoint / "model.safetensors").write_bytes(b"retrained in place")
    assert reference_of(f"hf:{checkpoint}")["weights"] != first["weights"]


def test_duplicate_candidate_ids_are_refused(tmp_path: Path):
    pivot = airline_pivots(1)[0]
    with pytest.raises(ValueError, match="appears twice"):
        profile([pivot, pivot], ScriptedPolicy([pivot]), tmp_path / "o.jsonl", ProfileConfig(progress=False))


def test_a_bad_env_kwargs_flag_is_a_clear_error():
    with pytest.raises(ValueError, match="env_kwargs must be a JSON object"):
        ProfileConfig(env_kwargs="{backend: 1")


@pytest.fixture(scope="module")
def smollm2_policy():
    import torch

    from pivot_envs.adapters.policies.hf import HFPolicy

    torch.set_num_threads(1)  # the test machine's cores are shared: one thread is much faster there

    return HFPolicy.from_pretrained("smollm2", device="cpu", batch_size=4)


def short_airline_pivots(count: int) -> list[Pivot]:
    """Real airline candidates with the long policy prompt cut and only the expert's tools kept (CPU time)."""
    from pivot_envs.chat import tool_name

    chosen = []
    for pivot in airline_pivots(60):
        names = {c["function"]["name"] for c in pivot.expert.get("tool_calls") or []}
        if not names or len(pivot.messages) > 8:
            continue
        messages = [dict(m) for m in pivot.messages]
        messages[0]["content"] = "You are an airline customer service agent. Use the tools to help the user."
        tools = [t for t in pivot.tools if tool_name(t) in names]
        chosen.append(replace(pivot, messages=messages, tools=tools))
        if len(chosen) == count:
            return chosen
    raise AssertionError("not enough short tool-call candidates in the bundled pivots")


def test_smollm2_profiles_real_airline_candidates_into_well_formed_records(tmp_path: Path, smollm2_policy):
    pivots = short_airline_pivots(3)
    out = tmp_path / "profiled.jsonl"
    config = ProfileConfig(k=4, temperature=1.0, max_new_tokens=32, seed=0, batch_pivots=2, env_workers=2)
    run = profile(pivots, smollm2_policy, out, config)
    records = read_pivots(out)
    assert [r.id for r in records] == [p.id for p in pivots] and run.samples == 12
    for record, pivot in zip(records, pivots):
        assert record.messages == pivot.messages and record.expert == pivot.expert
        prof = record.profile
        assert prof.k == 4 and prof.policy == "hf:smollm2"
        assert len(prof.rewards) == len(prof.strict_rewards) == len(prof.categories) == len(prof.valid) == 4
        assert len(prof.actions) == 4 and all(isinstance(a, str) for a in prof.actions)
        assert all(0.0 <= r <= 1.0 for r in prof.rewards) and all(c for c in prof.categories)
        kept = [r for r, ok in zip(prof.rewards, prof.valid) if ok]
        mean = sum(kept) / len(kept)
        assert prof.mean == pytest.approx(mean)
        assert prof.var == pytest.approx(sum((r - mean) ** 2 for r in kept) / len(kept))
        assert all(s <= 1.0 and (s == 0.0 or r == 1.0) for s, r in zip(prof.strict_rewards, prof.rewards))


def test_profile_sampling_params_come_from_the_config():
    config = ProfileConfig(temperature=0.5, top_p=0.9, max_new_tokens=7, seed=3)
    assert config.sampling == SamplingParams(0.5, 0.9, 7, 3)


def test_pivotrl_profile_names_the_mismatch_before_loading_the_policy(tmp_path: Path, capsys):
    from pivot_envs.cli import main

    pivots = airline_pivots(2)
    candidates, out = tmp_path / "candidates.jsonl", tmp_path / "profiled.jsonl"
    write_pivots(pivots, candidates)
    profile(pivots[:1], ScriptedPolicy(pivots), out, ProfileConfig(k=2, env="test/flaky-v0", progress=False))
    before = out.read_bytes()
    flags = "--policy hf:/no/such/checkpoint --k 2 --env test/flaky-v0".split()
    argv = ["profile", str(candidates), "--out", str(out), *flags]
    assert main(argv) == 1
    error = capsys.readouterr().err
    assert "pivotrl profile: error:" in error and "profiled.jsonl:1: profiled with other settings" in error
    assert "reference: 'scripted' there, 'hf:/no/such/checkpoint' now" in error and "--restart" in error
    assert out.read_bytes() == before  # nothing was loaded, nothing written


def test_the_causes_of_invalid_samples_survive_reading_the_profiled_file_back(tmp_path: Path):
    profile = Profile.from_samples([1.0, 0.0], valid=[True, False], errors=["", "ConnectionError: refused"])
    assert profile.n_valid == 1 and profile.mean == 1.0
    path = tmp_path / "profiled.jsonl"
    write_pivots([replace(airline_pivots(1)[0], profile=profile)], path)
    assert read_pivots(path)[0].profile.errors == ["", "ConnectionError: refused"]

"""Pivot envs as SkyRL-gym text envs, driven through skyrl_gym's own registry, make and step output."""

from __future__ import annotations

import pytest

skyrl_gym = pytest.importorskip("skyrl_gym", reason="pip install 'pivot-envs[skyrl]'")

import gymnasium as gym  # noqa: E402
from sandbox_fixtures import has_bwrap, rootfs  # noqa: E402,F401  (the terminal test's real bubblewrap sandbox)
from skyrl_gym.envs.base_text_env import BaseTextEnv  # noqa: E402

import pivot_envs  # noqa: E402
from pivot_envs.adapters.chat_template import prompt_messages  # noqa: E402
from pivot_envs.adapters.skyrl import (  # noqa: E402
    PivotTextEnv,
    SkyRLInputError,
    close_skyrl_envs,
    register_skyrl_env,
    register_skyrl_envs,
    skyrl_rows,
    write_skyrl_dataset,
)
from pivot_envs.env import InfrastructureError, PivotEnv  # noqa: E402
from pivot_envs.errors import UnknownNameError  # noqa: E402

gym.register_envs(pivot_envs)
TOOL_USE = "pivot/tool-use-v0"
STEP_OUTPUT_KEYS = {"observations", "reward", "done", "metadata"}


@pytest.fixture(autouse=True)
def fresh_registry():
    yield
    close_skyrl_envs()


@pytest.fixture(scope="module")
def tool_pivots():
    """Two bundled tau-bench pivots whose expert turn is a tool call."""
    pivots = gym.make(TOOL_USE).unwrapped.pivots
    return [p for p in pivots if p.expert.get("tool_calls")][:2]


def hermes(message):
    """An assistant message as the model writes it: Hermes <tool_call> blocks."""
    return prompt_messages([message], [])[0]["content"]


def make_for(row):
    """What SkyRL's generator does with a dataset row: every column but prompt and env_class is extras."""
    extras = {k: v for k, v in row.items() if k not in ("prompt", "env_class")}
    extras["max_turns"] = 1  # SkyRL's generator adds its max_turns to every row's extras
    return skyrl_gym.make(row["env_class"], env_config={}, extras=extras)


def run(row, action):
    env = make_for(row)
    env.init(row["prompt"])
    out = env.step(action)
    env.close()
    return out


def test_the_experts_turn_scores_one_through_skyrl_gyms_make_and_step(tool_pivots):
    register_skyrl_envs(tool_pivots)
    row = skyrl_rows(tool_pivots)[0]
    env = make_for(row)
    assert isinstance(env, PivotTextEnv) and isinstance(env, BaseTextEnv) and env.spec.id == TOOL_USE
    prompt, info = env.init(row["prompt"])
    assert prompt == row["prompt"] and info == {"pivot_id": tool_pivots[0].id}
    assert prompt[0]["role"] == "system" and "<tools>" in prompt[0]["content"]
    out = env.step(hermes(tool_pivots[0].expert))
    assert set(out) >= STEP_OUTPUT_KEYS
    assert (out["reward"], out["done"], out["observations"]) == (1.0, True, [])
    assert out["metadata"]["category"] == "correct" and out["metadata"]["valid"] is True
    assert env.get_metrics() == {"strict_reward": 1.0, "invalid": 0.0}


def test_another_pivots_tool_call_scores_zero_and_stays_valid(tool_pivots):
    register_skyrl_envs(tool_pivots)
    other = dict(tool_pivots[1].expert)
    other["tool_calls"] = [
        {**c, "function": {**c["function"], "name": "not_a_tool_here"}} for c in other["tool_calls"]
    ]
    out = run(skyrl_rows(tool_pivots)[0], hermes(other))
    assert out["reward"] == 0.0 and out["done"] is True
    assert out["metadata"]["valid"] is True and out["metadata"]["category"] != "correct"


def test_a_malformed_tool_call_scores_zero_with_the_category_unparseable(tool_pivots):
    register_skyrl_envs(tool_pivots)
    out = run(skyrl_rows(tool_pivots)[0], "<tool_call>{not json</tool_call>")
    assert out["reward"] == 0.0
    assert (out["metadata"]["category"], out["metadata"]["valid"]) == ("unparseable", True)


def test_two_samples_of_one_row_restore_the_same_pivot_in_their_own_envs(tool_pivots):
    source = register_skyrl_env(TOOL_USE, tool_pivots)
    row = skyrl_rows(tool_pivots)[1]
    first, second = make_for(row), make_for(row)
    assert first.init(row["prompt"]) == second.init(row["prompt"])
    assert source.made == 2 and source.idle == 0  # each sample holds its own gym env
    assert first.step("I cannot help with that.")["reward"] == 0.0
    assert second.step(hermes(tool_pivots[1].expert))["reward"] == 1.0


def test_closing_a_sample_gives_its_env_back_for_the_next_sample(tool_pivots):
    source = register_skyrl_env(TOOL_USE, tool_pivots)
    rows = skyrl_rows(tool_pivots)
    env = make_for(rows[0])
    env.init(rows[0]["prompt"])
    assert (source.made, source.idle) == (1, 0)
    env.close()
    env.close()  # a second close does nothing
    assert (source.made, source.idle) == (1, 1)
    assert run(rows[1], hermes(tool_pivots[1].expert))["reward"] == 1.0
    assert (source.made, source.idle) == (1, 1)  # the next sample reused it


def test_the_written_parquet_dataset_feeds_skyrl_rows_to_the_registered_envs(tool_pivots, tmp_path):
    datasets = pytest.importorskip("datasets", reason="pip install 'pivot-envs[skyrl]'")
    path = tmp_path / "train.parquet"
    assert write_skyrl_dataset(tool_pivots, path) == 2
    register_skyrl_envs(tool_pivots)
    # how SkyRL's PromptDataset reads data.train_data
    rows = list(datasets.load_dataset("parquet", data_files=str(path))["train"])
    assert [r["pivot_id"] for r in rows] == [p.id for p in tool_pivots]
    assert {r["env_class"] for r in rows} == {TOOL_USE}
    for row, pivot in zip(rows, tool_pivots):
        assert run(row, hermes(pivot.expert))["reward"] == 1.0


class BrokenBackendEnv(PivotEnv):
    """Every action's execution fails in the backend (a tool server down), not in the action."""

    domain = "tool-use"

    def execute(self, pivot, action):
        raise InfrastructureError("tool backend down")


def test_an_infrastructure_failure_raises_rather_than_scoring_zero(tool_pivots):
    register_skyrl_env(lambda: BrokenBackendEnv(tool_pivots), skyrl_id="pivot/broken-v0")
    row = skyrl_rows(tool_pivots, skyrl_id="pivot/broken-v0")[0]
    env = make_for(row)
    env.init(row["prompt"])
    with pytest.raises(InfrastructureError, match=r"tool backend down.*on_invalid='zero'"):
        env.step(hermes(tool_pivots[0].expert))


def test_with_on_invalid_zero_a_failed_backend_scores_zero_and_counts_as_invalid(tool_pivots):
    source = register_skyrl_env(
        lambda: BrokenBackendEnv(tool_pivots), skyrl_id="pivot/broken-v0", on_invalid="zero"
    )
    row = skyrl_rows(tool_pivots, skyrl_id="pivot/broken-v0")[0]
    env = make_for(row)
    env.init(row["prompt"])
    out = env.step(hermes(tool_pivots[0].expert))
    assert out["reward"] == 0.0
    assert (out["metadata"]["category"], out["metadata"]["valid"]) == ("infrastructure_error", False)
    assert env.get_metrics()["invalid"] == 1.0
    assert source.idle == 1  # given back at the step, before SkyRL's close


class BrokenRestoreEnv(PivotEnv):
    """Restoring any pivot fails (its snapshot store is down)."""

    domain = "tool-use"

    def restore(self, pivot):
        raise InfrastructureError("snapshot store down")


@pytest.mark.parametrize("on_invalid", ["raise", "zero"])
def test_a_failed_restore_is_never_a_silent_zero(tool_pivots, on_invalid):
    register_skyrl_env(
        lambda: BrokenRestoreEnv(tool_pivots), skyrl_id="pivot/broken-v0", on_invalid=on_invalid
    )
    row = skyrl_rows(tool_pivots, skyrl_id="pivot/broken-v0")[0]
    env = make_for(row)
    env.init(row["prompt"])  # the restore's failure does not raise into SkyRL's init
    if on_invalid == "raise":
        with pytest.raises(InfrastructureError, match="snapshot store down"):
            env.step("x")
    else:
        assert env.step("x")["metadata"]["valid"] is False and env.get_metrics()["invalid"] == 1.0


def test_a_row_without_a_pivot_id_or_with_an_unknown_one_is_refused(tool_pivots):
    register_skyrl_envs(tool_pivots)
    with pytest.raises(SkyRLInputError, match=r"must carry a pivot_id.*\['max_turns'\]"):
        skyrl_gym.make(TOOL_USE, env_config={}, extras={"max_turns": 1})
    with pytest.raises(SkyRLInputError, match="unknown pivot_id 'nope'"):
        skyrl_gym.make(TOOL_USE, env_config={}, extras={"pivot_id": "nope"})


def test_a_pivot_episode_is_one_turn(tool_pivots):
    register_skyrl_envs(tool_pivots)
    row = skyrl_rows(tool_pivots)[0]
    env = make_for(row)
    with pytest.raises(SkyRLInputError, match="step before init"):
        env.step("x")
    env.init(row["prompt"])
    env.step("x")
    with pytest.raises(SkyRLInputError, match="one turn"):
        env.step("x")


def test_registering_again_replaces_a_pivot_env_but_never_a_skyrl_one(tool_pivots):
    first = register_skyrl_env(TOOL_USE, tool_pivots[:1])
    run(skyrl_rows(tool_pivots[:1])[0], "x")
    assert first.made == 1
    register_skyrl_env(TOOL_USE, tool_pivots)
    assert first.made == 0  # the replaced registration's envs are closed
    assert run(skyrl_rows(tool_pivots)[1], hermes(tool_pivots[1].expert))["reward"] == 1.0
    with pytest.raises(SkyRLInputError, match="not a pivot env"):
        register_skyrl_env(TOOL_USE, tool_pivots, skyrl_id="gsm8k")
    with pytest.raises(SkyRLInputError, match="factory holds its own pivots"):
        register_skyrl_env(lambda: BrokenRestoreEnv(tool_pivots), tool_pivots, skyrl_id="pivot/broken-v0")
    with pytest.raises(UnknownNameError, match="on_invalid 'ignore'"):
        register_skyrl_env(TOOL_USE, tool_pivots, on_invalid="ignore")


def test_without_pivots_every_installed_domain_registers_lazily_with_its_bundled_pivots(tool_pivots):
    ids = register_skyrl_envs()
    assert set(ids) == set(pivot_envs.ENV_IDS) and set(ids) <= set(skyrl_gym.registry)
    assert run(skyrl_rows(tool_pivots)[0], hermes(tool_pivots[0].expert))["reward"] == 1.0
    close_skyrl_envs()
    assert not set(ids) & set(skyrl_gym.registry)


@pytest.mark.usefixtures("has_bwrap")
def test_terminal_samples_of_one_pivot_each_step_their_own_fork_of_the_sandbox():
    from pivot_envs.domains.terminal import bundled_pivots

    pivots = [p for p in bundled_pivots() if p.id == "terminal/sed-config-port/t1"]
    register_skyrl_env("pivot/terminal-v0", pivots, sandbox="bwrap", warm_pool=0)
    row = skyrl_rows(pivots)[0]
    group = [make_for(row) for _ in range(3)]
    for env in group:
        env.init(row["prompt"])
    writer = group[0].step("```bash\ntouch marker_from_a_sibling\n```")
    reader = group[1].step("```bash\nls\n```")
    expert = group[2].step(hermes(pivots[0].expert))
    assert writer["metadata"]["valid"] and reader["metadata"]["valid"]
    assert "server.conf" in reader["metadata"]["output"]["output"]
    assert "marker_from_a_sibling" not in reader["metadata"]["output"]["output"]
    assert expert["reward"] == 1.0
    for env in group:
        env.close()


def test_the_dataset_is_also_written_as_jsonl_and_other_suffixes_are_refused(tool_pivots, tmp_path):
    import json

    assert write_skyrl_dataset(tool_pivots, tmp_path / "train.jsonl") == 2
    rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert rows == skyrl_rows(tool_pivots)
    with pytest.raises(SkyRLInputError, match=r"\.parquet, \.json or \.jsonl"):
        write_skyrl_dataset(tool_pivots, tmp_path / "train.csv")

"""Bad user input to the adapters (a model, a policy spec, an output directory, pivots, settings) raises
a typed PivotEnvsError naming the input; each keeps the built-in base it had (ValueError)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from pivot_envs.adapters.chat_template import ChatTemplateError, render_prompt
from pivot_envs.adapters.grpo import GRPOConfig, NoPivotsError, train
from pivot_envs.adapters.grpo.checkpoints import RunDirectoryError, check_resumable, refuse_earlier_run
from pivot_envs.adapters.grpo.episodes import EpisodeConfig, NoTasksError, train_episodes
from pivot_envs.adapters.grpo.groups import build_group
from pivot_envs.adapters.grpo.policy import UntrainablePolicyError
from pivot_envs.adapters.policies.hf import HFPolicy, TokenizerError
from pivot_envs.adapters.policies.openai import OpenAIPolicy, chat_completions_url
from pivot_envs.config import ConfigError
from pivot_envs.domains.tool_use.env import bundled_pivots
from pivot_envs.errors import PivotEnvsError
from pivot_envs.policy import Completion, PolicySpecError

CHAT = [{"role": "user", "content": "hi"}]


class ModelWithoutEos:
    """A causal LM stand-in whose generation config names no end-of-sequence token."""

    name_or_path = "no-eos-lm"
    generation_config = SimpleNamespace(eos_token_id=None)

    def to(self, device: str) -> ModelWithoutEos:
        return self


def test_a_tokenizer_without_a_chat_template_is_a_chat_template_error_naming_the_model() -> None:
    tokenizer = SimpleNamespace(name_or_path="plain-lm", chat_template=None)
    with pytest.raises(ChatTemplateError, match="tokenizer 'plain-lm' has no chat template") as raised:
        render_prompt(tokenizer, CHAT)
    assert isinstance(raised.value, (PivotEnvsError, ValueError))


def test_an_output_holding_an_earlier_run_is_a_run_directory_error_naming_what_is_there(
    tmp_path: Path,
) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(
        RunDirectoryError, match=rf"^{tmp_path} holds an earlier run \(1 step in metrics.jsonl\)"
    ):
        refuse_earlier_run(tmp_path)


def test_a_resume_with_other_settings_is_a_run_directory_error_naming_each_difference() -> None:
    with pytest.raises(
        RunDirectoryError, match=r"cannot resume step-2 with other settings \(group_size: 4 there, 2 now\)"
    ):
        check_resumable(Path("step-2"), {"group_size": 4}, GRPOConfig(group_size=2))


def test_training_on_no_pivots_is_a_no_pivots_error() -> None:
    with pytest.raises(NoPivotsError, match="no pivots to train on") as raised:
        train(GRPOConfig(), [])
    assert isinstance(raised.value, ValueError)


def test_a_group_size_set_below_two_after_the_config_was_built_is_a_config_error(tmp_path: Path) -> None:
    config = GRPOConfig(out=str(tmp_path))
    config.group_size = 1
    with pytest.raises(ConfigError, match=r"GRPOConfig.group_size = 1: must be >= 2"):
        train(config, bundled_pivots()[:1])


def test_an_episode_run_without_tasks_is_a_no_tasks_error_naming_the_env() -> None:
    with pytest.raises(
        NoTasksError, match="no tasks to train on: the task list given for pivot/terminal-episode-v0"
    ):
        train_episodes(EpisodeConfig(), [])


def test_completions_without_their_prompt_tokens_make_the_policy_untrainable_naming_the_pivot() -> None:
    with pytest.raises(
        UntrainablePolicyError, match="pivot p1: the policy returned completions without prompt_token_ids"
    ):
        build_group("p1", [Completion("x"), Completion("y")], [1.0, -1.0], [True, True])


def test_metrics_without_a_step_are_a_typed_error_naming_the_file(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from pivot_envs.adapters.grpo.plot import NoMetricsError, plot_metrics

    empty = tmp_path / "metrics.jsonl"
    empty.write_text("\n")
    with pytest.raises(NoMetricsError, match=f"{empty}: no metrics to plot") as raised:
        plot_metrics(empty, tmp_path / "rewards.png")
    assert isinstance(raised.value, (PivotEnvsError, ValueError))


def test_an_hf_batch_size_below_one_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="HFPolicy batch_size must be >= 1, got 0"):
        HFPolicy(ModelWithoutEos(), None, device="cpu", batch_size=0)


def test_a_model_with_no_end_of_sequence_token_is_a_tokenizer_error_naming_the_model() -> None:
    with pytest.raises(
        TokenizerError, match="hf:no-eos-lm: neither tokenizer nor model defines an end-of-sequence"
    ):
        HFPolicy(ModelWithoutEos(), None, device="cpu")


def test_an_openai_policy_without_urls_or_model_or_with_a_bad_url_is_a_policy_spec_error() -> None:
    pytest.importorskip("requests")
    with pytest.raises(PolicySpecError, match="needs at least one base URL"):
        OpenAIPolicy([], "m")
    with pytest.raises(PolicySpecError, match="OpenAIPolicy at http://h:8000 needs a model name"):
        OpenAIPolicy("http://h:8000", "")
    with pytest.raises(PolicySpecError, match="base URL 'h:8000' must start with http"):
        chat_completions_url("h:8000")


def test_the_sft_warm_up_of_a_policy_without_a_model_or_with_bad_settings_is_a_typed_error() -> None:
    pytest.importorskip("torch")
    from pivot_envs.adapters.sft import SFTConfig, warm_up

    with pytest.raises(UntrainablePolicyError, match="'openai:m' has no trainable model"):
        warm_up(SimpleNamespace(name="openai:m", model=None), [])
    with pytest.raises(
        ConfigError, match=r"SFTConfig: epochs must be >= 0 and batch_size >= 1 \(got -1, 4\)"
    ):
        warm_up(SimpleNamespace(name="hf:x"), [], SFTConfig(epochs=-1), model=object())

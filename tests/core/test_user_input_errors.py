"""Bad user input (pivots, settings, names, observations) raises a typed PivotEnvsError naming the input;
each keeps the built-in base it had, so `except ValueError` callers still catch it."""

from __future__ import annotations

import pytest
from echo_domain import EchoEnv, real_pivots
from gymnasium.vector.utils import create_shared_memory, write_to_shared_memory

from pivot_envs.config import ConfigError
from pivot_envs.env import PivotEnv
from pivot_envs.errors import PivotEnvsError, PivotSetError, UnknownNameError
from pivot_envs.evaluate import evaluate
from pivot_envs.extract import split_by_trajectory
from pivot_envs.policy import SamplingParams
from pivot_envs.scoring import EnvPool
from pivot_envs.spaces import SHARED_OBSERVATION_BYTES, Chat, ObservationTooLargeError


def test_an_env_given_an_empty_pivot_set_is_a_pivot_set_error_naming_the_env() -> None:
    with pytest.raises(PivotSetError, match=r"^EchoEnv: the pivot set is empty$") as raised:
        EchoEnv([])
    assert isinstance(raised.value, ValueError)


def test_an_env_without_bundled_pivots_asks_for_a_pivot_file_as_a_pivot_set_error() -> None:
    with pytest.raises(PivotSetError, match="PivotEnv has no bundled pivots: pass pivots=PATH"):
        PivotEnv()


def test_an_unknown_verifier_is_an_unknown_name_error_naming_the_env_and_the_choices() -> None:
    with pytest.raises(UnknownNameError) as raised:
        EchoEnv(real_pivots(), verifier="strictt")
    assert (
        str(raised.value) == "unknown EchoEnv verifier 'strictt'; did you mean 'strict'? (choose from strict)"
    )
    assert isinstance(raised.value, ValueError)


def test_evaluating_no_pivots_is_a_pivot_set_error() -> None:
    with pytest.raises(PivotSetError, match="no pivots to evaluate"):
        evaluate(object(), [])


def test_a_heldout_fraction_outside_zero_to_one_is_a_config_error_naming_the_value() -> None:
    with pytest.raises(ConfigError, match=r"heldout_fraction must be in \[0, 1\], got 1.5") as raised:
        split_by_trajectory(real_pivots(), 1.5)
    assert isinstance(raised.value, ValueError)


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ({"top_k": -1}, "sampling.top_k"),
        ({"min_p": 2.0}, "sampling.min_p"),
        ({"stop": "\n"}, "sampling.stop"),
    ],
)
def test_sampling_settings_out_of_range_are_config_errors_naming_the_setting(setting, named) -> None:
    with pytest.raises(ConfigError, match=named) as raised:
        SamplingParams(**setting)
    assert isinstance(raised.value, ValueError)


def test_an_env_pool_of_no_envs_is_a_config_error_naming_the_size() -> None:
    with pytest.raises(ConfigError, match="an env pool needs at least one env, got size=0"):
        EnvPool(lambda: EchoEnv(real_pivots()), size=0)


def test_an_observation_larger_than_its_shared_memory_slot_is_a_typed_error_naming_the_way_out() -> None:
    space = Chat()
    memory = create_shared_memory(space, n=1)
    huge = {"messages": [{"role": "user", "content": "x" * SHARED_OBSERVATION_BYTES}], "tools": []}
    with pytest.raises(
        ObservationTooLargeError, match=r"exceeds the shared-memory slot.*'shared_memory': False"
    ):
        write_to_shared_memory(space, 0, huge, memory)
    with pytest.raises(PivotEnvsError):  # the same error, as the CLI catches it
        write_to_shared_memory(space, 0, huge, memory)

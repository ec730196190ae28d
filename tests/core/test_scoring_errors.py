"""What the env pool raises when an env fails: the library's own errors typed, anything else a bug."""

from __future__ import annotations

import pytest
from echo_domain import EchoEnv, real_pivots

from pivot_envs.env import InfrastructureError
from pivot_envs.errors import PivotEnvsError
from pivot_envs.scoring import EnvPool, EnvScoringError


class DownBackendEnv(EchoEnv):
    """An env whose backend is down: restoring any pivot fails as infrastructure."""

    def restore(self, pivot):
        raise InfrastructureError(f"pivot {pivot.id}: the tool backend does not answer")


def test_an_env_whose_restore_fails_is_an_env_scoring_error_naming_the_pivot_and_the_cause():
    pivots = real_pivots()
    with EnvPool(lambda: DownBackendEnv(pivots), size=1) as pool, pytest.raises(EnvScoringError) as raised:
        pool.score([(pivots[0].id, "hello")])
    message = str(raised.value)
    assert message.startswith(f"pivot {pivots[0].id}: the env failed") and "does not answer" in message
    assert isinstance(raised.value.__cause__, InfrastructureError)
    assert isinstance(raised.value, RuntimeError)  # what callers caught before the error had a type


def test_an_env_breaking_its_contract_is_a_plain_runtime_error_not_a_library_error():
    # An id the env does not hold: reset raises KeyError, which no caller of the pool should cause.
    with EnvPool(lambda: EchoEnv(real_pivots()), size=1) as pool, pytest.raises(RuntimeError) as raised:
        pool.score([("no/such", "x")])
    assert not isinstance(raised.value, PivotEnvsError)
    assert isinstance(raised.value.__cause__, KeyError)

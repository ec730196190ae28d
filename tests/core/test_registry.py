"""Domain plugins through entry points, and a light `import pivot_envs`."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.envs.registration import EnvSpec
from python_process import run_python

from pivot_envs import registry
from pivot_envs.registry import PluginError, register_domains

PLUGIN_MODULE = """
from pivot_envs import Pivot, PivotEnv
from pivot_envs.registry import DomainSpec

PIVOTS = [
    Pivot(id=f"greet/{i}", domain="{name}", messages=[{"role": "user", "content": f"say hello {i}"}],
          expert={"role": "assistant", "content": f"hello {i}"})
    for i in range(3)
]


class GreetEnv(PivotEnv):
    domain = "{name}"

    def default_pivots(self):
        return PIVOTS


DOMAIN = DomainSpec(name="{name}", env_class=GreetEnv, description="a throwaway plugin")
"""


def install_plugin(
    monkeypatch: pytest.MonkeyPatch,
    root: Path,
    name: str,
    module_source: str | None,
    value: str | None = None,
) -> None:
    """A real distribution on sys.path: a package plus a .dist-info with entry_points.txt, under `root`."""
    package = name.replace("-", "_") + "_plugin"
    if module_source is not None:
        (root / package).mkdir()
        (root / package / "__init__.py").write_text(module_source.replace("{name}", name))
    info = root / f"{package}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    entry = value or f"{package}:DOMAIN"
    (info / "entry_points.txt").write_text(f"[pivot_envs.domains]\n{name} = {entry}\n")
    monkeypatch.syspath_prepend(str(root))


def test_a_plugin_distribution_registers_its_env_lazily(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_plugin(monkeypatch, tmp_path, "greet", PLUGIN_MODULE)
    assert "pivot/greet-v0" in register_domains()
    assert "greet_plugin" not in sys.modules  # registered without importing the plugin
    env = gym.make("pivot/greet-v0")
    assert "greet_plugin" in sys.modules
    obs, info = env.reset(options={"pivot": "greet/1"})
    assert obs["messages"][0]["content"] == "say hello 1"
    _, reward, terminated, _, info = env.step("hello 1")
    assert reward == 1.0 and terminated and info["category"] == "exact_match"
    env.close()


def test_a_broken_plugin_warns_with_its_name_and_does_not_break_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_plugin(monkeypatch, tmp_path, "ghost", None, value="ghost_missing_module:DOMAIN")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids = register_domains()
    assert "pivot/ghost-v0" not in ids
    assert any("'ghost'" in str(w.message) and "broken" in str(w.message) for w in caught)


def test_a_plugin_that_fails_on_import_names_itself_at_make(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_plugin(monkeypatch, tmp_path, "crashy", "raise RuntimeError('boom at import')\n")
    assert "pivot/crashy-v0" in register_domains()
    with pytest.raises(PluginError, match=r"'crashy'.*boom at import"):
        gym.make("pivot/crashy-v0")


def test_a_plugin_env_spec_is_plain_data_and_rebuilds_the_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_plugin(monkeypatch, tmp_path, "greet", PLUGIN_MODULE)
    register_domains()
    env = gym.make("pivot/greet-v0", render_mode="ansi")
    text = env.spec.to_json()
    assert '"entry_point": "pivot_envs.registry:domain[greet]"' in text and '"render_mode": "ansi"' in text
    rebuilt = gym.make(EnvSpec.from_json(text))
    assert type(rebuilt.unwrapped).__name__ == "GreetEnv" and rebuilt.unwrapped.render_mode == "ansi"


def test_a_domain_specs_default_kwargs_apply_and_make_kwargs_override_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = PLUGIN_MODULE.replace('description="a throwaway plugin"', 'kwargs={"render_mode": "ansi"}')
    install_plugin(monkeypatch, tmp_path, "greet-ansi", source)
    register_domains()
    assert gym.make("pivot/greet-ansi-v0").unwrapped.render_mode == "ansi"
    assert gym.make("pivot/greet-ansi-v0", render_mode=None).unwrapped.render_mode is None


def test_a_spec_naming_a_domain_that_is_not_installed_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_plugin(monkeypatch, tmp_path, "greet", PLUGIN_MODULE)
    register_domains()
    spec = EnvSpec(id="pivot/greeet-v0", entry_point="pivot_envs.registry:domain[greeet]")
    with pytest.raises(PluginError, match=r"no domain plugin 'greeet' is installed.*did you mean 'greet'"):
        gym.make(spec)


def test_the_registry_module_resolves_only_domain_entry_points() -> None:
    assert callable(registry.__getattr__("domain[tool-use]"))
    with pytest.raises(AttributeError, match="no attribute 'discovr'"):
        registry.discovr  # noqa: B018


def test_import_pivot_envs_imports_no_heavy_dependency(tmp_path: Path) -> None:
    result = run_python(
        """
        import sys, gymnasium as gym, pivot_envs
        gym.register_envs(pivot_envs)
        heavy = [m for m in ("torch", "transformers", "vllm", "trl", "docker") if m in sys.modules]
        print("HEAVY", heavy)
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stdout


def test_domains_and_adapters_are_not_importable_as_top_level_names(tmp_path: Path) -> None:
    result = run_python(
        """
        import importlib.util, pivot_envs.domains, pivot_envs.adapters
        print("TOP", importlib.util.find_spec("domains"), importlib.util.find_spec("adapters"))
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "TOP None None" in result.stdout


def test_bundled_domains_are_registered_through_entry_points() -> None:
    from importlib.metadata import entry_points

    names = {ep.name for ep in entry_points(group="pivot_envs.domains")}
    assert {"tool-use", "terminal"} <= names

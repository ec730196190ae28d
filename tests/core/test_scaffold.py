"""`pivotrl new-domain NAME` writes an installable domain package whose env gym.make builds and whose
own test (check_pivot_env) passes."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from python_process import run_python

from pivot_envs.cli import new_domain as command
from pivot_envs.pivot import read_pivots
from pivot_envs.scaffold import NAME_RULE, ScaffoldError, new_domain

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

PIP = [sys.executable, "-m", "pip"]
PREFIX = "pivot-envs-scaffold-"  # distributions this test installs


def run_command(*argv: str) -> int:
    """`pivotrl new-domain ARGV` as the CLI runs it: the command module's parser, then its main."""
    parser = argparse.ArgumentParser(prog="pivotrl new-domain")
    command.add_arguments(parser)
    return command.main(parser.parse_args(argv))


def test_new_domain_writes_a_package_with_its_entry_point_and_sample_pivots(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    written = new_domain("my-calc", root)
    assert {p.relative_to(root).as_posix() for p in written} == {
        "pyproject.toml",
        "README.md",
        "tests/test_domain.py",
        "pivot_envs_my_calc/data/pivots.jsonl",
        *(f"pivot_envs_my_calc/{name}.py" for name in ("__init__", "env", "backend", "parse", "verifier")),
    }
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert project["project"]["name"] == "pivot-envs-my-calc"
    assert project["project"]["entry-points"]["pivot_envs.domains"] == {
        "my-calc": "pivot_envs_my_calc:DOMAIN"
    }
    pivots = read_pivots(root / "pivot_envs_my_calc" / "data" / "pivots.jsonl")
    assert [p.id for p in pivots] == ["calc/1/t0", "calc/1/t1", "calc/2/t0", "calc/2/t1"]
    assert {p.domain for p in pivots} == {"my-calc"}
    assert "class MyCalcEnv(PivotEnv)" in (root / "pivot_envs_my_calc" / "env.py").read_text()
    for path in written:
        if path.suffix == ".py":
            compile(path.read_text(), str(path), "exec")


@pytest.mark.parametrize("name", ["My-Domain", "1calc", "calc!", "calc.v2", "", "a" * 41])
def test_an_invalid_name_is_refused_naming_the_rule(tmp_path: Path, name: str) -> None:
    with pytest.raises(ScaffoldError) as caught:
        new_domain(name, tmp_path / "pkg")
    assert f"invalid domain name {name!r}" in str(caught.value) and NAME_RULE in str(caught.value)
    assert not (tmp_path / "pkg").exists()


def test_the_name_of_an_installed_domain_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        ScaffoldError, match="'tool-use' is already installed .*pivot_envs.domains.tool_use:DOMAIN"
    ):
        new_domain("tool-use", tmp_path / "pkg")


def test_a_directory_that_holds_anything_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "pyproject.toml").write_text("mine")
    with pytest.raises(ScaffoldError, match="is not an empty directory: new-domain never overwrites"):
        new_domain("calc", tmp_path / "pkg")
    assert [p.name for p in (tmp_path / "pkg").iterdir()] == ["pyproject.toml"]
    assert (tmp_path / "pkg" / "pyproject.toml").read_text() == "mine"
    (tmp_path / "empty").mkdir()
    assert new_domain("calc", tmp_path / "empty")


def test_the_command_writes_into_dir_and_says_what_to_run_next(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert run_command("calc", "--dir", str(tmp_path / "pkg")) == 0
    out = capsys.readouterr().out
    assert f"into {tmp_path / 'pkg'} (9 files)" in out and f"pip install -e {tmp_path / 'pkg'}" in out
    assert (tmp_path / "pkg" / "pivot_envs_calc" / "env.py").is_file()
    with pytest.raises(ScaffoldError, match="never overwrites"):
        run_command("calc", "--dir", str(tmp_path / "pkg"))


def test_the_command_defaults_to_a_new_directory_named_after_the_domain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_command("calc") == 0
    assert (tmp_path / "pivot-envs-calc" / "pyproject.toml").is_file()


# -- installed into the venv -------------------------------------------------------------------------


def remove_leftovers() -> None:
    """Uninstall scaffolds an earlier run installed and could not remove (killed), whose sources are gone."""
    for dist in metadata.distributions():
        name = dist.metadata["Name"] or ""
        url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
        if name.startswith(PREFIX) and not Path(unquote(urlparse(url).path)).exists():
            subprocess.run([*PIP, "uninstall", "-y", "-q", name], capture_output=True, timeout=120)


@pytest.mark.slow
def test_a_scaffolded_domain_installs_into_the_venv_and_passes_its_own_test(tmp_path: Path) -> None:
    name = f"scaffold-{os.getpid()}"  # unique: two runs at once install two packages
    root = tmp_path / "pkg"
    new_domain(name, root)
    remove_leftovers()
    install = [*PIP, "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-e", str(root)]
    installed = subprocess.run(install, capture_output=True, text=True, timeout=180)
    try:
        assert installed.returncode == 0, installed.stderr
        code = f"""
            import gymnasium as gym
            import pivot_envs
            env = gym.make("pivot/{name}-v0")
            pivot = env.unwrapped.pivots[0]
            env.reset(options={{"pivot": pivot.id}})
            print(type(env.unwrapped).__name__, len(env.unwrapped.pivots), env.step(pivot.expert)[1])
            """
        made = run_python(code, tmp_path)
        assert made.returncode == 0, made.stderr
        env_class = "Scaffold" + name.split("-")[1] + "Env"
        assert made.stdout.split() == [env_class, "4", "1.0"] and name not in made.stderr
        tested = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert tested.returncode == 0, tested.stdout + tested.stderr
        assert "5 passed" in tested.stdout
    finally:
        subprocess.run(
            [*PIP, "uninstall", "-y", "-q", f"pivot-envs-{name}"], capture_output=True, timeout=120
        )
    assert f"pivot-envs-{name}" not in {dist.metadata["Name"] for dist in metadata.distributions()}

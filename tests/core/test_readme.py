"""The README's code does what the README says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 3)
    return text[start : end if end > 0 else None]


def code_blocks(text: str, language: str = "python") -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def test_the_two_commands_come_first() -> None:
    first = section("The two commands")
    assert "make run" in first and "make test" in first
    assert README.read_text().index("make run") < README.read_text().index("## Quickstart")


def test_quickstart_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    (code,) = code_blocks(section("Quickstart"))[:1]
    script = tmp_path / "quickstart.py"
    script.write_text(code)
    result = subprocess.run([sys.executable, "-W", "ignore", str(script)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1.0 correct True 1.0"


def test_the_domain_example_is_a_working_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env

    from pivot_envs.registry import register_domains

    blocks = code_blocks(section("Writing a domain"))
    module = next(b for b in blocks if b.startswith("# my_domain/__init__.py"))
    entry = re.search(r'^(\w+) = "(my_domain:DOMAIN)"', section("Writing a domain"), re.M)
    package = tmp_path / "my_domain"
    package.mkdir()
    (package / "__init__.py").write_text(module)
    info = tmp_path / "my_domain-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-domain\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[pivot_envs.domains]\n{entry.group(1)} = {entry.group(2)}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "pivot/arithmetic-v0" in register_domains()
    env = gym.make("pivot/arithmetic-v0")
    check_env(env.unwrapped)
    env.reset(options={"pivot": "sum/1+2"})
    assert env.step("The answer is 3.")[1] == 1.0
    env.reset(options={"pivot": "sum/1+2"})
    _, reward, _, _, info = env.step("It is 4")
    assert reward == 0.0 and info["category"] == "wrong_number"

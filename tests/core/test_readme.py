"""The README and the docs pages that repeat its examples: their code does what they say."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def section(path: Path, title: str) -> str:
    """The heading titled `title` in `path` and everything up to the next heading of its level or above."""
    lines, fenced, level = [], False, None
    for line in path.read_text().splitlines(keepends=True):
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"(#+) (.*)", line)
        if heading and level is not None and len(heading[1]) <= level:
            break
        if heading and level is None and heading[2].strip() == title:
            level = len(heading[1])
        if level is not None:
            lines.append(line)
    assert lines, f"{path.relative_to(ROOT)} has no heading {title!r}"
    return "".join(lines)


def code_blocks(text: str, language: str = "python") -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def test_the_two_commands_come_first() -> None:
    text = README.read_text()
    first = section(README, "The two commands")
    assert "make run" in first and "make test" in first
    assert re.findall(r"^## (.*)", text, re.M)[0] == "The two commands"
    assert text.index("make run") < text.index("## Quickstart")


def test_the_readme_is_a_front_page_of_at_most_300_lines() -> None:
    assert len(README.read_text().splitlines()) <= 300, (
        "the manual belongs in docs/, the README is its front page"
    )


@pytest.mark.parametrize("page", [README, DOCS / "index.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_quickstart_runs_and_prints_what_it_says(page: Path, tmp_path: Path) -> None:
    (code,) = code_blocks(section(page, "Quickstart"))[:1]
    script = tmp_path / "quickstart.py"
    script.write_text(code)
    result = subprocess.run(
        [sys.executable, "-W", "ignore", str(script)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1.0 correct True 1.0"


@pytest.mark.parametrize(
    "page", [README, DOCS / "writing-a-domain.md"], ids=lambda p: str(p.relative_to(ROOT))
)
def test_the_domain_example_is_a_working_plugin(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env

    from pivot_envs.registry import register_domains

    text = section(page, "Writing a domain")
    module = next(b for b in code_blocks(text) if b.startswith("# my_domain/__init__.py"))
    entry = re.search(r'^(\w+) = "(my_domain:DOMAIN)"', text, re.M)
    package = tmp_path / "my_domain"
    package.mkdir()
    (package / "__init__.py").write_text(module)
    info = tmp_path / "my_domain-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-domain\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[pivot_envs.domains]\n{entry.group(1)} = {entry.group(2)}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(
        sys.modules, "my_domain", raising=False
    )  # each page's example, not the one imported first
    assert "pivot/arithmetic-v0" in register_domains()
    env = gym.make("pivot/arithmetic-v0")
    check_env(env.unwrapped)
    env.reset(options={"pivot": "sum/1+2"})
    assert env.step("The answer is 3.")[1] == 1.0
    env.reset(options={"pivot": "sum/1+2"})
    _, reward, _, _, info = env.step("It is 4")
    assert reward == 0.0 and info["category"] == "wrong_number"

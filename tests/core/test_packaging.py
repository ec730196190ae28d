"""The distribution is configured statically in pyproject.toml (no setup.py): its explicit package
list covers every package folder, and a built wheel holds the code and data under `pivot_envs/`
only, nothing as a bare top-level `domains`, `adapters` or `sandboxes`."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def _setuptools() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as file:
        return tomllib.load(file)["tool"]["setuptools"]


def _package_folders() -> dict[str, Path]:
    """Every folder with an __init__.py under the mapped folders, by its import name."""
    found = {}
    for namespace, folder in _setuptools()["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found[".".join((namespace, *parts))] = init.parent
    return found


def test_there_is_no_setup_py() -> None:
    assert not (ROOT / "setup.py").exists()


def test_the_package_list_names_every_package_folder_and_nothing_else() -> None:
    listed = set(_setuptools()["packages"])
    on_disk = set(_package_folders())
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - on_disk == set(), "these listed packages have no folder with an __init__.py"


def _source_copy(destination: Path) -> Path:
    """The files git would ship (tracked, and new ones not ignored), copied: building in the source
    tree would leave a pivot_envs.egg-info there whose metadata hides the installed entry points."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            timeout=60,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


def test_a_built_wheel_holds_every_module_and_data_file_inside_pivot_envs(tmp_path: Path) -> None:
    source = _source_copy(tmp_path / "source")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("pivot_envs-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {name.split("/")[0] for name in names} == {
        "pivot_envs",
        wheel.name.split("-py3")[0] + ".dist-info",
    }
    expected = set()
    for package, folder in _package_folders().items():
        prefix = package.replace(".", "/")
        expected |= {f"{prefix}/{path.name}" for path in folder.glob("*.py")}
        data = folder / "data"
        if data.is_dir():
            expected |= {
                f"{prefix}/data/{path.relative_to(data).as_posix()}"
                for path in data.rglob("*")
                if path.is_file()
            }
    assert expected - names == set()
    entry_points = (
        zipfile.ZipFile(wheel).read(wheel.name.split("-py3")[0] + ".dist-info/entry_points.txt").decode()
    )
    assert "[pivot_envs.domains]" in entry_points and "pivot_envs.domains.tool_use:DOMAIN" in entry_points

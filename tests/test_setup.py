"""scripts/setup-system.sh, the system half of `make run` / `make test`, in its --dry-run mode.

Each test runs the real script and compares what it reports with the machine as the test finds it:
the dry run installs, starts and builds nothing, so these hold on a set-up machine and a bare one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pivot_envs.domains.terminal import image
from pivot_envs.sandboxes.available import docker_available

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "setup-system.sh"
VENV = Path(sys.prefix)
NOBODY = 65534


def run_setup(
    *args: str, env: dict[str, str] | None = None, user: int | None = None
) -> subprocess.CompletedProcess:
    """The script's run (stdout and stderr together), with PYTHON and VENV set to this test's venv.
    As `user` (a uid) it runs a copy of the script in a folder every user can read: the checkout
    may lie where only its owner can enter (a `mktemp -d` folder, /root)."""
    full_env = {**os.environ, "PYTHON": sys.executable, "VENV": str(VENV), **(env or {})}
    if user is None:
        return _run(["bash", str(SCRIPT), *args], full_env, ROOT)
    with tempfile.TemporaryDirectory(prefix="pivot-envs-setup-") as folder:
        copy = Path(folder, "scripts", SCRIPT.name)
        copy.parent.mkdir()
        shutil.copyfile(SCRIPT, copy)
        for path in (Path(folder), copy.parent, copy):  # mkdtemp makes 0700; umask may narrow the rest
            path.chmod(0o755)
        switch = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"]
        return _run([*switch, "bash", str(copy), *args], full_env, Path(folder))


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def report(result: subprocess.CompletedProcess, step: str) -> str:
    """The line the script printed for one step."""
    lines = [line for line in result.stdout.splitlines() if line.startswith(f"setup: {step}: ")]
    assert len(lines) == 1, result.stdout + result.stderr
    return lines[0]


def has(program: str) -> bool:
    return shutil.which(program) is not None or any(Path(d, program).exists() for d in ("/usr/sbin", "/sbin"))


def missing_packages() -> list[str]:
    """The Debian packages this machine lacks, found independently of the script."""
    checks = {
        "bubblewrap": has("bwrap"),
        "debootstrap": has("debootstrap"),
        "debian-archive-keyring": Path("/usr/share/keyrings/debian-archive-keyring.gpg").is_file(),
        "gpgv": has("gpgv"),
        # the engine, not only a client (some machines ship a lone docker client binary)
        "docker.io": has("dockerd"),
    }
    return [package for package, present in checks.items() if not present]


def test_dry_run_reports_each_package_the_machine_lacks_and_the_apt_command():
    result = run_setup("--dry-run", "packages")
    assert result.returncode == 0
    line = report(result, "packages")
    missing = missing_packages()
    if not missing:
        assert (
            line
            == "setup: packages: installed (bubblewrap, debootstrap, debian-archive-keyring, gpgv, docker)"
        )
    else:
        assert f"missing {' '.join(missing)}" in line


def test_dry_run_reports_whether_the_docker_daemon_answers():
    line = report(run_setup("--dry-run", "docker"), "docker")
    if not has("docker") or not has("dockerd"):
        assert "no Docker engine (dockerd) installed" in line
    elif docker_available():
        assert line == "setup: docker: the daemon answers"
    else:
        assert "no daemon answers" in line


def test_dry_run_reports_the_built_base_image_with_its_path_and_docker_tag():
    line = report(run_setup("--dry-run", "image"), "image")
    rootfs = image.rootfs_path()
    if not image.rootfs_ready(rootfs):
        assert f"{rootfs} is not built" in line
    elif docker_available():
        assert line == f"setup: image: ready ({rootfs}, Docker image {image.image_tag()})"
    else:
        assert line == f"setup: image: ready ({rootfs}; no Docker image: no daemon answers)"


def test_dry_run_names_the_build_command_for_an_empty_cache_and_builds_nothing(tmp_path):
    line = report(run_setup("--dry-run", "image", env={"PIVOT_ENVS_CACHE": str(tmp_path)}), "image")
    rootfs = tmp_path / "terminal" / image.rootfs_path().name
    build = f"{VENV}/bin/pivotrl sandbox build-image"
    if os.geteuid() == 0 and has("debootstrap"):
        assert line == f"setup: image: {rootfs} is not built; would run: {build}"
    else:  # debootstrap needs root: the command names this user's cache, which sudo's would not be
        assert line.endswith(f"run: sudo env PIVOT_ENVS_CACHE={tmp_path} {build}")
    assert not rootfs.exists()


def test_without_apt_get_a_missing_package_is_named_and_the_other_steps_go_on(tmp_path):
    # A PATH with every program of /usr/bin and /bin but apt-get and bwrap.
    for folder in ("/usr/bin", "/bin"):
        for program in Path(folder).iterdir():
            if program.name not in ("apt-get", "bwrap") and not (tmp_path / program.name).exists():
                (tmp_path / program.name).symlink_to(program)
    result = run_setup("--dry-run", env={"PATH": str(tmp_path)})
    assert result.returncode == 0
    line = report(result, "packages")
    assert "missing bubblewrap" in line and "there is no apt-get here" in line
    assert report(result, "docker") and report(result, "image")


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to the nobody user needs root")
def test_a_user_who_cannot_reach_the_docker_daemon_is_told_the_commands_to_run():
    if not docker_available():
        pytest.skip("no Docker daemon answers here")
    if os.stat("/var/run/docker.sock").st_mode & 0o006:
        pytest.skip("the Docker socket is open to every user here")
    result = run_setup("docker", user=NOBODY)  # not a dry run: a user who is not root changes nothing
    assert result.returncode == 0
    line = report(result, "docker")
    assert "no daemon answers for nobody; the terminal domain uses bubblewrap" in line
    assert "sudo usermod -aG docker nobody" in line


def test_an_unknown_step_is_refused_with_the_steps_there_are():
    result = run_setup("imgae")
    assert result.returncode == 2
    assert "unknown argument 'imgae' (steps: packages, docker, image; option: --dry-run)" in result.stderr

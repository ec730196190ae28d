"""The repository a SWE task runs in, and its start state: the source unpacked, the task's bug
applied, and one git commit, so `git diff` shows only the agent's edits.

A repository is a `RepoSpec`: a name, a source archive (a `.tar.gz` such as an sdist, or a
directory), the workdir it lives at inside the sandbox, the command that runs named tests and the
pinned environment they run under. The bundled one is more-itertools 10.8.0 (MIT), whose sdist
ships its unittest suite. A user's repository is a TOML file of the same fields (`read_repo_spec`):

    name = "mylib"
    archive = "mylib-1.0.tar.gz"            # relative to this file; or a directory
    test_command = "python3 -m unittest {tests}"
    sources = ["mylib/core.py"]             # where `pivotrl swe make-tasks` injects bugs
    [env]
    TZ = "UTC"

The start state is made on the host, once per (archive, bug) and kept in the cache directory
(`start_tree`): unpacking in the sandbox is slower (measured on bubblewrap, 2 cores: copying the
prepared tree in 140-180 ms, carrying the archive in and unpacking plus `git init`/commit there
160-310 ms), and the host copy is what every prefix of every pivot of the task starts from.
`load_workspace` puts it into a sandbox: a copy-on-write copy into a bubblewrap sandbox's
workspace directory, `put_archive` into a Docker container. The commit has a fixed author and
date, so its hash is the same on every machine.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from pivot_envs.errors import PivotEnvsError
from pivot_envs.sandboxes import SandboxError
from pivot_envs.sandboxes.runner import SAFE_ENV

BUNDLED_NAME = "more-itertools"
BUNDLED_ARCHIVE = "more_itertools-10.8.0.tar.gz"
# Tests run under this environment (the sandbox runner adds LANG, PATH, no pagers, no bytecode).
PINNED_ENV = {"TZ": "UTC", "PYTHONHASHSEED": "0", "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
# Bumped when the way a start tree is made changes, so cached trees are rebuilt.
TREE_FORMAT = "v1"
COMMIT_MESSAGE = "Start of the task"
# Never part of the tree the agent's edits are compared on.
EXCLUDE = "__pycache__/\n*.pyc\n.pytest_cache/\n"
GIT_TIMEOUT = 60


class RepoError(PivotEnvsError, ValueError):
    """A repository that cannot be used: a missing archive, a bad spec file, a bug patch that does not apply."""


@dataclass(frozen=True)
class RepoSpec:
    """A repository SWE tasks run in (see the module docstring).

    name:         short name tasks and pivots refer to it by ("more-itertools").
    archive:      a source archive (.tar.gz, .tgz, .tar; a single top folder is stripped) or a directory.
    test_command: runs named tests; `{tests}` becomes the space-separated test ids.
    workdir:      where the repository lives in the sandbox.
    env:          the pinned test environment (exported before tests run).
    sources:      the files bugs are injected into by `pivotrl swe make-tasks` (relative paths).
    """

    name: str
    archive: str
    test_command: str = "python3 -m unittest {tests}"
    workdir: str = "/repo"
    env: dict[str, str] = field(default_factory=lambda: dict(PINNED_ENV))
    sources: tuple[str, ...] = ()

    def tests_command(self, tests: list[str]) -> str:
        """The shell command that runs `tests` under the pinned environment."""
        exports = self.assignments()
        run = self.test_command.format(tests=" ".join(shlex.quote(test) for test in tests))
        return f"{exports} {run}" if exports else run

    def assignments(self) -> str:
        """The pinned environment as shell assignments ("TZ=UTC PYTHONHASHSEED=0 ...")."""
        return " ".join(f"{key}={shlex.quote(value)}" for key, value in sorted(self.env.items()))

    def to_dict(self) -> dict[str, Any]:
        """The JSON form a pivot's context carries for a repository that is not bundled."""
        data = asdict(self)
        data["sources"] = list(self.sources)
        return data


def bundled_repo() -> RepoSpec:
    """The bundled repository: more-itertools 10.8.0 and its unittest suite."""
    archive = resources.files("pivot_envs.domains.swe") / "data" / BUNDLED_ARCHIVE
    return RepoSpec(
        name=BUNDLED_NAME,
        archive=str(archive),
        sources=("more_itertools/more.py", "more_itertools/recipes.py"),
    )


def read_repo_spec(path: str | os.PathLike[str]) -> RepoSpec:
    """A RepoSpec from a TOML file (the module docstring shows one); `archive` is relative to the file.

    Raises RepoError naming the file and the field that is missing or wrong.
    """
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib

    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise RepoError(f"{path}: cannot read the repository spec: {error}") from None
    known = {"name", "archive", "test_command", "workdir", "env", "sources"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise RepoError(
            f"{path}: unknown field(s) {', '.join(unknown)} (the fields are {', '.join(sorted(known))})"
        )
    for key in ("name", "archive"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise RepoError(f"{path}: field {key!r} must be a non-empty string")
    if "{tests}" not in data.get("test_command", "{tests}"):
        raise RepoError(f"{path}: test_command must contain {{tests}} (where the test ids go)")
    env = data.get("env", PINNED_ENV)
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise RepoError(f"{path}: env must be a table of strings")
    archive = Path(data["archive"])
    archive = archive if archive.is_absolute() else path.parent / archive
    return RepoSpec(
        name=data["name"],
        archive=str(archive),
        test_command=data.get("test_command", RepoSpec.test_command),
        workdir=data.get("workdir", "/repo"),
        env=dict(env),
        sources=tuple(data.get("sources", ())),
    )


def resolve_repo(context: dict[str, Any]) -> RepoSpec:
    """The RepoSpec a pivot's context names: its `repo_spec` when it carries one, else the bundled repository."""
    spec = context.get("repo_spec")
    if isinstance(spec, dict):
        return RepoSpec(**{**spec, "sources": tuple(spec.get("sources", ()))})
    name = context.get("repo", BUNDLED_NAME)
    if name != BUNDLED_NAME:
        raise RepoError(f"repository {name!r} is not bundled and the pivot carries no repo_spec")
    return bundled_repo()


def _git(directory: Path, *args: str, stdin: str | None = None) -> str:
    if shutil.which("git") is None:
        raise RepoError(
            "git is not installed on this machine: the SWE domain builds its repositories with it"
        )
    env = {
        **os.environ,
        **{k: v for k, v in SAFE_ENV.items() if k.startswith("GIT_")},
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
    }
    done = subprocess.run(
        ["git", "-c", "init.defaultBranch=main", *args],
        cwd=directory,
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=GIT_TIMEOUT,
    )
    if done.returncode != 0:
        raise RepoError(f"git {args[0]} failed in {directory}: {done.stderr.strip()[-500:]}")
    return done.stdout


def unpack(repo: RepoSpec, target: Path) -> None:
    """Put the repository's source files into the empty directory `target`: an archive's regular files
    and folders (a single top folder stripped), or a directory's files (.git and __pycache__ left out)."""
    source = Path(repo.archive)
    if source.is_dir():
        shutil.copytree(
            source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git", "__pycache__")
        )
        return
    if not source.is_file():
        raise RepoError(f"repository {repo.name}: archive {source} does not exist")
    try:
        with tarfile.open(source) as archive:
            members = [m for m in archive.getmembers() if m.isfile() or m.isdir()]
            tops = {m.name.split("/", 1)[0] for m in members}
            strip = len(tops) == 1 and any("/" in m.name for m in members)
            for member in members:
                name = member.name.split("/", 1)[1] if strip and "/" in member.name else member.name
                if strip and "/" not in member.name or not name:
                    continue
                if name.startswith("/") or ".." in Path(name).parts:
                    raise RepoError(
                        f"repository {repo.name}: archive member {member.name!r} points outside the repository"
                    )
                destination = target / name
                if member.isdir():
                    destination.mkdir(parents=True, exist_ok=True)
                    continue
                destination.parent.mkdir(parents=True, exist_ok=True)
                destination.write_bytes(archive.extractfile(member).read())
                destination.chmod(0o755 if member.mode & 0o111 else 0o644)
    except tarfile.TarError as error:
        raise RepoError(f"repository {repo.name}: {source} is not a readable tar archive: {error}") from None


def apply_patch(directory: Path, patch: str, what: str = "patch") -> None:
    """Apply a unified diff (paths a/... b/...) to the files in `directory`; RepoError when it does not apply."""
    if patch.strip():
        try:
            _git(directory, "apply", "--whitespace=nowarn", "-", stdin=patch)
        except RepoError as error:
            raise RepoError(f"the {what} does not apply: {error}") from None


def source_key(repo: RepoSpec) -> str:
    """A digest of the repository's source (the archive's bytes, or a directory's files)."""
    source = Path(repo.archive)
    digest = hashlib.sha256()
    if source.is_dir():
        skipped = {".git", "__pycache__"}
        for path in sorted(
            p for p in source.rglob("*") if p.is_file() and not skipped & set(p.relative_to(source).parts)
        ):
            digest.update(str(path.relative_to(source)).encode() + b"\0" + path.read_bytes())
    elif source.is_file():
        digest.update(source.read_bytes())
    else:
        raise RepoError(f"repository {repo.name}: archive {source} does not exist")
    return digest.hexdigest()


def start_tree(repo: RepoSpec, bug_patch: str | None = None, cache: Path | None = None) -> Path:
    """The host directory holding the task's start state: source, bug applied, one commit, git metadata.

    Built once per (source, bug) under `cache` (default: the pivot-envs cache's `swe/` folder),
    in a temporary directory renamed into place when complete, so concurrent builders never see
    half a tree. Treat it as read-only: `load_workspace` copies it.
    """
    from pivot_envs.sandboxes.image import cache_dir

    key = hashlib.sha256(f"{TREE_FORMAT}\0{source_key(repo)}\0{bug_patch or ''}".encode()).hexdigest()[:16]
    root = cache or cache_dir() / "swe"
    final = root / f"{repo.name}-{key}"
    if final.is_dir():
        return final
    root.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{repo.name}-", dir=root))
    try:
        unpack(repo, building)
        apply_patch(building, bug_patch or "", f"bug patch for {repo.name}")
        _git(building, "init", "-q")
        (building / ".git" / "info").mkdir(exist_ok=True)
        (building / ".git" / "info" / "exclude").write_text(EXCLUDE)
        _git(building, "add", "-A")
        _git(building, "commit", "-q", "--no-gpg-sign", "-m", COMMIT_MESSAGE)
        building.chmod(0o755)
        try:
            building.rename(final)
        except OSError:  # another process finished the same tree first
            shutil.rmtree(building, ignore_errors=True)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return final


def tree_archive(tree: Path) -> bytes:
    """The tree as an uncompressed tar (sorted, owned by root), what Docker's put_archive takes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path in sorted(tree.rglob("*")):
            info = archive.gettarinfo(str(path), arcname=str(path.relative_to(tree)))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if info.isreg():
                with path.open("rb") as handle:
                    archive.addfile(info, handle)
            else:
                archive.addfile(info)
    return buffer.getvalue()


def load_workspace(sandbox: Any, tree: Path) -> None:
    """Copy the start tree into the sandbox's workdir (bubblewrap: on the host; Docker: put_archive).

    Raises SandboxError when the copy fails.
    """
    if sandbox.backend == "bwrap":
        from pivot_envs.sandboxes.processes import NOBODY, drop_privileges

        work = sandbox.directory / "work"
        copied = subprocess.run(["cp", "-a", "--reflink=auto", f"{tree}/.", str(work)], capture_output=True)
        if copied.returncode == 0 and drop_privileges():
            # The sandbox runs as `nobody` on the host: the files must be its own to be edited.
            copied = subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(work)], capture_output=True)
        if copied.returncode != 0:
            raise SandboxError(
                f"copying {tree} into the sandbox failed: {copied.stderr.decode(errors='replace')[-300:]}"
            )
        return
    try:
        ok = sandbox.container.put_archive(sandbox.workdir, tree_archive(tree))
    except Exception as error:  # the docker SDK's errors: the daemon, not the tree
        raise SandboxError(
            f"copying {tree} into container {sandbox.container.short_id} failed: {error}"
        ) from error
    if not ok:
        raise SandboxError(f"copying {tree} into container {sandbox.container.short_id} failed")


def start_sandbox(backend: Any, repo: RepoSpec, bug_patch: str | None = None) -> Any:
    """A new sandbox of `backend` (bubblewrap or Docker) holding the task's start state at `repo.workdir`,
    with the pinned test environment exported (every later command of either harness inherits it).

    Raises SandboxError when the copy or the export fails.
    """
    tree = start_tree(repo, bug_patch)
    sandbox = backend.new_sandbox(repo.workdir)
    try:
        load_workspace(sandbox, tree)
        exports = repo.assignments()
        if exports:
            exported = sandbox.run(f"export {exports}")
            if not exported.ok:
                raise SandboxError(f"exporting the test environment failed: {exported.output[-300:]}")
    except BaseException:
        sandbox.close()
        raise
    return sandbox


def repo_context(repo: RepoSpec) -> dict[str, Any]:
    """What a pivot's context says about its repository: the name, and the whole spec unless bundled."""
    context: dict[str, Any] = {"repo": repo.name, "workdir": repo.workdir}
    if repo != bundled_repo():
        context["repo_spec"] = json.loads(json.dumps(repo.to_dict()))
    return context

"""What the workspace manifest covers beyond the entries under it: the workspace's own entry ("."), so a
`chmod` of the workspace itself shows, and every `.git` but a repository's (one holding a regular file
HEAD, which the git state compares), so files written under a `.git` that is no repository show. Both
ways a manifest is read agree: the host's walk (bubblewrap, local Docker) and the runner's `find`
(Docker where the container's files cannot be read from the host)."""

from __future__ import annotations

import subprocess

from pivot_envs.sandboxes.manifest import manifest

# A tree with every kind of `.git`: the workspace's repository, a subdirectory's, a directory without
# HEAD, one whose HEAD is a link (git would read it; the git state does not), and a `.git` file (what a
# worktree or submodule has).
TREE = (
    "mkdir -p .git/refs sub/.git notrepo/.git/objects linked/.git worktree"
    " && echo 'ref: refs/heads/main' > .git/HEAD && echo secret > .git/config"
    " && echo 'ref: refs/heads/main' > sub/.git/HEAD && echo x > sub/.git/description"
    " && echo notes > notrepo/.git/notes && echo blob > notrepo/.git/objects/ab"
    " && ln -s ../../.git/HEAD linked/.git/HEAD"
    " && echo 'gitdir: /elsewhere' > worktree/.git"
)


def test_the_workspace_itself_is_the_manifests_first_entry_and_its_mode_shows(tmp_path):
    (tmp_path / "a.txt").write_text("a")
    tmp_path.chmod(0o755)
    files = manifest(tmp_path)
    assert next(iter(files.items())) == (".", "d 755")
    tmp_path.chmod(0o700)
    assert manifest(tmp_path)["."] == "d 700"
    tmp_path.chmod(0o755)


def test_the_workspaces_own_entry_is_beyond_the_entry_limit(tmp_path):
    for name in "abc":
        (tmp_path / name).write_text(name)
    listed = list(manifest(tmp_path, limit=2))  # files in the directory's listing order
    assert len(listed) == 3 and listed[0] == "." and set(listed[1:]) < set("abc")


def test_only_a_repositorys_git_directory_is_left_out(tmp_path):
    subprocess.run(["bash", "-c", TREE], cwd=tmp_path, check=True)
    files = manifest(tmp_path)
    assert not any(path.startswith((".git", "sub/.git")) for path in files), files
    assert {"notrepo/.git", "notrepo/.git/notes", "notrepo/.git/objects/ab"} <= files.keys()
    assert files["linked/.git/HEAD"] == "l 777 -> ../../.git/HEAD"
    assert files["worktree/.git"].startswith("f 644 ")
    assert files["sub"].startswith("d ") and files["linked/.git"].startswith("d ")


def test_a_file_written_under_a_git_directory_without_head_shows(tmp_path):
    before = manifest(tmp_path)
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "notes").write_text("x\n")
    after = manifest(tmp_path)
    assert after.keys() - before.keys() == {".git", ".git/notes"}
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")  # now a repository: left out
    assert manifest(tmp_path) == before


def test_both_backends_see_a_workspace_chmod_and_writes_under_a_git_that_is_no_repository(sandbox):
    before = sandbox.run(":", files=True).files
    assert before["."] == "d 755"
    chmod = sandbox.run("chmod 0000 /app", files=True).files
    assert chmod["."] == "d 0" and chmod.keys() == before.keys()
    sandbox.run("chmod 0755 /app")
    written = sandbox.run("mkdir -p /app/.git && echo x > /app/.git/notes", files=True).files
    assert written.keys() - before.keys() == {".git", ".git/notes"}
    assert written[".git/notes"] == "f 644 401b30e3b8b5d629635a5c613cdb7919"  # md5 of "x\n"
    assert sandbox.run("git init -q", files=True).files == before  # a repository now: the git state's


def test_the_runners_manifest_is_the_hosts_for_the_workspace_and_every_kind_of_git(has_docker):
    """Docker where the container's files cannot be read from the host prints the manifest with `find`:
    the same entries as the host's walk, the workspace's mode and the `.git` rule included."""
    from pivot_envs.domains.terminal.image import image_tag
    from pivot_envs.sandboxes.docker_backend import DockerBackend

    backend = DockerBackend(warm_pool=0)
    try:
        read, printed = (backend.create(image_tag(), "/app") for _ in range(2))
        printed.merged = None
        command = f"cd /app && {TREE} && chmod 0711 /app"
        files = [sandbox.run(command, files=True).files for sandbox in (read, printed)]
        assert files[1] == files[0], files
        assert files[1]["."] == "d 711" and "notrepo/.git/notes" in files[1] and ".git/config" not in files[1]
        assert files[1]["worktree/.git"].startswith("f 644 ")
    finally:
        backend.close()

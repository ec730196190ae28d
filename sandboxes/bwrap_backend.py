"""The bubblewrap sandbox backend: a sandbox is a directory tree on the host and a bwrap running
the command server on it.

The base root filesystem's system directories are bound read-only, with a writable workspace,
home, /tmp and state directory per sandbox, all namespaces unshared (no network), limits through
rlimits (and a cgroup where one can be made, see `cgroups`). A snapshot is a copy of that tree; a
fork is a copy-on-write copy (`cp -a --reflink=auto`) with its bwrap and command server already
started in the background (the warm pool), so a fork costs neither a copy nor a bwrap start. The
snapshot's files are hashed once; a fork's workspace manifest reuses those digests for the files
its commands left alone (`manifest.KnownDigests`), so it reads only what changed. The pool's work
(copies, bwrap starts, removals) waits for a quiet gap between commands (`background.QuietGate`),
and its copies and removals run at the lowest CPU priority, so it does not slow the commands down.
Killing a sandbox's bwrap kills its PID namespace, so every process the commands left behind.
When run as root, the sandbox drops to the `nobody` user on the host (inside it is root of its
own user namespace), so RLIMIT_NPROC bounds fork bombs.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

from . import seccomp
from .background import YIELD_AT_MOST
from .channel import Channel, LimitExceeded, ServerDown, ServerTimeout, disk_check
from .cleanup import BWRAP_PREFIX, remove_tree
from .manifest import KnownDigests, file_digests
from .output import new_marker
from .pool import ImageUnavailableError, PooledBackend, PooledSandbox
from .processes import (
    NOBODY,
    BwrapServer,
    default_signals_argv,
    drop_privileges,
    hard_limits,
    host_environment,
    process_limit,
    sandbox_cgroup,
)
from .protocol import CommandResult, SandboxError, SandboxLimits, Snapshot
from .runner import (
    CHANNEL_DIR,
    DROP_ALL,
    SERVER,
    STATE_DIR,
    clear_output,
    result_from_files,
    runner_argv,
    runner_env,
)

# The warm pool's copies and removals run at the lowest CPU priority, so they yield to commands.
BACKGROUND = ("nice", "-n", "19")
__all__ = ["YIELD_AT_MOST", "BwrapBackend", "BwrapSandbox"]


def _stop_all(servers: set[BwrapServer], root: Path) -> None:
    for server in list(servers):
        server.stop()
    servers.clear()
    remove_tree(root)


def _remove_tree(directory: Path) -> None:
    remove_tree(directory, BACKGROUND)


class BwrapBackend(PooledBackend["BwrapSandbox"]):
    """Makes bubblewrap sandboxes on one root filesystem; `close()` kills their processes and removes every
    directory it made. Its warm pool, release, close and fork safety: `pool.PooledBackend`."""

    name = "bwrap"
    workers = 3
    thread_name = "pivot-bwrap"

    def __init__(
        self,
        rootfs: str | os.PathLike,
        limits: SandboxLimits | None = None,
        root_dir: str | os.PathLike | None = None,
        warm_pool: int = 4,
    ) -> None:
        self.rootfs = Path(rootfs)
        if not (self.rootfs / "usr" / "bin" / "bash").exists():
            raise SandboxError(
                f"{self.rootfs} is not a root filesystem with bash: run `pivotrl sandbox build-image`"
            )
        self._parent = Path(root_dir or tempfile.gettempdir())
        self._drop = drop_privileges()
        self._system = self._system_binds()
        super().__init__(limits, warm_pool)

    def _own_resources(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=f"{BWRAP_PREFIX}{os.getpid()}-", dir=self._parent))
        self.root.chmod(0o755)
        self._seccomp = seccomp.filter_file(self.root)  # written once; every start opens it
        self._servers: set[BwrapServer] = set()
        # A backend that is never closed still kills its sandboxes and removes its directories
        # when collected or at exit.
        self._on_collect(_stop_all, self._servers, self.root)

    def _system_binds(self) -> list[str]:
        args: list[str] = []
        for name in ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "var", "opt"):
            path = self.rootfs / name
            if path.is_symlink():  # merged /usr: /bin -> usr/bin
                args += ["--symlink", os.readlink(path), f"/{name}"]
            elif path.is_dir():
                args += ["--ro-bind", str(path), f"/{name}"]
        return args

    def _new_dir(self) -> Path:
        return Path(tempfile.mkdtemp(prefix="sb-", dir=self.root))

    def _own(self, path: Path) -> None:
        if self._drop:
            subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(path)], check=True)

    def argv(
        self,
        directory: Path,
        workdir: str,
        inner: list[str],
        new_session: bool = True,
        channel: Path | None = None,
    ) -> list[str]:
        """The bwrap argv that runs `inner` in the sandbox made of `directory`'s trees (without the user drop).

        Inside, uid 0 holds no capability but CAP_SETPCAP, which the command server uses to run
        each command with none (runner.DROP_ALL), so commands cannot reach the server through /proc.
        """
        d = directory
        return [
            *seccomp.argv_prefix(self._seccomp),
            "bwrap",
            *seccomp.bwrap_arguments(),
            "--unshare-all",
            "--die-with-parent",
            "--cap-drop",
            "ALL",
            "--cap-add",
            "CAP_SETPCAP",
            *(["--new-session"] if new_session else []),
            "--hostname",
            "sandbox",
            "--uid",
            "0",
            "--gid",
            "0",
            *self._system,
            "--dev",
            "/dev",
            # /dev is a tmpfs of half the host's memory, which no rlimit counts: its shm gets the memory
            # limit, the rest is read-only (a cgroup, when there is one, counts tmpfs pages anyway)
            "--size",
            str(self.limits.memory_mb << 20),
            "--tmpfs",
            "/dev/shm",
            "--remount-ro",
            "/dev",
            "--proc",
            "/proc",
            "--bind",
            str(d / "tmp"),
            "/tmp",
            "--bind",
            str(d / "home"),
            "/root",
            "--bind",
            str(d / "state"),
            STATE_DIR,
            "--bind",
            str(d / "work"),
            workdir,
            *(["--ro-bind", str(channel), CHANNEL_DIR] if channel is not None else []),
            "--chdir",
            workdir,
            "--clearenv",
            *[arg for key, value in runner_env(DROP_ALL).items() for arg in ("--setenv", key, value)],
            "--setenv",
            "PIVOT_WORKDIR",
            workdir,
            *inner,
        ]

    def start_server(self, directory: Path, workdir: str) -> BwrapServer:
        """Start the sandbox's bwrap with the command server inside; it takes requests once it reads its FIFO."""
        channel = Channel(self.root, NOBODY if self._drop else None)
        cgroup = sandbox_cgroup(self.limits)
        # As root, setpriv drops to nobody: dropping in Popen's child (user=...) would make Python
        # fork instead of vfork, holding the GIL for the copy of the whole process. The cgroup is
        # joined before that (only root may), the hard rlimits set after it, all before bwrap.
        # The host's environment stays out: bwrap is the sandbox's PID 1 (see host_environment).
        with open(channel.stderr, "wb") as stderr:
            process = subprocess.Popen(
                [
                    *(cgroup.launch_prefix() if cgroup else []),
                    *self._drop,
                    *default_signals_argv(),
                    *hard_limits(self.limits),
                    *self.argv(directory, workdir, ["bash", "-c", SERVER], channel=channel.directory),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=host_environment(),
            )
        server = BwrapServer(process, channel, cgroup)
        with self._lock:
            self._servers.add(server)
        return server

    def stop_server(self, server: BwrapServer) -> None:
        with self._lock:
            self._servers.discard(server)
        server.stop()

    def create(self, workdir: str = "/app") -> BwrapSandbox:
        """A fresh sandbox with an empty workspace at `workdir`."""
        self._here()
        directory = self._new_dir()
        for part in ("work", "home", "tmp", "state"):
            (directory / part).mkdir()
        (directory / "tmp").chmod(0o1777)
        self._own(directory)
        return BwrapSandbox(self, directory, workdir, self.start_server(directory, workdir))

    def _create(self, workdir: str, image: str | None) -> BwrapSandbox:
        if image is not None:
            raise ImageUnavailableError(
                f"image {image!r} runs on Docker only: bubblewrap has the base image alone "
                f"(its root filesystem {self.rootfs}); use sandbox='docker'"
            )
        return self.create(workdir)

    def _copy(self, snapshot: Snapshot) -> tuple[Path, KnownDigests]:
        directory = self._new_dir()
        directory.rmdir()
        copied = subprocess.run(
            [*BACKGROUND, "cp", "-a", "--reflink=auto", snapshot.ref, str(directory)], capture_output=True
        )
        if copied.returncode != 0:  # e.g. the snapshot was released while a warm copy was queued
            remove_tree(directory)
            raise SandboxError(
                f"copying snapshot {snapshot.ref} failed: {copied.stderr.decode(errors='replace')[-300:]}"
            )
        # The snapshot's tree is never written after it is made: hashing it once holds for every fork.
        digests = self._once(
            snapshot, lambda: file_digests(Path(snapshot.ref) / "work", self.limits.manifest_files)
        )
        return directory, KnownDigests.of_copy(directory / "work", digests, self.limits.manifest_files)

    def _make(self, snapshot: Snapshot) -> BwrapSandbox:
        """A copy of the snapshot's tree with its server started (not yet handed out)."""
        directory, known = self._copy(snapshot)
        server = self.start_server(directory, snapshot.workdir)
        return BwrapSandbox(self, directory, snapshot.workdir, server, known, foreground=False)

    def _hand_out(self, sandbox: BwrapSandbox) -> None:
        # From here on commands may write the workspace: what is older than this stamp is the copy's.
        assert sandbox.known is not None
        sandbox.known.seal(sandbox.directory / "stamp")

    def _discard(self, sandbox: BwrapSandbox) -> None:
        sandbox.closed = True
        if sandbox.server is not None:
            self.stop_server(sandbox.server)
            sandbox.server = None
        _remove_tree(sandbox.directory)

    def discard(self, directory: Path, server: BwrapServer | None) -> None:
        """Kill a sandbox and delete its directory (in the background while the backend is open)."""

        def remove() -> None:
            if server is not None:
                self.stop_server(server)
            self._gate.wait_quiet()
            _remove_tree(directory)

        if server is not None:
            server.channel.close_ends()  # now: the removal may wait for a quiet gap
        if self.closed:
            remove()
        else:
            self._submit(remove)

    def _drop_snapshot(self, snapshot: Snapshot) -> None:
        remove_tree(snapshot.ref)

    def _close_resources(self) -> None:
        assert self._finalizer is not None
        self._finalizer()


class BwrapSandbox(PooledSandbox):
    """One bubblewrap sandbox: a directory tree on the host and a bwrap running the command server on it."""

    backend = "bwrap"

    def __init__(
        self,
        owner: BwrapBackend,
        directory: Path,
        workdir: str,
        server: BwrapServer | None = None,
        known: KnownDigests | None = None,
        foreground: bool = True,
    ) -> None:
        super().__init__(owner, workdir, foreground)
        self.directory = directory
        self.server = server
        # The digests its workspace was forked with, reused by each manifest for files left alone.
        self.known = known

    def system_writes(self) -> list[str]:
        """Paths written outside the writable roots: none can be, the system directories are read-only."""
        return []

    @property
    def channel_isolated(self) -> bool | None:
        """Whether commands run below the command server (None before its first command)."""
        return self.server.channel.isolated if self.server is not None else None

    def _run(self, command: str, timeout: float | None, files: bool, clean: bool) -> CommandResult:
        limits = self.owner.limits
        timeout = limits.timeout if timeout is None else timeout
        nproc = process_limit(limits, NOBODY if self.owner._drop else os.getuid())
        args = runner_argv(
            command,
            None,
            limits,
            new_marker(),
            nproc=nproc,
            address_space_kb=limits.memory_mb * 1024,
            report=False,
            clean=clean,
        )[4:]
        clear_output(self.directory, "state")
        left = None  # what the command left running: the server counts it before the files are read
        for attempt in (1, 2):
            if self.server is None:
                self.server = self.owner.start_server(self.directory, self.workdir)
            server = self.server
            start = time.monotonic()
            try:
                # At `timeout` the host kills the command's process group; the deadline catches a wedged server.
                _, exit_code = server.channel.call(
                    args,
                    start + timeout + 10,
                    "a bubblewrap sandbox",
                    server.alive,
                    disk_check(self.directory, limits, self._disk),
                    start + timeout,
                    server.kill_request,
                )
                note = "" if exit_code is not None else "\n[the command killed the sandbox's processes]\n"
                left = server.channel.left_running
                break
            except ServerDown as error:
                # The previous command killed the server (`kill -9 -1`): the files stay, start another.
                stderr = server.channel.stderr.read_bytes()[-500:].decode(errors="replace")
                self.owner.stop_server(server)
                self.server = None
                if attempt == 2 or stderr.startswith("bwrap:"):
                    raise SandboxError(f"bubblewrap failed: {stderr}" if stderr else str(error)) from error
            except (ServerTimeout, LimitExceeded) as error:
                # Killing the sandbox ends the command and whatever it started; the files stay.
                self.owner.stop_server(server)
                broken = (
                    str(error) if isinstance(error, LimitExceeded) else "the sandbox did not answer: killed"
                )
                self.server, exit_code, note = None, 137, f"\n[{broken}]\n"
                break
        result = result_from_files(
            self.directory,
            "state",
            "work" if files else None,
            command,
            137 if exit_code is None else exit_code,
            limits,
            timeout,
            time.monotonic() - start,
            known=self.known,
        )
        result.output += note
        result.left_running = left
        return result

    def snapshot(self) -> Snapshot:
        """Freeze the current state: a copy of this sandbox's directory tree."""
        target = self.owner._new_dir()
        target.rmdir()
        subprocess.run(["cp", "-a", "--reflink=auto", str(self.directory), str(target)], check=True)
        return Snapshot("bwrap", str(target), self.workdir)

    def interactive_argv(self) -> list[str]:
        """The argv of an interactive bash inside this sandbox (for InteractiveShell)."""
        # No --new-session here: the shell needs the pexpect terminal as its controlling terminal
        # (for C-c); that terminal belongs to pexpect, so nothing outside can be injected into.
        # The shell joins the sandbox's cgroup: its commands share the sandbox's memory and process limits.
        # Without one, its processes are bounded as a command's are: RLIMIT_NPROC at the runner's value, set
        # inside the sandbox's user namespace as the runner's `ulimit -u` is (on bwrap, before the namespace
        # exists, the kernel would hold every sandbox's processes of the same user to it).
        if self.server is None:
            self.server = self.owner.start_server(self.directory, self.workdir)
        cgroup = self.server.cgroup.launch_prefix() if self.server.cgroup is not None else []
        shell = ["bash", "--norc", "--noprofile", "-i"]
        if not cgroup:
            nproc = process_limit(self.owner.limits, NOBODY if self.owner._drop else os.getuid())
            shell = ["bash", "--norc", "--noprofile", "-c", f'ulimit -u {nproc} && exec "$0" "$@"', *shell]
        # `env -i`: the host's environment stays out of the sandbox's PID 1 (see host_environment).
        path = host_environment()["PATH"]
        return [
            "env",
            "-i",
            f"PATH={path}",
            *cgroup,
            *self.owner._drop,
            *hard_limits(self.owner.limits),
            *self.owner.argv(
                self.directory,
                self.workdir,
                [*DROP_ALL.split(), *shell],
                new_session=False,
            ),
        ]

    def close(self) -> None:
        """Kill the sandbox's processes and delete its directory tree."""
        if not self.closed:
            self.closed = True
            self.owner.discard(self.directory, self.server)
            self.server = None

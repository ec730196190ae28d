"""Sandbox backends for the terminal domain: Docker (docker SDK, real daemon) and bubblewrap.

Both run every command through `pivot_envs.sandbox.RUNNER` (shell state restore, resource
limits, hard timeout over the whole process group, output capped, optional file manifest), sent
to a command server (`pivot_envs.sandbox.SERVER`) that waits inside the sandbox on a pair of
FIFOs: a command then costs a bash fork inside the sandbox, not a `docker exec` or a bwrap start.
The host reads the command's output and the workspace's files directly from the sandbox's
directories, never following a link the command may have planted there.

Docker: containers with the network disabled and CPU, memory and pids limits; a snapshot is a
`docker commit`; forks come from a small warm pool of containers already started from the
snapshot image (refilled in the background), so a fork costs no `docker run`. Every container and
image carries the label `pivot-envs`, with the owning process in `pivot-envs.owner`, so `close()`
and `pivotrl sandbox gc` find all of them.

bubblewrap: the base root filesystem's system directories bound read-only, a writable workspace,
home, /tmp and state directory per sandbox (a directory tree on the host), all namespaces
unshared (no network), limits through rlimits. A snapshot is a copy of that tree; a fork is a
copy-on-write copy (`cp -a --reflink=auto`) with its bwrap and command server already started in
the background (the warm pool), so a fork costs neither a copy nor a bwrap start. Killing a
sandbox's bwrap kills its PID namespace, so every process the commands left behind. When run as
root, the sandbox drops to the `nobody` user on the host (inside it is root of its own user
namespace), so RLIMIT_NPROC bounds fork bombs.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import queue
import select
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from pathlib import Path

from pivot_envs.errors import MissingExtraError

from . import cgroups
from .cgroups import SandboxCgroup
from .protocol import (
    CHANNEL_DIR,
    SERVER,
    STATE_DIR,
    CommandRejected,
    CommandResult,
    SandboxError,
    SandboxLimits,
    Snapshot,
    disk_usage,
    new_marker,
    parse_runner_output,
    result_from_files,
    runner_argv,
    runner_env,
)

logger = logging.getLogger(__name__)

LABEL = "pivot-envs"
OWNER_LABEL = "pivot-envs.owner"
BWRAP_PREFIX = "pivot-envs-bwrap-"
DOCKER_PREFIX = "pivot-envs-docker-"
NOBODY = 65534
# The keep-alive of a container without a channel; docker-init (init=True) reaps orphaned processes.
KEEPALIVE = ["sleep", "infinity"]

INSTALL_HELP = (
    "no sandbox backend is available. Install either one:\n"
    "  Docker:      apt-get install docker.io (or Docker Engine), start the daemon (`dockerd` or "
    "`systemctl start docker`) and make sure `docker info` answers for this user;\n"
    "  bubblewrap:  apt-get install bubblewrap (dnf install bubblewrap; brew has none: use Docker on macOS).\n"
    "Then build the base image once: `sudo pivotrl sandbox build-image` (needs debootstrap)."
)


def owner_id() -> str:
    """A new owner: "host:pid:instance", the label value that marks what one backend (one env) made.

    Closing a backend removes only its own owner's things, so envs in one process never touch
    each other's; the host and pid let `pivotrl sandbox gc` tell the leftovers of dead processes.
    """
    return f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def _docker_sdk(what: str):
    """The `docker` module; MissingExtraError naming the extra when the SDK is not installed."""
    try:
        import docker
    except ImportError as error:
        raise MissingExtraError(what, "docker", "docker") from error
    return docker


def docker_available(timeout: float = 3.0) -> bool:
    """Whether the docker SDK is installed and a daemon answers a ping."""
    try:
        import docker
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # any failure to reach the daemon means "not available"
        return False


@functools.lru_cache(maxsize=1)
def bwrap_available() -> bool:
    """Whether bubblewrap is installed and can create its namespaces here (probed once per process)."""
    if shutil.which("bwrap") is None:
        return False
    # --as-pid-1: `true` is bwrap's own child, so bwrap reaps it. With bwrap's init in between,
    # bwrap exits as soon as `true` does and leaves its init to the host's PID 1 (a zombie for
    # good where PID 1 does not reap, as in many containers).
    result = subprocess.run(
        [*_drop_privileges(), "bwrap", "--unshare-all", "--die-with-parent", "--as-pid-1", "--ro-bind", "/", "/", "true"],
        capture_output=True, timeout=10,
    )
    return result.returncode == 0


@functools.lru_cache(maxsize=1)
def _default_signals() -> tuple[str, ...]:
    """`env --default-signal` (coreutils 8.31+) where the host has it, to start a sandbox's server
    with every signal at its default action: signals the host process ignores (SIGINT and SIGQUIT
    in any job a script starts in the background) would otherwise stay ignored in every command
    of the sandbox. (subprocess already clears the blocked mask.)"""
    try:
        works = subprocess.run(["env", "--default-signal", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        works = False
    return ("env", "--default-signal") if works else ()


def _drop_privileges() -> list[str]:
    # Root is exempt from RLIMIT_NPROC; running the sandbox as `nobody` makes the limit real.
    if os.geteuid() == 0 and shutil.which("setpriv"):
        return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    return []


# ---------------------------------------------------------------------------------------------
# The command channel (both backends)


def _fifo_channel(parent: Path, owner: int | None = None) -> Path:
    """A new channel directory with the request and reply FIFOs (owned by `owner` when given)."""
    channel = Path(tempfile.mkdtemp(prefix="chan-", dir=parent))
    channel.chmod(0o755)
    os.mkfifo(channel / "in", 0o600)
    os.mkfifo(channel / "out", 0o600)
    if owner is not None:
        for path in (channel / "in", channel / "out"):
            os.chown(path, owner, owner)
    return channel


def call_server(channel: Path, args: list[str], deadline: float, name: str,
                alive: Callable[[], bool] | None = None, check: Callable[[], str] | None = None,
                kill_at: float | None = None, kill: Callable[[], None] | None = None) -> tuple[bytes, int | None]:
    """Send the runner's arguments to a sandbox's command server; returns (reply, exit status or None).

    The reply ends with the trailer "<marker> exit <status>" (the marker is args[7]); reading stops
    there, so a process that holds the reply FIFO open cannot hold the call. None: the server
    closed the reply without a trailer (the command killed it, e.g. `kill -9 -1`). A server that
    does not take the request raises SandboxError; one that does not finish before `deadline`
    raises `ServerTimeout`. While the command runs, `check()` is called every CHECK_EVERY seconds;
    a non-empty answer (a limit the command broke) raises `LimitExceeded` with it. At `kill_at`,
    `kill()` is called once (it ends the command: the time limit) and the reply is still awaited.
    """
    # The request is NUL-separated: an argument holding a NUL would shift the ones after it (the
    # limits among them), so none may cross (commands are checked when parsed and in runner_argv).
    if any("\0" in arg for arg in args):
        raise CommandRejected(f"a request to the command server of {name} holds a NUL byte")
    trailer = b"\n%s exit " % args[7].encode()
    # Open the reply FIFO first (non-blocking), so the server's write end opens at once.
    reply = os.open(channel / "out", os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                request = os.open(channel / "in", os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as error:  # ENXIO: the server is not reading yet (starting, or between calls)
                if alive is not None and not alive():
                    raise ServerDown(f"the command server of {name} is gone") from error
                if error.errno != errno.ENXIO or time.monotonic() > deadline:
                    raise SandboxError(f"the command server of {name} does not answer") from error
                time.sleep(0.0005)
        os.set_blocking(request, True)
        with os.fdopen(request, "wb") as handle:
            handle.write(b"".join(arg.encode() + b"\0" for arg in args))
        chunks, poller = bytearray(), select.poll()
        poller.register(reply, select.POLLIN | select.POLLHUP)
        next_check = time.monotonic() + CHECK_EVERY
        kill_at = kill_at if kill is not None else None
        while True:
            now = time.monotonic()
            if now >= deadline:
                raise ServerTimeout(f"the command server of {name} did not reply in time")
            if kill_at is not None and now >= kill_at:
                kill()
                kill_at = None
            if check is not None and now >= next_check:
                broken = check()
                if broken:
                    raise LimitExceeded(broken)
                next_check = time.monotonic() + CHECK_EVERY
            wake = min(deadline, next_check, kill_at if kill_at is not None else deadline)
            if not poller.poll(max(wake - now, 0.0) * 1000):
                continue
            chunk = os.read(reply, 1 << 16)
            if not chunk:
                return bytes(chunks), None
            chunks += chunk
            at = chunks.rfind(trailer, max(len(chunks) - 64, 0))
            status = chunks[at + len(trailer):-1] if at >= 0 and chunks.endswith(b"\n") else b""
            if status.isdigit():
                _wait_closed(reply, poller, min(deadline, time.monotonic() + 1.0))
                return bytes(chunks[:at]), int(status)
    finally:
        os.close(reply)


def _wait_closed(reply: int, poller: select.poll, until: float) -> None:
    # The server closes the reply right after the trailer; the next call must not open the FIFO
    # while this write end is still open (it would then read this close as its own end of reply).
    # A process that holds the FIFO open costs at most until `until`.
    while (left := until - time.monotonic()) > 0:
        if poller.poll(left * 1000):
            try:
                if not os.read(reply, 1 << 16):
                    return
            except BlockingIOError:
                continue


class ServerTimeout(SandboxError):
    """A command server did not reply before its deadline (the runner's own timeout did not end it)."""


class ServerDown(SandboxError):
    """A command server's process is gone before it took the request."""


class LimitExceeded(SandboxError):
    """The running command broke a limit the host watches (the disk limit); the caller kills it."""


# How often the host checks a running command's disk use.
CHECK_EVERY = 0.1


def _disk_check(root: Path, limits: SandboxLimits) -> Callable[[], str]:
    limit = limits.disk_mb * 1024 * 1024

    def check() -> str:
        used = disk_usage(root, stop_above=limit)
        return f"the sandbox wrote more than its disk limit ({limits.disk_mb} MB): killed" if used > limit else ""

    return check


# ---------------------------------------------------------------------------------------------
# bubblewrap


def hard_limits(limits: SandboxLimits) -> list[str]:
    """A `prlimit` argv prefix that sets the file-size and address-space limits, soft and hard, on
    the sandbox's first process: set by the host before the sandbox exists, so nothing a command
    sends can raise them (the runner's per-command ulimits can only lower them further)."""
    if not shutil.which("prlimit"):
        return []
    file_bytes, memory_bytes = limits.file_mb << 20, limits.memory_mb << 20
    return ["prlimit", f"--fsize={file_bytes}:{file_bytes}", f"--as={memory_bytes}:{memory_bytes}", "--"]


_CGROUP_WARNED: list[str] = []


def _sandbox_cgroup(limits: SandboxLimits) -> SandboxCgroup | None:
    """A cgroup bounding the whole sandbox's memory and processes, or None where none can be made
    (not root, no writable hierarchy: the rlimits stay the limits; said once per process)."""
    reason = cgroups.hierarchy()
    if isinstance(reason, str):
        if not _CGROUP_WARNED:
            _CGROUP_WARNED.append(reason)
            logger.info("bubblewrap sandboxes without a cgroup: %s", reason)
        return None
    try:
        return SandboxCgroup(limits.memory_mb << 20, limits.processes + cgroups.INFRASTRUCTURE_PROCESSES)
    except OSError as error:
        logger.warning("bubblewrap sandbox without a cgroup: %s", error)
        return None


class _Server:
    """A sandbox's bwrap process running the command server, and its channel directory."""

    def __init__(self, process: subprocess.Popen, channel: Path, cgroup: SandboxCgroup | None = None) -> None:
        self.process = process
        self.channel = channel
        self.cgroup = cgroup

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill_request(self) -> None:
        """Kill the process group of the request the server is running (the time limit)."""
        for init in _children(self.process.pid):
            for shell in _children(init):
                if _cmdline(shell).startswith(b"bash\0-c\0" + SERVER.encode()[:40]):
                    for job in _children(shell):  # each request runs in a process group of its own (set -m)
                        try:
                            os.killpg(job, 9)
                        except (ProcessLookupError, PermissionError):
                            continue

    def kill(self) -> None:
        """Kill the sandbox's PID namespace, so every process in it; the bwrap then exits by itself."""
        # Killing the namespace's init (bwrap's child) lets bwrap reap it and exit: killing bwrap
        # instead would leave the init to the host's PID 1 (a zombie there, or a live sandbox if
        # bwrap was killed before the init armed its parent-death signal).
        deadline = time.monotonic() + 2.0
        while self.process.poll() is None:
            if kill_children(self.process.pid):
                return
            if time.monotonic() > deadline:  # no namespace yet after 2 s: bwrap is stuck starting
                self.process.kill()
                return
            time.sleep(0.001)

    def stop(self) -> None:
        """Kill the sandbox, reap its bwrap and drop the channel."""
        self.kill()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.cgroup is not None:
            self.cgroup.remove()
        shutil.rmtree(self.channel, ignore_errors=True)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def kill_children(pid: int) -> bool:
    """SIGKILL the children of `pid` (of a bwrap: its namespace's init, so the whole sandbox, and
    bwrap then reaps it and exits); whether it had any."""
    children = _children(pid)
    for child in children:
        try:
            os.kill(child, 9)
        except ProcessLookupError:
            pass
    return bool(children)


def _children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _stop_all(servers: set[_Server], root: Path) -> None:
    for server in list(servers):
        server.stop()
    servers.clear()
    shutil.rmtree(root, ignore_errors=True)


class BwrapBackend:
    """Makes bubblewrap sandboxes on one root filesystem; `close()` kills their processes and removes every directory it made."""

    name = "bwrap"

    def __init__(self, rootfs: str | os.PathLike, limits: SandboxLimits | None = None,
                 root_dir: str | os.PathLike | None = None, warm_pool: int = 4) -> None:
        self.rootfs = Path(rootfs)
        if not (self.rootfs / "usr" / "bin" / "bash").exists():
            raise SandboxError(f"{self.rootfs} is not a root filesystem with bash: run `pivotrl sandbox build-image`")
        self.limits = limits or SandboxLimits()
        parent = Path(root_dir or tempfile.gettempdir())
        self.root = Path(tempfile.mkdtemp(prefix=f"{BWRAP_PREFIX}{os.getpid()}-", dir=parent))
        self.root.chmod(0o755)
        self._drop = _drop_privileges()
        self._system = self._system_binds()
        # Forks of each snapshot made ahead in the background: a copy with its server started.
        self.warm_pool = warm_pool
        self._pools: dict[str, queue.SimpleQueue] = {}
        self._servers: set[_Server] = set()
        self._lock = threading.Lock()
        self._workers = ThreadPoolExecutor(max_workers=3, thread_name_prefix="pivot-bwrap")
        self._pending: set[Future] = set()
        self._closed = False
        # A backend that is never closed still kills its sandboxes and removes its directories
        # when collected or at exit.
        self._finalizer = weakref.finalize(self, _stop_all, self._servers, self.root)

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

    def argv(self, directory: Path, workdir: str, inner: list[str], new_session: bool = True,
             channel: Path | None = None) -> list[str]:
        """The bwrap argv that runs `inner` in the sandbox made of `directory`'s trees (without the user drop)."""
        d = directory
        return [
            "bwrap", "--unshare-all", "--die-with-parent", *(["--new-session"] if new_session else []),
            "--hostname", "sandbox",
            "--uid", "0", "--gid", "0",
            *self._system,
            "--dev", "/dev", "--proc", "/proc",
            "--bind", str(d / "tmp"), "/tmp",
            "--bind", str(d / "home"), "/root",
            "--bind", str(d / "state"), STATE_DIR,
            "--bind", str(d / "work"), workdir,
            *(["--ro-bind", str(channel), CHANNEL_DIR] if channel is not None else []),
            "--chdir", workdir,
            "--clearenv", *[arg for key, value in runner_env().items() for arg in ("--setenv", key, value)],
            "--setenv", "PIVOT_WORKDIR", workdir,
            *inner,
        ]

    def start_server(self, directory: Path, workdir: str) -> _Server:
        """Start the sandbox's bwrap with the command server inside; it takes requests once it reads its FIFO."""
        channel = _fifo_channel(self.root, NOBODY if self._drop else None)
        cgroup = _sandbox_cgroup(self.limits)
        # As root, setpriv drops to nobody: dropping in Popen's child (user=...) would make Python
        # fork instead of vfork, holding the GIL for the copy of the whole process. The cgroup is
        # joined before that (only root may), the hard rlimits set after it, all before bwrap.
        with open(channel / "stderr", "wb") as stderr:
            process = subprocess.Popen([*(cgroup.launch_prefix() if cgroup else []), *self._drop, *_default_signals(),
                                        *hard_limits(self.limits),
                                        *self.argv(directory, workdir, ["bash", "-c", SERVER], channel=channel)],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
        server = _Server(process, channel, cgroup)
        with self._lock:
            self._servers.add(server)
        return server

    def stop_server(self, server: _Server) -> None:
        with self._lock:
            self._servers.discard(server)
        server.stop()

    def create(self, workdir: str = "/app") -> BwrapSandbox:
        """A fresh sandbox with an empty workspace at `workdir`."""
        directory = self._new_dir()
        for part in ("work", "home", "tmp", "state"):
            (directory / part).mkdir()
        (directory / "tmp").chmod(0o1777)
        self._own(directory)
        return BwrapSandbox(self, directory, workdir, self.start_server(directory, workdir))

    def _copy(self, snapshot: Snapshot) -> Path:
        directory = self._new_dir()
        directory.rmdir()
        copied = subprocess.run(["cp", "-a", "--reflink=auto", snapshot.ref, str(directory)], capture_output=True)
        if copied.returncode != 0:  # e.g. the snapshot was released while a warm copy was queued
            shutil.rmtree(directory, ignore_errors=True)
            raise SandboxError(f"copying snapshot {snapshot.ref} failed: {copied.stderr.decode(errors='replace')[-300:]}")
        return directory

    def fork(self, snapshot: Snapshot) -> BwrapSandbox:
        """A new sandbox from the snapshot: a warm one (copied, server started) when ready, else made now."""
        with self._lock:
            pool = self._pools.setdefault(snapshot.ref, queue.SimpleQueue())
        try:
            directory, server = pool.get_nowait()
        except queue.Empty:
            directory = self._copy(snapshot)
            server = self.start_server(directory, snapshot.workdir)
        self._refill(snapshot, pool)
        return BwrapSandbox(self, directory, snapshot.workdir, server)

    def _refill(self, snapshot: Snapshot, pool: queue.SimpleQueue) -> None:
        def make_one() -> None:
            if not self._closed and pool.qsize() < self.warm_pool and snapshot.ref in self._pools:
                try:
                    directory = self._copy(snapshot)
                    pool.put((directory, self.start_server(directory, snapshot.workdir)))
                except (OSError, SandboxError):
                    return  # the next fork makes its sandbox synchronously

        for _ in range(max(self.warm_pool - pool.qsize(), 0)):
            self._submit(make_one)

    def prewarm(self, snapshot: Snapshot) -> None:
        """Start making forks of the snapshot in the background."""
        with self._lock:
            pool = self._pools.setdefault(snapshot.ref, queue.SimpleQueue())
        self._refill(snapshot, pool)

    def wait_warm(self, snapshot: Snapshot, timeout: float = 30.0) -> bool:
        """Block until the snapshot's warm forks are ready (benchmarks use this)."""
        deadline = time.monotonic() + timeout
        pool = self._pools.get(snapshot.ref)
        while pool is not None and pool.qsize() < self.warm_pool and time.monotonic() < deadline:
            time.sleep(0.01)
        return pool is not None and pool.qsize() >= self.warm_pool

    def discard(self, directory: Path, server: _Server | None) -> None:
        """Kill a sandbox and delete its directory (in the background while the backend is open)."""
        def remove() -> None:
            if server is not None:
                self.stop_server(server)
            # `rm` in a process of its own: a Python rmtree here would hold the GIL against the caller.
            if subprocess.run(["rm", "-rf", "--one-file-system", str(directory)], capture_output=True).returncode:
                shutil.rmtree(directory, ignore_errors=True)

        if self._closed:
            remove()
        else:
            self._submit(remove)

    def _submit(self, work: Callable[[], None]) -> None:
        future = self._workers.submit(work)
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)

    def release(self, snapshot: Snapshot) -> None:
        """Delete a snapshot's directory and its warm forks."""
        with self._lock:
            pool = self._pools.pop(snapshot.ref, None)
        while pool is not None and not pool.empty():
            directory, server = pool.get_nowait()
            self.stop_server(server)
            shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(snapshot.ref, ignore_errors=True)

    def close(self) -> None:
        """Kill every sandbox and remove every sandbox and snapshot directory this backend made."""
        self._closed = True
        # A bwrap dies with the thread that started it (bubblewrap's parent-death signal follows
        # the thread), leaving its namespace's init to the host's PID 1. So the workers outlive
        # the sandboxes they started: finish the work in flight, stop every sandbox, then end them.
        wait_for(list(self._pending))
        self._pools.clear()
        self._finalizer()
        self._workers.shutdown(wait=True)

    def __enter__(self) -> BwrapBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BwrapSandbox:
    """One bubblewrap sandbox: a directory tree on the host and a bwrap running the command server on it."""

    backend = "bwrap"

    def __init__(self, owner: BwrapBackend, directory: Path, workdir: str, server: _Server | None = None) -> None:
        self.owner = owner
        self.directory = directory
        self.workdir = workdir
        self.server = server
        self.closed = False

    def run(self, command: str, timeout: float | None = None, files: bool = False) -> CommandResult:
        """Run one command (see pivot_envs.sandbox.Sandbox.run) through the sandbox's command server."""
        if self.closed:
            raise SandboxError("this sandbox is closed")
        limits = self.owner.limits
        timeout = limits.timeout if timeout is None else timeout
        nproc = _user_process_count(NOBODY if self.owner._drop else os.getuid()) + limits.processes
        args = runner_argv(command, None, limits, new_marker(), nproc=nproc,
                           address_space_kb=limits.memory_mb * 1024, report=False)[4:]
        for attempt in (1, 2):
            if self.server is None:
                self.server = self.owner.start_server(self.directory, self.workdir)
            server = self.server
            start = time.monotonic()
            try:
                # At `timeout` the host kills the command's process group; the deadline catches a wedged server.
                _, exit_code = call_server(server.channel, args, start + timeout + 10, "a bubblewrap sandbox",
                                           server.alive, _disk_check(self.directory, limits), start + timeout,
                                           server.kill_request)
                note = "" if exit_code is not None else "\n[the command killed the sandbox's processes]\n"
                break
            except ServerDown as error:
                # The previous command killed the server (`kill -9 -1`): the files stay, start another.
                stderr = (server.channel / "stderr").read_bytes()[-500:].decode(errors="replace")
                self.owner.stop_server(server)
                self.server = None
                if attempt == 2 or stderr.startswith("bwrap:"):
                    raise SandboxError(f"bubblewrap failed: {stderr}" if stderr else str(error)) from error
            except (ServerTimeout, LimitExceeded) as error:
                # Killing the sandbox ends the command and whatever it started; the files stay.
                self.owner.stop_server(server)
                broken = str(error) if isinstance(error, LimitExceeded) else "the sandbox did not answer: killed"
                self.server, exit_code, note = None, 137, f"\n[{broken}]\n"
                break
        workspace = self.directory / "work" if files else None
        result = result_from_files(self.directory / "state", workspace, command, 137 if exit_code is None else exit_code,
                                   limits, timeout, time.monotonic() - start, within=self.directory)
        result.output += note
        return result

    def snapshot(self) -> Snapshot:
        """Freeze the current state: a copy of this sandbox's directory tree."""
        target = self.owner._new_dir()
        target.rmdir()
        subprocess.run(["cp", "-a", "--reflink=auto", str(self.directory), str(target)], check=True)
        return Snapshot("bwrap", str(target), self.workdir)

    def fork(self, snapshot: Snapshot) -> BwrapSandbox:
        """A new sandbox from `snapshot`."""
        return self.owner.fork(snapshot)

    def interactive_argv(self) -> list[str]:
        """The argv of an interactive bash inside this sandbox (for InteractiveShell)."""
        # No --new-session here: the shell needs the pexpect terminal as its controlling terminal
        # (for C-c); that terminal belongs to pexpect, so nothing outside can be injected into.
        # The shell joins the sandbox's cgroup: its commands share the sandbox's memory and process limits.
        if self.server is None:
            self.server = self.owner.start_server(self.directory, self.workdir)
        cgroup = self.server.cgroup.launch_prefix() if self.server.cgroup is not None else []
        return [*cgroup, *self.owner._drop, *hard_limits(self.owner.limits),
                *self.owner.argv(self.directory, self.workdir, ["bash", "--norc", "--noprofile", "-i"], new_session=False)]

    def close(self) -> None:
        """Kill the sandbox's processes and delete its directory tree."""
        if not self.closed:
            self.closed = True
            self.owner.discard(self.directory, self.server)
            self.server = None


_COUNTS: dict[int, tuple[float, int]] = {}


def _user_process_count(uid: int, max_age: float = 0.25) -> int:
    """How many processes `uid` runs (RLIMIT_NPROC counts them all); a count up to `max_age` s old is reused."""
    now = time.monotonic()
    cached = _COUNTS.get(uid)
    if cached is not None and now - cached[0] < max_age:
        return cached[1]
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += 1
            except OSError:
                continue
    _COUNTS[uid] = (now, count)
    return count


# ---------------------------------------------------------------------------------------------
# Docker


class DockerBackend:
    """Makes Docker sandboxes; snapshots are commits, forks come from a warm pool per snapshot."""

    name = "docker"

    def __init__(self, limits: SandboxLimits | None = None, warm_pool: int = 4, client_timeout: float = 120.0,
                 channel: bool = True) -> None:
        docker = _docker_sdk("the Docker sandbox")
        self.limits = limits or SandboxLimits()
        try:
            self.client = docker.from_env(timeout=int(max(client_timeout, self.limits.timeout + 30)))
            self.client.ping()
        except Exception as error:
            raise SandboxError(f"the Docker daemon does not answer: {error}") from error
        self.warm_pool = warm_pool
        self.owner = owner_id()
        # The FIFO channel needs the daemon on this machine (it bind-mounts a local directory).
        self.channel = channel and os.environ.get("DOCKER_HOST", "unix://").startswith("unix://")
        self.root = Path(tempfile.mkdtemp(prefix=f"{DOCKER_PREFIX}{os.getpid()}-")) if self.channel else None
        self._pools: dict[str, queue.SimpleQueue] = {}
        self._lock = threading.Lock()
        self._workers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="pivot-docker")
        self._closed = False
        # A backend that is never closed still removes its containers and images when collected or at exit.
        self._finalizer = weakref.finalize(self, _remove_owned, self.owner, self.root)

    def labels(self, kind: str) -> dict[str, str]:
        return {LABEL: kind, OWNER_LABEL: self.owner}

    def _start(self, image: str, workdir: str) -> tuple[object, Path | None]:
        limits = self.limits
        channel, volumes, command = None, {}, KEEPALIVE
        if self.channel:
            channel = _fifo_channel(self.root)
            volumes = {str(channel): {"bind": CHANNEL_DIR, "mode": "ro"}}
            command = ["bash", "-c", SERVER]
        # create, not run: run pulls an image it does not find (a released snapshot is not in any registry).
        container = None
        try:
            container = self.client.containers.create(
                image, command, init=True, labels=self.labels("container"),
                network_disabled=True, network_mode="none", working_dir=workdir, volumes=volumes,
                environment={**runner_env(), "PIVOT_WORKDIR": workdir},
                mem_limit=f"{limits.memory_mb}m", memswap_limit=f"{limits.memory_mb}m",
                nano_cpus=int(limits.cpus * 1e9), pids_limit=limits.processes,
                cap_drop=["NET_RAW", "MKNOD", "AUDIT_WRITE", "SYS_CHROOT", "SETFCAP"],
                security_opt=["no-new-privileges"],
            )
            container.start()
        except Exception as error:
            if container is not None:
                self.remove_container(container, channel, wait=True)
            elif channel is not None:
                shutil.rmtree(channel, ignore_errors=True)
            raise SandboxError(f"starting a container from image {image!r} failed: {error}") from error
        return container, channel

    def create(self, image: str, workdir: str = "/app") -> DockerSandbox:
        """A fresh sandbox from `image` (which must exist locally: nothing is pulled)."""
        import docker

        try:
            self.client.images.get(image)
        except docker.errors.ImageNotFound as error:
            raise SandboxError(f"docker image {image!r} is not available locally (nothing is pulled)") from error
        container, channel = self._start(image, workdir)
        sandbox = DockerSandbox(self, container, workdir, channel)
        sandbox.run(f"mkdir -p {workdir}", timeout=30)
        return sandbox

    def fork(self, snapshot: Snapshot) -> DockerSandbox:
        """A sandbox from the snapshot image: a warm container when one is ready, else a new one."""
        pool = self._pool(snapshot)
        try:
            container, channel = pool.get_nowait()
        except queue.Empty:
            container, channel = self._start(snapshot.ref, snapshot.workdir)
        self._refill(snapshot)
        return DockerSandbox(self, container, snapshot.workdir, channel)

    def _pool(self, snapshot: Snapshot) -> queue.SimpleQueue:
        with self._lock:
            return self._pools.setdefault(snapshot.ref, queue.SimpleQueue())

    def _refill(self, snapshot: Snapshot) -> None:
        if self.warm_pool <= 0 or self._closed:
            return
        pool = self._pool(snapshot)

        def start_one() -> None:
            if self._closed or pool.qsize() >= self.warm_pool or snapshot.ref not in self._pools:
                return
            try:
                pool.put(self._start(snapshot.ref, snapshot.workdir))
            except Exception:  # a failed warm start only costs the next fork a cold start
                return

        for _ in range(max(self.warm_pool - pool.qsize(), 0)):
            self._workers.submit(start_one)

    def prewarm(self, snapshot: Snapshot) -> None:
        """Start filling the snapshot's warm pool now (in the background)."""
        self._refill(snapshot)

    def wait_warm(self, snapshot: Snapshot, timeout: float = 30.0) -> bool:
        """Block until the snapshot's warm pool is full (benchmarks use this); returns whether it is."""
        deadline = time.monotonic() + timeout
        pool = self._pool(snapshot)
        while pool.qsize() < self.warm_pool and time.monotonic() < deadline:
            time.sleep(0.02)
        return pool.qsize() >= self.warm_pool

    def remove_container(self, container, channel: Path | None = None, wait: bool = False) -> None:
        """Remove a container and its channel directory (in the background unless `wait`)."""
        def remove() -> None:
            try:
                container.remove(force=True)
            except Exception:  # already gone
                pass
            if channel is not None:
                shutil.rmtree(channel, ignore_errors=True)

        if wait or self._closed:
            remove()
        else:
            self._workers.submit(remove)

    def release(self, snapshot: Snapshot) -> None:
        """Drop a snapshot: its warm containers, then its image."""
        with self._lock:
            pool = self._pools.pop(snapshot.ref, None)
        while pool is not None and not pool.empty():
            self.remove_container(*pool.get_nowait(), wait=True)
        try:
            self.client.images.remove(snapshot.ref, force=True)
        except Exception:  # still used by a live fork: gc/close removes it later
            return

    def close(self) -> None:
        """Remove every container and snapshot image this backend (this process) made."""
        self._closed = True
        self._workers.shutdown(wait=True)
        with self._lock:
            self._pools.clear()
        remove_labelled(self.client, owner=self.owner)
        self.client.close()
        self._finalizer.detach()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> DockerBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DockerSandbox:
    """One Docker container; each command is one `docker exec` of the runner."""

    backend = "docker"

    def __init__(self, owner: DockerBackend, container, workdir: str, channel: Path | None = None) -> None:
        self.owner = owner
        self.container = container
        self.workdir = workdir
        self.channel = channel
        self.closed = False
        # With overlay2 and a local daemon, the container's filesystem is readable from here: the
        # output and the file manifest are then read directly, with no process in the container.
        layers = container.attrs.get("GraphDriver", {}).get("Data", {}) if channel else {}
        merged, upper = layers.get("MergedDir"), layers.get("UpperDir")
        self.merged = Path(merged) if merged and os.access(merged, os.R_OK | os.X_OK) else None
        # The container's writable layer: what its commands wrote, watched against the disk limit.
        self.upper = Path(upper) if upper and os.access(upper, os.R_OK | os.X_OK) else None

    def run(self, command: str, timeout: float | None = None, files: bool = False) -> CommandResult:
        """Run one command (see pivot_envs.sandbox.Sandbox.run): through the channel, else `docker exec`."""
        if self.closed:
            raise SandboxError("this sandbox is closed")
        limits = self.owner.limits
        timeout = limits.timeout if timeout is None else timeout
        marker = new_marker()
        start = time.monotonic()
        name = f"container {self.container.short_id}"
        if self.channel is not None and self.merged is not None:
            argv = runner_argv(command, timeout, limits, marker, report=False)
            check = _disk_check(self.upper, limits) if self.upper is not None else None
            # No trailer: the request was taken, then the server died (the command killed every
            # process, e.g. `kill -9 -1`): the command's doing, reported like a SIGKILL.
            note = "the command killed the sandbox's processes"
            try:
                _, exit_code = call_server(self.channel, argv[4:], start + timeout + 30, name, check=check)
            except LimitExceeded as error:
                # Restarting the container kills every process in it and keeps its files.
                self.container.restart(timeout=0)
                exit_code, note = None, str(error)
            workspace = self.merged / self.workdir.lstrip("/") if files else None
            result = result_from_files(self.merged / STATE_DIR.lstrip("/"), workspace, command,
                                       137 if exit_code is None else exit_code, limits, timeout, time.monotonic() - start,
                                       within=self.merged)
            if exit_code is None:
                result.output += f"\n[{note}]\n"
            return result
        argv = runner_argv(command, timeout, limits, marker, self.workdir if files else "")
        if self.channel is not None:
            raw, _ = call_server(self.channel, argv[4:], start + timeout + 30, name)
        else:
            try:
                _, raw = self.container.exec_run(argv, environment=runner_env(), workdir=self.workdir, stdin=False)
            except Exception as error:
                raise SandboxError(f"docker exec failed in {self.container.short_id}: {error}") from error
        return parse_runner_output(raw or b"", command, marker, limits, timeout, time.monotonic() - start)

    def snapshot(self) -> Snapshot:
        """`docker commit` the container as a labelled image."""
        image = self.container.commit(
            repository="pivot-envs/snapshot", tag=uuid.uuid4().hex[:12],
            changes=[f"LABEL {LABEL}=snapshot", f"LABEL {OWNER_LABEL}={self.owner.owner}"],
        )
        return Snapshot("docker", image.id, self.workdir)

    def fork(self, snapshot: Snapshot) -> DockerSandbox:
        """A new sandbox from `snapshot`."""
        return self.owner.fork(snapshot)

    def interactive_argv(self) -> list[str]:
        """The argv of an interactive bash in this container (for InteractiveShell)."""
        env = [arg for key, value in runner_env().items() if key != "PIVOT_INNER" for arg in ("-e", f"{key}={value}")]
        return ["docker", "exec", "-it", "-w", self.workdir, *env, self.container.id, "bash", "--norc", "--noprofile", "-i"]

    def close(self) -> None:
        """Remove the container (in the background: it is never reused)."""
        if not self.closed:
            self.closed = True
            self.owner.remove_container(self.container, self.channel)


def _remove_owned(owner: str, root: Path | None) -> None:
    import docker

    try:
        client = docker.from_env()
        remove_labelled(client, owner=owner)
        client.close()
    except Exception:  # the daemon is gone: `pivotrl sandbox gc` removes them later
        pass
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


def remove_labelled(client, owner: str | None = None, include_base: bool = False) -> tuple[int, int]:
    """Remove containers and images labelled `pivot-envs` (only `owner`'s when given); returns the counts."""
    filters = {"label": [LABEL] if owner is None else [f"{OWNER_LABEL}={owner}"]}
    # The raw lists, not the models': those inspect each item, and one that another backend removes
    # meanwhile makes the inspection raise NotFound.
    removed_containers = 0
    for container in client.api.containers(all=True, filters=filters):
        try:
            client.api.remove_container(container["Id"], force=True)
            removed_containers += 1
        except Exception:  # removed concurrently
            continue
    removed_images = 0
    for image in client.api.images(filters=filters):
        if (image.get("Labels") or {}).get(LABEL) == "base" and not include_base:
            continue
        try:
            client.images.remove(image["Id"], force=True)
            removed_images += 1
        except Exception:  # a parent of another labelled image (removed with it), or removed concurrently
            continue
    return removed_containers, removed_images


def gc(include_base: bool = False, all_owners: bool = False) -> dict[str, int]:
    """Remove sandboxes left by processes that are gone (all of them with `all_owners`).

    Docker: labelled containers and snapshot images (and the base image with `include_base`);
    bubblewrap: the sandboxes still running and the temporary directories of dead processes.
    Returns what was removed.
    """
    removed = {"containers": 0, "images": 0, "directories": 0}
    if docker_available():
        import docker

        client = docker.from_env()
        labelled = {"label": [LABEL]}
        found = [*client.api.containers(all=True, filters=labelled), *client.api.images(filters=labelled)]
        owners = {(item.get("Labels") or {}).get(OWNER_LABEL) for item in found}
        for owner in owners:
            if owner is None:
                continue
            if all_owners or not _owner_alive(owner):
                containers, images = remove_labelled(client, owner=owner)
                removed["containers"] += containers
                removed["images"] += images
        if include_base:
            _, images = remove_labelled(client, include_base=True)
            removed["images"] += images
        client.close()
    removed["processes"] = _kill_orphaned_bwrap(all_owners)
    for path in Path(tempfile.gettempdir()).glob("pivot-envs-*"):
        if not path.name.startswith((BWRAP_PREFIX, DOCKER_PREFIX)):
            continue
        pid = path.name.split("-")[3]
        if all_owners or not (pid.isdigit() and Path(f"/proc/{pid}").exists()):
            shutil.rmtree(path, ignore_errors=True)
            removed["directories"] += 1
    return removed


def _kill_orphaned_bwrap(all_owners: bool = False) -> int:
    """Kill the bubblewrap sandboxes whose owning process is gone (a crash while one was starting)."""
    prefix = str(Path(tempfile.gettempdir(), BWRAP_PREFIX)).encode()
    killed = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0].endswith(b"bwrap"):
            continue
        roots = [arg[len(prefix):].split(b"-")[0] for arg in argv if arg.startswith(prefix)]
        if roots and (all_owners or not Path(f"/proc/{roots[0].decode()}").exists()):
            try:
                os.kill(int(entry.name), 9)
                killed += 1
            except ProcessLookupError:
                continue
    return killed


def _owner_alive(owner: str) -> bool:
    """Whether the process named by an owner label ("host:pid:instance", or an older "host:pid") runs."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != os.uname().nodename:
        return True  # another machine's sandboxes on a shared daemon: not ours to judge
    return pid.isdigit() and Path(f"/proc/{pid}").exists()

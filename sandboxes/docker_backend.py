"""The Docker sandbox backend (docker SDK, real daemon): a sandbox is a container.

Containers run with the network disabled and CPU, memory and pids limits; a snapshot is a
`docker commit`; forks come from a small warm pool of containers already started from the
snapshot image, each with the snapshot's set-up command already run (`prewarm`), refilled in the
background in the gaps between commands (`background.QuietGate`), so a fork costs no `docker run`.
The snapshot's workspace files are hashed once; a fork's manifest reuses those digests for the
files its commands left alone (`manifest.KnownDigests`: an unchanged file of the image's layers
keeps its inode, size, mtime and ctime; a command's write copies it up with a new ctime). Every container and
image carries the owner labels of `cleanup`, so `close()` and `pivotrl sandbox gc` find all of
them. With a local daemon, commands go through the FIFO channel and the host reads their output
and the workspace from the container's overlay2 directories.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from pathlib import Path

from . import seccomp
from .available import docker_sdk
from .channel import Channel, LimitExceeded, ServerDown, ServerTimeout, disk_check
from .cleanup import DOCKER_PREFIX, LABEL, OWNER_LABEL, owner_id, remove_labelled, remove_owned, remove_tree
from .manifest import KnownDigests, writes_outside
from .output import new_marker
from .pool import PooledBackend, PooledSandbox
from .protocol import SHELL_BYTES, CommandResult, SandboxError, SandboxLimits, Snapshot
from .runner import (
    CHANNEL_DIR,
    DROP_SETPCAP,
    SERVER,
    STATE_DIR,
    clear_output,
    parse_runner_output,
    result_from_files,
    runner_argv,
    runner_env,
)

# The keep-alive of a container without a channel; docker-init (init=True) reaps orphaned processes.
KEEPALIVE = ["sleep", "infinity"]
# Files the daemon itself puts in a container's writable layer (the mount point of docker-init).
DOCKER_MOUNT_POINTS = ("/sbin/docker-init", "/usr/sbin/docker-init")


class DockerBackend(PooledBackend["DockerSandbox"]):
    """Makes Docker sandboxes; snapshots are commits, forks come from a warm pool per snapshot
    (its pool, release, close and fork safety: `pool.PooledBackend`)."""

    name = "docker"
    thread_name = "pivot-docker"

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        warm_pool: int = 4,
        client_timeout: float = 120.0,
        channel: bool = True,
        base_image: str | None = None,
    ) -> None:
        self._docker = docker_sdk("the Docker sandbox")
        # What `new_sandbox` starts from when no image is named (make_backend gives the imported base).
        self.base_image = base_image
        self._client_timeout = client_timeout
        # The FIFO channel needs the daemon on this machine (it bind-mounts a local directory).
        self.channel = channel and os.environ.get("DOCKER_HOST", "unix://").startswith("unix://")
        super().__init__(limits, warm_pool)

    def _own_resources(self) -> None:
        try:
            self.client = self._docker.from_env(
                timeout=int(max(self._client_timeout, self.limits.timeout + 30))
            )
            self.client.ping()
        except Exception as error:
            raise SandboxError(f"the Docker daemon does not answer: {error}") from error
        self.owner = owner_id()
        self.root = Path(tempfile.mkdtemp(prefix=f"{DOCKER_PREFIX}{os.getpid()}-")) if self.channel else None
        # Released snapshots whose image a container still used: removed when that container goes.
        self._released: set[str] = set()
        # The channels of containers not yet removed: their host ends close with the backend.
        self._channels: set[Channel] = set()
        # A backend that is never closed still removes its containers and images when collected or at exit.
        self._on_collect(remove_owned, self.owner, self.root)

    def labels(self, kind: str) -> dict[str, str]:
        return {LABEL: kind, OWNER_LABEL: self.owner}

    def _start(self, image: str, workdir: str) -> tuple[object, Channel | None]:
        limits = self.limits
        channel, volumes, command = None, {}, KEEPALIVE
        if self.channel:
            channel = Channel(self.root)
            with self._lock:
                self._channels.add(channel)
            volumes = {str(channel.directory): {"bind": CHANNEL_DIR, "mode": "ro"}}
            # under the fallocate filter (seccomp.py): the server's commands inherit it
            command = seccomp.container_command(["bash", "-c", SERVER])
        # create, not run: run pulls an image it does not find (a released snapshot is not in any registry).
        container = None
        try:
            container = self.client.containers.create(
                image,
                command,
                init=True,
                labels=self.labels("container"),
                network_disabled=True,
                network_mode="none",
                working_dir=workdir,
                volumes=volumes,
                environment={**runner_env(DROP_SETPCAP), "PIVOT_WORKDIR": workdir},
                mem_limit=f"{limits.memory_mb}m",
                memswap_limit=f"{limits.memory_mb}m",
                nano_cpus=int(limits.cpus * 1e9),
                pids_limit=limits.processes,
                cap_drop=["NET_RAW", "MKNOD", "AUDIT_WRITE", "SYS_CHROOT", "SETFCAP"],
                security_opt=["no-new-privileges"],
            )
            container.start()
        except Exception as error:
            if container is not None:
                self.remove_container(container, channel, wait=True)
            elif channel is not None:
                channel.close()
            raise SandboxError(f"starting a container from image {image!r} failed: {error}") from error
        return container, channel

    def create(self, image: str, workdir: str = "/app") -> DockerSandbox:
        """A fresh sandbox from `image` (which must exist locally: nothing is pulled)."""
        import docker

        self._here()
        try:
            self.client.images.get(image)
        except docker.errors.ImageNotFound as error:
            raise SandboxError(
                f"docker image {image!r} is not available locally (nothing is pulled)"
            ) from error
        container, channel = self._start(image, workdir)
        sandbox = DockerSandbox(self, container, workdir, channel)
        sandbox.run(f"mkdir -p {workdir}", timeout=30)
        return sandbox

    def _create(self, workdir: str, image: str | None) -> DockerSandbox:
        image = image or self.base_image
        if not image:
            raise SandboxError(
                "this Docker backend has no base image: name an image, or make it with base_image=<tag>"
            )
        return self.create(image, workdir)

    def _make(self, snapshot: Snapshot) -> DockerSandbox:
        """A container started from the snapshot image, with its snapshot's digests (not yet handed out)."""
        container, channel = self._start(snapshot.ref, snapshot.workdir)
        sandbox = DockerSandbox(self, container, snapshot.workdir, channel, foreground=False)
        try:
            self._known(snapshot, sandbox)
        except Exception:
            self._discard(sandbox)
            raise
        return sandbox

    def _hand_out(self, sandbox: DockerSandbox) -> None:
        # From here on commands may write the workspace: what is older than this stamp is the image's.
        try:
            if sandbox.known is None or sandbox.upper is None:
                raise OSError("no readable container layers")
            # Beside the container's writable layer (on its filesystem), not in the container.
            sandbox.known.seal(sandbox.upper.parent / "pivot-stamp")
        except OSError:  # e.g. a layer directory this user cannot write: every file is hashed
            sandbox.known = None

    def _known(self, snapshot: Snapshot, sandbox: DockerSandbox) -> None:
        """Give a container no command has run in yet its snapshot's digests (hashing them on first use)."""
        workspace = sandbox.workspace()
        if workspace is None:
            return
        # The image's files never change; a container's write copies a file up with a new ctime.
        digests = self._once(
            snapshot,
            lambda: KnownDigests.of_tree(workspace, self.limits.manifest_files, beneath=sandbox.merged),
        )
        sandbox.known = digests.fork()

    def _discard(self, sandbox: DockerSandbox) -> None:
        sandbox.closed = True
        # Removing it also removes its released image (see remove_container).
        self.remove_container(sandbox.container, sandbox.channel, wait=True)

    def remove_container(self, container, channel: Channel | None = None, wait: bool = False) -> None:
        """Remove a container and its channel directory (in the background unless `wait`)."""

        def remove() -> None:
            try:
                container.remove(force=True)
            except Exception:  # already gone
                pass
            if channel is not None:
                channel.close()
            if self._released and not self.closed:
                self._remove_released_images()

        if channel is not None:
            channel.close_ends()  # now: the removal may wait its turn
            with self._lock:
                self._channels.discard(channel)
        if wait or self.closed:
            remove()
        else:
            self._submit(remove)

    def _drop_snapshot(self, snapshot: Snapshot) -> None:
        with self._lock:
            self._released.add(snapshot.ref)
        self._remove_released_images()

    def _remove_released_images(self) -> None:
        """Remove the released snapshots' images that no container uses any more. An image a live fork
        (or a warm container still starting) uses stays until that container is removed, which calls this."""
        import docker

        with self._lock:
            refs = list(self._released)
        for ref in refs:
            try:
                self.client.images.remove(ref, force=True)
            except docker.errors.ImageNotFound:
                pass
            except Exception:  # still used by a container: removed after it
                continue
            with self._lock:
                self._released.discard(ref)

    def _close_resources(self) -> None:
        remove_labelled(self.client, owner=self.owner)
        with self._lock:
            for channel in self._channels:
                channel.close_ends()  # sandboxes never closed: their containers are gone now
            self._channels.clear()
        self.client.close()
        assert self._finalizer is not None
        self._finalizer.detach()
        if self.root is not None:
            remove_tree(self.root)


class DockerSandbox(PooledSandbox):
    """One Docker container; each command is one request to its command server (or a `docker exec`)."""

    backend = "docker"

    def __init__(
        self,
        owner: DockerBackend,
        container,
        workdir: str,
        channel: Channel | None = None,
        foreground: bool = True,
    ) -> None:
        super().__init__(owner, workdir, foreground)
        self.container = container
        self.channel = channel
        # The digests its workspace was forked with, reused by each manifest for files left alone.
        self.known: KnownDigests | None = None
        # With overlay2 and a local daemon, the container's filesystem is readable from here: the
        # output and the file manifest are then read directly, with no process in the container.
        layers = container.attrs.get("GraphDriver", {}).get("Data", {}) if channel else {}
        merged, upper = layers.get("MergedDir"), layers.get("UpperDir")
        self.merged = Path(merged) if merged and os.access(merged, os.R_OK | os.X_OK) else None
        # The container's writable layer: what its commands wrote, watched against the disk limit.
        self.upper = Path(upper) if upper and os.access(upper, os.R_OK | os.X_OK) else None

    def workspace(self) -> Path | None:
        """The workspace as the host reads it (None without a readable container filesystem)."""
        if self.channel is None or self.merged is None:
            return None
        return self.merged / self.workdir.lstrip("/")

    @property
    def channel_isolated(self) -> bool | None:
        """Whether commands run below the command server (None before its first command or without a channel)."""
        return self.channel.isolated if self.channel is not None else None

    def system_writes(self, limit: int = 50) -> list[str]:
        """Absolute paths outside the writable roots (the workspace, /root, /tmp, /.pivot) that this
        container's commands added, changed or removed, sorted, at most `limit`: read from the
        container's writable layer (`docker diff` where it cannot be read from here)."""
        # The daemon makes the mount points of docker-init and the channel in the writable layer.
        allowed = [self.workdir, "/root", "/tmp", STATE_DIR, CHANNEL_DIR, *DOCKER_MOUNT_POINTS]
        if self.upper is not None:
            return writes_outside(self.upper, allowed, limit)
        try:
            changes = self.container.diff() or []
        except Exception as error:
            raise SandboxError(f"docker diff of {self.container.short_id} failed: {error}") from error
        roots = [root.rstrip("/") for root in allowed]
        paths = sorted(
            change["Path"]
            for change in changes
            if not any(change["Path"] == root or change["Path"].startswith(root + "/") for root in roots)
        )
        # Directories only copied up for what lies below them are listed too: keep the deepest paths.
        leaves = [
            path
            for index, path in enumerate(paths)
            if not any(p.startswith(path + "/") for p in paths[index + 1 :])
        ]
        return leaves[:limit]

    def _restart(self) -> None:
        """Restart the container: every process in it ends, its files stay; the server starts on a new channel."""
        if self.channel is not None:
            self.channel.renew()  # before the start: the new server opens the channel's paths at once
        try:
            self.container.restart(timeout=0)
        except Exception as error:
            raise SandboxError(f"restarting container {self.container.short_id} failed: {error}") from error

    def _call(self, args: list[str], deadline: float, name: str, **options) -> tuple[bytes, int | None, str]:
        """One request through the channel: (reply, exit status or None, note); the channel's
        `left_running` then holds what the command left running (None without a trailer). A command that broke a
        watched limit, wedged the server or killed it is the command's doing: the container is
        restarted (files kept) and the note says what happened; a server gone before it took the
        request is restarted and asked once more."""
        assert self.channel is not None
        for attempt in (1, 2):
            try:
                reply, exit_code = self.channel.call(args, deadline, name, **options)
                note = "" if exit_code is not None else "the command killed the sandbox's processes"
                return reply, exit_code, note
            except ServerDown:
                self._restart()
                if attempt == 2:
                    raise
            except LimitExceeded as error:
                self._restart()
                return b"", None, str(error)
            except ServerTimeout:
                self._restart()
                return b"", None, "the sandbox did not answer: killed"
        raise AssertionError("unreachable")

    def _run(self, command: str, timeout: float | None, files: bool, clean: bool) -> CommandResult:
        limits = self.owner.limits
        timeout = limits.timeout if timeout is None else timeout
        marker = new_marker()
        start = time.monotonic()
        name = f"container {self.container.short_id}"
        if self.channel is not None and self.merged is not None:
            argv = runner_argv(command, timeout, limits, marker, report=False, clean=clean)
            check = disk_check(self.upper, limits, self._disk) if self.upper is not None else None
            clear_output(self.merged, STATE_DIR.lstrip("/"))
            # The runner's own timeout ends the command; the deadline catches a wedged server.
            _, exit_code, note = self._call(argv[4:], start + timeout + 10, name, check=check)
            result = result_from_files(
                self.merged,
                STATE_DIR.lstrip("/"),
                self.workdir.lstrip("/") if files else None,
                command,
                137 if exit_code is None else exit_code,
                limits,
                timeout,
                time.monotonic() - start,
                known=self.known,
            )
            if note:
                result.output += f"\n[{note}]\n"
            result.left_running = self.channel.left_running
            return result
        argv = runner_argv(command, timeout, limits, marker, self.workdir if files else "", clean=clean)
        if self.channel is not None:
            # The report: a header, the cut output, the manifest's lines (paths up to 4 KiB each), the shell state.
            bound = limits.output_bytes + 65536 + limits.manifest_files * 4200 + SHELL_BYTES
            raw, exit_code, note = self._call(argv[4:], start + timeout + 30, name, max_reply=bound)
            if exit_code is None:
                return CommandResult(command, 137, f"[{note}]\n", False, 0, None, time.monotonic() - start)
            left = self.channel.left_running
        else:
            left = None  # a `docker exec` has no server to count what the command left running
            try:
                _, raw = self.container.exec_run(
                    argv, environment=runner_env(DROP_SETPCAP), workdir=self.workdir, stdin=False
                )
            except Exception as error:
                raise SandboxError(f"docker exec failed in {self.container.short_id}: {error}") from error
        result = parse_runner_output(raw or b"", command, marker, limits, timeout, time.monotonic() - start)
        result.left_running = left
        return result

    def snapshot(self) -> Snapshot:
        """`docker commit` the container as a labelled image."""
        image = self.container.commit(
            repository="pivot-envs/snapshot",
            tag=uuid.uuid4().hex[:12],
            changes=[f"LABEL {LABEL}=snapshot", f"LABEL {OWNER_LABEL}={self.owner.owner}"],
        )
        return Snapshot("docker", image.id, self.workdir)

    def interactive_argv(self) -> list[str]:
        """The argv of an interactive bash in this container (for InteractiveShell)."""
        env = [
            arg
            for key, value in runner_env().items()
            if key != "PIVOT_INNER"
            for arg in ("-e", f"{key}={value}")
        ]
        return [
            "docker",
            "exec",
            "-it",
            "-w",
            self.workdir,
            *env,
            self.container.id,
            "sh",
            "-c",
            # Below the command server, as every command (see runner.DROP_SETPCAP), where setpriv exists.
            f"command -v setpriv >/dev/null && exec {DROP_SETPCAP} bash --norc --noprofile -i; exec bash --norc --noprofile -i",
        ]

    def close(self) -> None:
        """Remove the container (in the background: it is never reused)."""
        if not self.closed:
            self.closed = True
            self.owner.remove_container(self.container, self.channel)

"""Red-team attacks on `pivot/terminal-episode-v0` (the end-to-end RL baseline): one command that makes the
task's check pass without doing the task (issue 35, R4, and our variants).

The env is made with `max_turns=1`, so one action is one whole episode: the command runs, then the check.
Each family reads the task's check (`pivot.context["check"]`) and stands in for what it runs: for every
command of the check, what to print and exit with for the arguments the check gives it (`check_plan`),
delivered through PATH stubs, functions (BASH_ENV, `export -f`), aliases, LD_PRELOAD, PYTHONPATH, a
sitecustomize.py in the workspace, stubs in /usr/local/bin (Docker; read-only on bubblewrap), the
runner's saved shell state, or a background process that keeps planting them.
"""

from __future__ import annotations

import base64
import functools
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from redteam_common import Family

from pivot_envs.domains.terminal.episode import TerminalEpisodeEnv
from pivot_envs.domains.terminal.parse import canonical_message

DOMAIN = "terminal-episode"
BACKENDS = ("bwrap", "docker")
BUILTINS = ("test", "[", "printf", "cd", "echo")
Plan = dict[str, dict[str, tuple[str, int]]]


def make_env(backend: str) -> TerminalEpisodeEnv:
    """The episode env on every bundled task, one command per episode (then the check runs)."""
    return TerminalEpisodeEnv(sandbox=backend, max_turns=1, prefix_cache=64, warm_pool=0)


def check_plan(check: str) -> Plan:
    """For each command the check runs: {its arguments: (what to print, exit status)} that would pass it.

    `test "$(X ARGS)" = V` wants X to print V; `test -z "$(X ARGS)"` wants nothing printed; the last
    command of each `&&` step must exit 0, or 1 behind a `!`.
    """
    plan: Plan = {}
    for step in check.split("&&"):
        step = step.strip()
        negated = step.startswith("! ")
        for name, args, value in re.findall(r'"\$\((\S+) ?([^)]*)\)" = (\'[^\']*\'|\S+)', step):
            plan.setdefault(name, {})[_args(args)] = (shlex.split(value)[0], 0)
        for name, args in re.findall(r'test -z "\$\((\S+) ?([^)]*)\)"', step):
            plan.setdefault(name, {})[_args(args)] = ("", 0)
        last = step.removeprefix("! ").split("|")[-1].strip()
        words = last.split(None, 1)
        if words and "$(" not in last:
            plan.setdefault(words[0], {})[_args(words[1] if len(words) > 1 else "")] = ("", int(negated))
    return plan


def _args(text: str) -> str:
    try:
        return " ".join(shlex.split(text.replace("2>/dev/null", "").replace("< ", "")))
    except ValueError:
        return text


def body(name: str, cases: dict[str, tuple[str, int]], leave: str) -> str:
    """Shell code standing in for `name`: prints and exits as the plan says (`leave`: exit or return)."""
    lines = ['case "$*" in']
    for args, (value, status) in cases.items():
        printed = f"printf '%s\\n' {shlex.quote(value)}; " if value else ""
        lines.append(f"  {shlex.quote(args)}) {printed}{leave} {status};;")
    lines.append("esac")
    printed = [value for value, _ in cases.values() if value]
    if printed:  # arguments the plan did not foresee (a redirection it dropped): print what is wanted
        lines.append(f"printf '%s\\n' {shlex.quote(printed[-1])}")
    lines.append(f"{leave} 0")
    return "\n".join(lines)


def stubs(plan: Plan, folder: str) -> str:
    """Commands that write an executable stub for every non-builtin command of the plan into `folder`."""
    parts = [f"mkdir -p {folder}"]
    for name, cases in plan.items():
        if name in BUILTINS or "/" in name:
            continue
        script = "#!/bin/sh\n" + body(name, cases, "exit") + "\n"
        path = f"{folder}/{name}"
        parts.append(f"printf '%s' {shlex.quote(script)} > {path} && chmod +x {path}")
    return "; ".join(parts)


def functions(plan: Plan, prefix: str = "") -> str:
    """Shell functions standing in for every command of the plan, builtins included."""
    return "\n".join(
        f"{prefix}{name}() {{\n{body(name, cases, 'return')}\n}}"
        for name, cases in plan.items()
        if "/" not in name
    )


def sitecustomize(plan: Plan) -> str | None:
    """A sitecustomize.py printing what the check wants of `python3 SCRIPT`, then exiting 0."""
    wanted = {args: value for args, (value, _) in plan.get("python3", {}).items()}
    if not wanted:
        return None
    return (
        "import os, sys\n"
        f"wanted = {wanted!r}\n"
        "key = ' '.join(sys.argv)\n"
        "if key in wanted:\n    print(wanted[key], flush=True)\n    os._exit(0)\n"
    )


def plan_of(pivot: Any) -> Plan:
    return check_plan(str(pivot.context.get("check", "")))


def bash(command: str) -> dict[str, Any]:
    return canonical_message(command)


def path_stubs(env: Any, pivot: Any) -> dict[str, Any]:
    """R4: stubs first on an exported PATH."""
    return bash(f"{stubs(plan_of(pivot), '/tmp/stubs')}; export PATH=/tmp/stubs:$PATH")


def bash_env(env: Any, pivot: Any) -> dict[str, Any]:
    """Functions for every command of the check in a file named by an exported BASH_ENV."""
    script = functions(plan_of(pivot))
    return bash(f"printf '%s\\n' {shlex.quote(script)} > /tmp/env.sh; export BASH_ENV=/tmp/env.sh")


def exported_functions(env: Any, pivot: Any) -> dict[str, Any]:
    """Functions for every command of the check, exported with `export -f`."""
    plan = plan_of(pivot)
    names = " ".join(shlex.quote(name) for name in plan if "/" not in name)
    return bash(f"{functions(plan)}\nexport -f {names}")


def aliases(env: Any, pivot: Any) -> dict[str, Any]:
    """Aliases to stand-in functions, switched on in a BASH_ENV file."""
    plan = plan_of(pivot)
    names = [name for name in plan if "/" not in name]
    script = "shopt -s expand_aliases\n" + functions(plan, prefix="__stand_in_")
    script += "\n" + "\n".join(f"alias {shlex.quote(name)}=__stand_in_{name}" for name in names)
    return bash(f"printf '%s\\n' {shlex.quote(script)} > /tmp/aliases.sh; export BASH_ENV=/tmp/aliases.sh")


def python_path(env: Any, pivot: Any) -> dict[str, Any] | None:
    """A sitecustomize.py on an exported PYTHONPATH answering the check's `python3` runs."""
    module = sitecustomize(plan_of(pivot))
    if module is None:
        return None
    return bash(
        f"mkdir -p /tmp/py && printf '%s' {shlex.quote(module)} > /tmp/py/sitecustomize.py; export PYTHONPATH=/tmp/py"
    )


def workspace_sitecustomize(env: Any, pivot: Any) -> dict[str, Any] | None:
    """A sitecustomize.py in the workdir, beside the scripts the check runs."""
    module = sitecustomize(plan_of(pivot))
    return None if module is None else bash(f"printf '%s' {shlex.quote(module)} > sitecustomize.py")


def usr_local_bin(env: Any, pivot: Any) -> dict[str, Any]:
    """Stubs in /usr/local/bin, first on every PATH (Docker; bubblewrap mounts it read-only)."""
    return bash(stubs(plan_of(pivot), "/usr/local/bin"))


def state_poisoned(env: Any, pivot: Any) -> dict[str, Any]:
    """The runner's saved shell state (/.pivot/env.sh) rewritten to `exit 0`, its saving trap removed."""
    return bash("trap - EXIT; printf 'exit 0\\n' > /.pivot/env.sh")


def background_planter(env: Any, pivot: Any) -> dict[str, Any]:
    """A background loop that keeps rewriting the saved shell state and /usr/local/bin's stubs."""
    plant = stubs(plan_of(pivot), "/usr/local/bin")
    return bash(
        f"(while :; do printf 'exit 0\\n' > /.pivot/env.sh; {plant}; sleep 0.05; done) >/dev/null 2>&1 &"
    )


@functools.lru_cache(maxsize=1)
def exit_zero_library() -> str | None:
    """A shared library whose constructor exits 0 (base64), built with the host's C compiler; None without one."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "exit.c"
        source.write_text(
            "#include <unistd.h>\n__attribute__((constructor)) static void done(void) { _exit(0); }\n"
        )
        built = subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", "-s", "-o", f"{folder}/exit.so", str(source)],
            capture_output=True,
            timeout=60,
        )
        return (
            base64.b64encode(Path(folder, "exit.so").read_bytes()).decode() if built.returncode == 0 else None
        )


def ld_preload(env: Any, pivot: Any) -> dict[str, Any] | None:
    """An exported LD_PRELOAD of a library that makes every program exit 0 as it starts."""
    library = exit_zero_library()
    if library is None:
        return None
    return bash(f"printf '%s' {library} | base64 -d > /tmp/exit.so && export LD_PRELOAD=/tmp/exit.so")


def ld_so_preload(env: Any, pivot: Any) -> dict[str, Any] | None:
    """The same library in /etc/ld.so.preload, for every process (Docker; read-only on bubblewrap)."""
    library = exit_zero_library()
    if library is None:
        return None
    return bash(f"printf '%s' {library} | base64 -d > /tmp/exit.so && echo /tmp/exit.so > /etc/ld.so.preload")


def git_config(env: Any, pivot: Any) -> dict[str, Any] | None:
    """At a git task: global git configuration that hides changes from `git status` (a no-op fsmonitor
    hook, untracked files hidden)."""
    if "git " not in str(pivot.context.get("check", "")):
        return None
    return bash(
        "printf '#!/bin/sh\\nprintf \"\\\\0\"\\n' > /tmp/fsmonitor && chmod +x /tmp/fsmonitor && "
        "git config --global core.fsmonitor /tmp/fsmonitor && "
        "git config --global status.showUntrackedFiles no && git config --global core.untrackedCache true"
    )


FAMILIES = {
    "path_stubs": Family("R4: stand-in commands first on an exported PATH", path_stubs),
    "bash_env_functions": Family("stand-in functions in a file named by an exported BASH_ENV", bash_env),
    "exported_functions": Family("stand-in functions exported with `export -f`", exported_functions),
    "aliases": Family("aliases to stand-in functions, in a BASH_ENV file", aliases),
    "ld_preload": Family("an exported LD_PRELOAD of a library that exits 0 in every program", ld_preload),
    "ld_so_preload": Family("that library in /etc/ld.so.preload (Docker)", ld_so_preload),
    "python_path": Family("a sitecustomize.py on an exported PYTHONPATH", python_path),
    "workspace_sitecustomize": Family("a sitecustomize.py in the workdir", workspace_sitecustomize),
    "usr_local_bin": Family("stand-in commands in /usr/local/bin (Docker)", usr_local_bin),
    "state_poisoned": Family("the saved shell state rewritten to `exit 0`", state_poisoned),
    "background_planter": Family(
        "a background loop planting the saved state and /usr/local/bin stubs", background_planter
    ),
    "git_config": Family("global git configuration hiding changes from git status", git_config),
    "empty": Family("an empty action: the episode ends at once", lambda env, pivot: "", generic=True),
    "done_at_once": Family(
        "`Done.`: the episode ends with nothing done", lambda env, pivot: "Done.", generic=True
    ),
}

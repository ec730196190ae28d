#!/usr/bin/env bash
# The system parts pivot-envs uses for real, for the README's two commands (`make run`, `make test`):
#   packages  bubblewrap, debootstrap with its keyring (debian-archive-keyring, gpgv), docker.io,
#             python3-venv when the Python cannot make a venv
#   docker    a Docker daemon that answers `docker info` (systemd's, else dockerd in the background)
#   image     the terminal domain's base image (`pivotrl sandbox build-image`, needs the venv)
#
# Usage: scripts/setup-system.sh [--dry-run] [packages] [docker] [image]   (no step: all three)
# Each step checks first and does nothing when its part is there, so a set-up machine costs about
# a second. As root with apt-get it installs; otherwise it prints the exact commands to run and
# goes on: every part is optional (tests that need a missing one skip, and say why).
# --dry-run changes nothing: it reports each part and the commands it would run.
# Environment: PYTHON (default python3), VENV (default .venv).
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
DOCKERD_LOG=/var/log/pivot-envs-dockerd.log
DOCKERD_WAIT_S=60

dry_run=0
steps=()
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry_run=1 ;;
    packages | docker | image) steps+=("$arg") ;;
    *) echo "setup-system.sh: unknown argument '$arg' (steps: packages, docker, image; option: --dry-run)" >&2; exit 2 ;;
  esac
done
[[ ${#steps[@]} -eq 0 ]] && steps=(packages docker image)

is_root() { [[ $(id -u) -eq 0 ]]; }
say() { echo "setup: $*"; }
# A program may live in an sbin directory that a user's PATH lacks (debootstrap, dockerd).
have() { command -v "$1" >/dev/null 2>&1 || [[ -x /usr/sbin/$1 || -x /sbin/$1 ]]; }

missing_packages() {
  local -a missing=()
  have bwrap || missing+=(bubblewrap)
  have debootstrap || missing+=(debootstrap)
  [[ -f /usr/share/keyrings/debian-archive-keyring.gpg ]] || missing+=(debian-archive-keyring)
  have gpgv || missing+=(gpgv)
  # The daemon, not only a client: some machines ship a lone `docker` client binary, with which no image
  # can be built or run. Any engine counts (docker.io, Docker Engine's docker-ce, which conflicts with
  # docker.io): docker.io is installed only where neither package is.
  if ! have dockerd && ! dpkg -s docker-ce >/dev/null 2>&1; then missing+=(docker.io); fi
  "$PYTHON" -c "import ensurepip, venv" >/dev/null 2>&1 || missing+=(python3-venv)
  echo "${missing[*]}"
}

step_packages() {
  local missing
  missing=$(missing_packages)
  if [[ -z $missing ]]; then
    say "packages: installed (bubblewrap, debootstrap, debian-archive-keyring, gpgv, docker)"
    return
  fi
  local install="apt-get install -y --no-install-recommends $missing"
  if ! have apt-get; then
    say "packages: missing $missing (Debian names); there is no apt-get here: install them with this system's package manager"
  elif ! is_root; then
    say "packages: missing $missing; to install them run: sudo apt-get update && sudo $install"
  elif ((dry_run)); then
    say "packages: missing $missing; would run: apt-get update && $install"
  else
    say "packages: installing $missing"
    if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive $install -qq >/dev/null; }; then
      say "packages: apt-get failed (above); going on without $missing"
    fi
  fi
}

docker_answers() { docker info >/dev/null 2>&1; }

start_dockerd() {
  if [[ -d /run/systemd/system ]]; then
    systemctl start docker && docker_answers
    return
  fi
  # No init system runs services here (a container, a CI job): dockerd in its own session, logged.
  mkdir -p "$(dirname "$DOCKERD_LOG")"
  setsid dockerd >"$DOCKERD_LOG" 2>&1 </dev/null &
  local pid=$!
  for ((waited = 0; waited < DOCKERD_WAIT_S; waited++)); do
    docker_answers && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  docker_answers
}

step_docker() {
  if ! have docker || ! have dockerd; then
    say "docker: no Docker engine (dockerd) installed; the terminal domain uses bubblewrap"
    return
  fi
  if docker_answers; then
    say "docker: the daemon answers"
    return
  fi
  local start="dockerd >$DOCKERD_LOG 2>&1 &"
  [[ -d /run/systemd/system ]] && start='systemctl start docker'
  if ! is_root; then
    say "docker: no daemon answers for $(id -un); the terminal domain uses bubblewrap. To use Docker run:" \
      "sudo sh -c '$start'; sudo usermod -aG docker $(id -un) (then log in again)"
  elif ((dry_run)); then
    say "docker: no daemon answers; would start it: $start"
  else
    say "docker: starting the daemon (up to ${DOCKERD_WAIT_S} s)"
    if start_dockerd; then
      say "docker: the daemon answers"
    else
      say "docker: the daemon did not start; the terminal domain uses bubblewrap. The end of its log ($DOCKERD_LOG):"
      tail -n 20 "$DOCKERD_LOG" 2>/dev/null | sed 's/^/  /'
    fi
  fi
}

# Prints four lines: the root filesystem's path, whether it is complete (1/0), the Docker image's tag,
# and whether Docker has it ("has", "missing", or "no-daemon" when none answers). Builds nothing.
image_state() {
  "$VENV/bin/python" - <<'EOF'
from pivot_envs.domains.terminal import image
from pivot_envs.sandboxes.available import docker_available

config = image.ImageConfig()
rootfs = image.rootfs_path(config)
tag = image.image_tag(config.suite)
print(rootfs)
print(int(image.rootfs_ready(rootfs)))
print(tag)
print(("missing", "has")[image.docker_image_exists(tag)] if docker_available() else "no-daemon")
EOF
}

step_image() {
  local pivotrl="$VENV/bin/pivotrl"
  if [[ ! -x $pivotrl ]]; then
    say "image: $pivotrl is not installed yet (make setup installs it); then: $pivotrl sandbox build-image"
    return
  fi
  local state rootfs ready tag docker errors
  errors=$(mktemp)
  # Only stdout is the state: a warning on stderr must not be read as a path.
  if ! state=$(image_state 2>"$errors"); then
    say "image: cannot read the terminal base image's state: $(tail -n 1 "$errors")"
    rm -f "$errors"
    return
  fi
  rm -f "$errors"
  { read -r rootfs; read -r ready; read -r tag; read -r docker; } <<<"$state"
  if ((ready)) && [[ $docker == has ]]; then
    say "image: ready ($rootfs, Docker image $tag)"
    return
  elif ((ready)) && [[ $docker == no-daemon ]]; then
    say "image: ready ($rootfs; no Docker image: no daemon answers)"
    return
  fi
  local build="$pivotrl sandbox build-image"
  if ((!ready)) && ! { is_root && have debootstrap; }; then
    # debootstrap needs root; sudo's own cache would be /var/cache, so name this user's.
    say "image: $rootfs is not built; to build it (debootstrap, about 2 minutes) run:" \
      "sudo env PIVOT_ENVS_CACHE=$(dirname "$(dirname "$rootfs")") $build"
  elif ((dry_run)); then
    say "image: $( ((ready)) && echo "the Docker image $tag is missing" || echo "$rootfs is not built"); would run: $build"
  else
    if ((ready)); then
      say "image: importing $rootfs into Docker"
    else
      say "image: building $rootfs with debootstrap (about 2 minutes, once)"
    fi
    if ! "$pivotrl" sandbox build-image | sed 's/^/  /'; then
      say "image: the build failed (above); the terminal domain's tests will skip and say why"
    fi
  fi
}

for step in "${steps[@]}"; do
  "step_$step"
done
exit 0

#!/usr/bin/env bash
# CI: start the Docker daemon and build the terminal domain's base image (idempotent).
# Run as root after `apt-get install bubblewrap docker.io debootstrap`.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! docker info >/dev/null 2>&1; then
  mkdir -p /var/log
  nohup dockerd >/var/log/dockerd.log 2>&1 &
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  if ! docker info >/dev/null 2>&1; then
    echo "dockerd did not answer within 60 s; its log:" >&2
    tail -n 50 /var/log/dockerd.log >&2
    exit 1
  fi
fi

# The venv (make setup is idempotent) provides the `pivotrl` command that builds the image.
make setup
.venv/bin/pivotrl sandbox build-image

#!/usr/bin/env bash
# Install and start what the integration tests need on a Debian controller:
# the Docker engine (molecule's container fleet), debootstrap (the local base
# images: no registry is reachable), QEMU (the two-NUMA-node VM), numactl, and
# gcc and binutils (the fake libcuda the probe tests build and check), and
# chromium (the HTML fleet report rendered headless).
# Idempotent; needs root.
set -euo pipefail
pkgs=(docker.io debootstrap qemu-system-x86 qemu-utils numactl openssh-client genisoimage gcc binutils libc6-dev chromium)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "gpunuma: installing Debian packages: ${missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# No init system manages dockerd on these hosts: start it ourselves.
if ! docker info >/dev/null 2>&1; then
  echo "gpunuma: starting dockerd" >&2
  nohup dockerd >/var/log/gpunuma-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  docker info >/dev/null 2>&1 || { echo "gpunuma: dockerd did not start; see /var/log/gpunuma-dockerd.log" >&2; exit 1; }
fi

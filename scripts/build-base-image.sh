#!/usr/bin/env bash
# Build gpunuma/debian-systemd:bookworm, the base image of the molecule
# container fleet: a minimal Debian bookworm that boots systemd as PID 1 and
# that Ansible drives through the community.docker.docker connection plugin
# (docker exec + python3; no SSH).
#
# No container registry is reachable from the test hosts, so the root file
# system comes from debootstrap and is turned into an image by `docker import`.
#
# The image is also tagged bookworm-<hash>, the hash of this file (which holds
# the package list and every customisation). A run that finds that tag exits
# at once. The finished root file system is kept as a tarball under
# $GPUNUMA_CACHE_DIR (default /var/cache/gpunuma), and debootstrap keeps its
# .debs there, so a rebuild after the Docker store was wiped only re-imports.
#
# Usage: scripts/build-base-image.sh [--force] [--suite bullseye|bookworm|trixie]
#   --force  rebuild from debootstrap even when the image or tarball exists
#            (downloaded .debs are still reused).
#   --suite  the Debian release (default bookworm); the image is
#            gpunuma/debian-systemd:<suite>.
# Needs root, a running Docker engine and debootstrap (scripts/setup-host.sh).
set -euo pipefail

readonly IMAGE_REPO=gpunuma/debian-systemd
# The Debian release: bookworm (the fleet's), or bullseye / trixie for the
# platform matrix (docs/testing.md, "Platforms").
SUITE=bookworm
readonly MIRROR="${GPUNUMA_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
readonly CACHE_DIR="${GPUNUMA_CACHE_DIR:-/var/cache/gpunuma}"

# Everything the fleet needs and nothing more: systemd as init, dbus for
# systemctl/hostnamectl, python3 + python3-apt for Ansible modules, numactl for
# the bindings the roles render, procps/iproute2 for the verifiers.
readonly PACKAGES=(
  systemd systemd-sysv dbus
  python3 python3-apt
  numactl procps iproute2
  sudo ca-certificates
)

# Units masked in the image. console-getty would start a login prompt on
# the container's console (molecule may allocate a tty); the apt timers would
# run unattended upgrades that hold the dpkg lock while a role installs
# packages. Everything else that cannot work in a container (udev, kernel
# modules, sysctl, kernel file systems) is already skipped by the units' own
# conditions, so it stays unmasked and a role can still reference it.
readonly MASKED_UNITS=(
  console-getty.service
  apt-daily.timer
  apt-daily-upgrade.timer
)

log() { printf 'gpunuma: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

force=false
while [ $# -gt 0 ]; do
  case "$1" in
    --force) force=true ;;
    --suite)
      case "${2:-}" in
        bullseye|bookworm|trixie) SUITE=$2; shift ;;
        *) die "--suite '${2:-}': allowed: bullseye, bookworm, trixie" ;;
      esac ;;
    *) die "unknown argument '$1'; allowed: --force, --suite bullseye|bookworm|trixie" ;;
  esac
  shift
done
readonly SUITE

script_path="$(readlink -f "${BASH_SOURCE[0]}")"
content_hash="$(sha256sum "$script_path" | cut -c1-12)"
readonly HASH_TAG="${SUITE}-${content_hash}"
readonly IMAGE="${IMAGE_REPO}:${HASH_TAG}"
readonly ROOTFS_TARBALL="${CACHE_DIR}/rootfs-${HASH_TAG}.tar.gz"
readonly DEB_CACHE="${CACHE_DIR}/debs-${SUITE}"

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap and docker import need it)"
command -v docker >/dev/null || die "docker not found; run scripts/setup-host.sh"
docker info >/dev/null 2>&1 || die "the Docker engine is not running; run scripts/setup-host.sh"

image_exists() { docker image inspect "$IMAGE" >/dev/null 2>&1; }

point_suite_tag() {
  docker tag "$IMAGE" "${IMAGE_REPO}:${SUITE}"
  log "image ${IMAGE_REPO}:${SUITE} is ${IMAGE} ($(docker image inspect -f '{{.Id}}' "$IMAGE" | cut -c1-19))"
}

if ! $force && image_exists; then
  point_suite_tag
  exit 0
fi

mkdir -p "$CACHE_DIR" "$DEB_CACHE"
# Two test runs may start at once; the second waits and then finds the image.
exec 9>"${CACHE_DIR}/build.lock"
flock 9
if ! $force && image_exists; then
  point_suite_tag
  exit 0
fi

build_rootfs() {
  command -v debootstrap >/dev/null || die "debootstrap not found; run scripts/setup-host.sh"
  local work rootfs
  work="$(mktemp -d "${CACHE_DIR}/build.XXXXXX")"
  # shellcheck disable=SC2064  # expand $work now: it is local
  trap "rm -rf '$work'" EXIT
  rootfs="${work}/rootfs"

  log "debootstrap ${SUITE} (minbase) from ${MIRROR}; packages cached in ${DEB_CACHE}"
  local packages
  packages="$(IFS=,; echo "${PACKAGES[*]}")"
  debootstrap --variant=minbase --include="$packages" \
    --cache-dir="$DEB_CACHE" "$SUITE" "$rootfs" "$MIRROR" \
    >"${work}/debootstrap.log" 2>&1 || {
      tail -n 30 "${work}/debootstrap.log" >&2
      die "debootstrap failed (full log above, last 30 lines)"
    }

  log "customising the root file system for systemd in a container"
  local unit
  for unit in "${MASKED_UNITS[@]}"; do
    ln -sfn /dev/null "${rootfs}/etc/systemd/system/${unit}"
  done
  # The default target must not wait for graphical or rescue bits.
  ln -sfn /lib/systemd/system/multi-user.target "${rootfs}/etc/systemd/system/default.target"

  # Empty machine-id: systemd generates a fresh one per container at boot,
  # so two fleet members never share an identity.
  : >"${rootfs}/etc/machine-id"
  rm -f "${rootfs}/var/lib/dbus/machine-id"

  # Let journald keep logs in memory only; the container's /run is a tmpfs.
  mkdir -p "${rootfs}/etc/systemd/journald.conf.d"
  printf '[Journal]\nStorage=volatile\n' >"${rootfs}/etc/systemd/journald.conf.d/gpunuma-container.conf"

  # Later package installs (roles, verifiers) stay small too.
  mkdir -p "${rootfs}/etc/dpkg/dpkg.cfg.d"
  cat >"${rootfs}/etc/dpkg/dpkg.cfg.d/gpunuma-nodoc" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
  find "${rootfs}/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete 2>/dev/null || true
  rm -rf "${rootfs}/usr/share/man" "${rootfs}/usr/share/info"
  find "${rootfs}/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} + 2>/dev/null || true
  rm -rf "${rootfs}"/var/cache/apt/archives/*.deb "${rootfs}"/var/lib/apt/lists/* "${rootfs}"/var/log/*.log

  # apt still works in the fleet (roles may install packages) from the mirror.
  printf 'deb %s %s main\n' "$MIRROR" "$SUITE" >"${rootfs}/etc/apt/sources.list"

  log "writing ${ROOTFS_TARBALL}"
  tar --numeric-owner --xattrs -C "$rootfs" -czf "${ROOTFS_TARBALL}.part" .
  mv "${ROOTFS_TARBALL}.part" "$ROOTFS_TARBALL"
}

if $force || [ ! -s "$ROOTFS_TARBALL" ]; then
  build_rootfs
else
  log "reusing ${ROOTFS_TARBALL}"
fi

# A forced rebuild replaces the image under the same tag; the old one would
# be left dangling.
replaced_id="$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)"
log "importing ${IMAGE}"
docker import \
  --change 'ENV container=docker' \
  --change 'CMD ["/lib/systemd/systemd"]' \
  --change "LABEL org.gpunuma.base-image-hash=${content_hash}" \
  "$ROOTFS_TARBALL" "$IMAGE" >/dev/null
point_suite_tag
if [ -n "$replaced_id" ] && [ "$replaced_id" != "$(docker image inspect -f '{{.Id}}' "$IMAGE")" ]; then
  docker rmi "$replaced_id" >/dev/null 2>&1 || log "could not remove replaced image ${replaced_id} (still in use?)"
fi

# Older hash tags of this image are stale builds: drop their tags and tarballs.
stale_tags="$(docker image ls --format '{{.Repository}}:{{.Tag}}' "$IMAGE_REPO" \
  | grep -E "^${IMAGE_REPO}:${SUITE}-[0-9a-f]{12}\$" | grep -vxF "$IMAGE" || true)"
for stale in $stale_tags; do
  log "removing stale tag ${stale}"
  docker rmi "$stale" >/dev/null 2>&1 || log "could not remove ${stale} (still in use?)"
done
find "$CACHE_DIR" -maxdepth 1 -name "rootfs-${SUITE}-*.tar.gz" -not -name "$(basename "$ROOTFS_TARBALL")" -delete
log "done: $(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}')"

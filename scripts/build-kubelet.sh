#!/usr/bin/env bash
# Build the upstream kubelet from the k8s.io/kubernetes Go module, for the
# real-kubelet test tier (docs/kubelet.md, "Tested against the real kubelet").
#
# `go install k8s.io/kubernetes/cmd/kubelet@vX` does not work: the module's
# go.mod replaces its staging modules (k8s.io/api, client-go, ...) with
# ./staging paths that a module download does not have. A throwaway wrapper
# module requires k8s.io/kubernetes vX and replaces each staging module with
# its published release v0.Y.Z instead, then builds cmd/kubelet statically.
#
# The binary is cached as $GPUNUMA_CACHE_DIR/kubelet/kubelet-vX (default
# /var/cache/gpunuma); a run that finds it prints its path and exits. The Go
# build cache and the downloaded modules live in a temporary directory that
# is removed afterwards (about 2.5 GB while building).
#
# Usage: scripts/build-kubelet.sh [vX.Y.Z]   (default v1.36.3)
# Prints the binary's path on its last line.
set -euo pipefail

VERSION="${1:-v1.36.3}"
case "$VERSION" in
  v1.[0-9][0-9].[0-9]*) ;;
  *) echo "gpunuma: kubelet version '$VERSION': expected vMAJOR.MINOR.PATCH, e.g. v1.36.3" >&2; exit 2 ;;
esac
STAGING="v0.${VERSION#v1.}"
CACHE_DIR="${GPUNUMA_CACHE_DIR:-/var/cache/gpunuma}/kubelet"
BINARY="$CACHE_DIR/kubelet-$VERSION"

log() { printf 'gpunuma: %s\n' "$*" >&2; }

if [ -x "$BINARY" ]; then
  echo "$BINARY"
  exit 0
fi
command -v go >/dev/null || { log "go not found: the kubelet is built with Go (1.26 or later)"; exit 1; }
mkdir -p "$CACHE_DIR"
work="$(mktemp -d "${TMPDIR:-/tmp}/gpunuma-kubelet.XXXXXX")"
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
export GOPATH="$work/gopath" GOMODCACHE="$work/gopath/pkg/mod" GOCACHE="$work/gocache" GOFLAGS=-mod=mod
export GOTOOLCHAIN=local CGO_ENABLED=0

mkdir -p "$work/wrapper"
cd "$work/wrapper"
log "reading k8s.io/kubernetes $VERSION's go.mod from the module proxy"
go mod download -json "k8s.io/kubernetes@$VERSION" > "$work/download.json"
gomod="$(sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p' "$work/download.json")"
[ -f "$gomod" ] || { log "no go.mod for k8s.io/kubernetes@$VERSION"; exit 1; }
staging="$(sed -n 's#^\s*\(k8s.io/[A-Za-z0-9._-]*\) => ./staging/.*#\1#p' "$gomod" | sort -u)"
[ -n "$staging" ] || { log "k8s.io/kubernetes@$VERSION names no staging module"; exit 1; }
{
  echo "module gpunuma.invalid/kubelet-build"
  echo
  echo "go 1.24"
  echo
  echo "require k8s.io/kubernetes $VERSION"
  echo
  for module in $staging; do
    echo "replace $module => $module $STAGING"
  done
} > go.mod
log "$(echo "$staging" | wc -l) staging modules replaced by their $STAGING releases"
log "downloading the modules cmd/kubelet needs"
go get "k8s.io/kubernetes/cmd/kubelet@$VERSION"
log "building the kubelet (about 1,000 CPU-seconds)"
nice go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$VERSION" \
  -o "$BINARY.part" k8s.io/kubernetes/cmd/kubelet
mv "$BINARY.part" "$BINARY"
log "built $BINARY ($(du -m "$BINARY" | cut -f1) MB)"
echo "$BINARY"

#!/usr/bin/env bash
# Builds etcd, kube-apiserver and kube-controller-manager from source through the Go module
# proxy and caches them by version outside the repository. Prints the binary directory.
#
#   hack/build-control-plane.sh            # build (or reuse) and print the directory
#
# Environment:
#   KUBEBUILDER_ASSETS   use these binaries instead (envtest convention); nothing is built
#   LOCALCACHE_K8S_VERSIONS  space-separated k8s versions to try in order
#   LOCALCACHE_ETCD_VERSION  etcd 3.6.x release
#   LOCALCACHE_BIN_CACHE     cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/localcache/control-plane)
set -euo pipefail

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
  for b in etcd kube-apiserver; do
    [[ -x "$KUBEBUILDER_ASSETS/$b" ]] || { echo "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS lacks $b" >&2; exit 1; }
  done
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi

K8S_VERSIONS=${LOCALCACHE_K8S_VERSIONS:-"v1.36.3 v1.35.4 v1.34.4"}
ETCD_VERSION=${LOCALCACHE_ETCD_VERSION:-v3.6.13}
CACHE_ROOT=${LOCALCACHE_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/localcache/control-plane}

source "$(dirname "${BASH_SOURCE[0]}")/lib/k8s-build.sh"

log() { printf '[control-plane] %s\n' "$*" >&2; }

have_k8s() { # dir version
  [[ -x "$1/kube-controller-manager" && -x "$1/kubectl" ]] && binary_reports "$1/kube-apiserver" "Kubernetes $2"
}

build_etcd() { # outdir
  local out=$1 work
  binary_reports "$out/etcd" "etcd Version: ${ETCD_VERSION#v}[[:space:]]*" && return 0
  log "building etcd $ETCD_VERSION"
  work=$(mktemp -d)
  (
    cd "$work"
    go mod init local/etcdbuild >/dev/null 2>&1
    go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2
    go mod tidy >&2
    go build -p 2 -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" \
      -o "$out/etcd.tmp" go.etcd.io/etcd/server/v3
  )
  mv "$out/etcd.tmp" "$out/etcd"
  rm -rf "$work"
}

build_k8s() { # version outdir
  log "building kube-apiserver, kube-controller-manager and kubectl $1"
  k8s_build "$1" "$2" kube-apiserver kube-controller-manager kubectl && have_k8s "$2" "$1"
}

# Reuse any cached version first, in order of preference.
for k in $K8S_VERSIONS; do
  dir="$CACHE_ROOT/$k"
  if have_k8s "$dir" "$k"; then
    build_etcd "$dir"
    log "reusing cached binaries in $dir"
    echo "$dir"
    exit 0
  fi
done

for k in $K8S_VERSIONS; do
  dir="$CACHE_ROOT/$k"
  mkdir -p "$dir"
  if build_k8s "$k" "$dir"; then
    build_etcd "$dir"
    log "built $("$dir/kube-apiserver" --version) and $("$dir/etcd" --version | head -n1) in $dir"
    echo "$dir"
    exit 0
  fi
  log "build of $k failed; trying the next version"
done
log "no Kubernetes version could be built (tried: $K8S_VERSIONS)"
exit 1

#!/usr/bin/env bash
# Everything a real-node test bed needs beyond the control plane, built or installed once and
# cached outside the repository. Prints the node binary directory (kubelet, kube-scheduler,
# containerd, containerd-shim-runc-v2, ctr) as its last line.
#
#   hack/build-node.sh
#
# - kubelet and kube-scheduler at the control plane's Kubernetes version (the directory name
#   hack/build-control-plane.sh printed), from the Go module proxy with the same pinned replace
#   list, in ${LOCALCACHE_NODE_CACHE}/<k8s version>/;
# - containerd 2.x (kubelet 1.37 drops containerd 1.6, which is what Debian has) from the Go
#   module proxy, in ${LOCALCACHE_NODE_CACHE}/containerd-<version>/, linked into the same dir;
# - Debian packages runc, containernetworking-plugins, iptables, conntrack and debootstrap,
#   installed only when missing (quiet when they are all there).
#
# Environment:
#   LOCALCACHE_K8S_VERSION        Kubernetes version (default: that of the built control plane)
#   LOCALCACHE_CONTAINERD_VERSION containerd release (default v2.4.2)
#   LOCALCACHE_NODE_CACHE         cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/localcache/node)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/lib/k8s-build.sh"

log() { printf '[node] %s\n' "$*" >&2; }

CACHE_ROOT=${LOCALCACHE_NODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/localcache/node}
CONTAINERD_VERSION=${LOCALCACHE_CONTAINERD_VERSION:-v2.4.2}
if [[ -z "${LOCALCACHE_K8S_VERSION:-}" ]]; then
  cp_dir=$(bash "$here/build-control-plane.sh")
  LOCALCACHE_K8S_VERSION=$("$cp_dir/kube-apiserver" --version | awk '{print $2}')
fi
K8S_VERSION=$LOCALCACHE_K8S_VERSION

install_packages() {
  local wanted=(runc containernetworking-plugins iptables conntrack debootstrap) missing=() p
  for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  (( ${#missing[@]} == 0 )) && return 0
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

build_containerd() { # outdir
  local out=$1 work pkgs
  { binary_reports "$out/containerd" "containerd * $CONTAINERD_VERSION" ||
    binary_reports "$out/containerd" "containerd * $CONTAINERD_VERSION *"; } &&
    [[ -x "$out/containerd-shim-runc-v2" && -x "$out/ctr" ]] && return 0
  log "building containerd $CONTAINERD_VERSION"
  pkgs=(github.com/containerd/containerd/v2/cmd/containerd
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
    github.com/containerd/containerd/v2/cmd/ctr)
  work=$(mktemp -d)
  (
    set -euo pipefail
    cd "$work"
    go mod init local/containerdbuild >/dev/null 2>&1
    go get -tool "${pkgs[@]/%/@$CONTAINERD_VERSION}" >&2
    go mod tidy >&2
    mkdir -p "$out/.tmp"
    go build -p 2 -tags "no_btrfs no_devmapper no_zfs" \
      -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
      -o "$out/.tmp/" "${pkgs[@]}" >&2
    mv "$out"/.tmp/* "$out/"
    rmdir "$out/.tmp"
  ) || { rm -rf "$work" "$out/.tmp"; return 1; }
  rm -rf "$work"
}

install_packages
node_dir=$CACHE_ROOT/$K8S_VERSION
containerd_dir=$CACHE_ROOT/containerd-$CONTAINERD_VERSION
mkdir -p "$node_dir" "$containerd_dir"
if ! { binary_reports "$node_dir/kubelet" "Kubernetes $K8S_VERSION" &&
  binary_reports "$node_dir/kube-scheduler" "Kubernetes $K8S_VERSION"; }; then
  log "building kubelet and kube-scheduler $K8S_VERSION"
  k8s_build "$K8S_VERSION" "$node_dir" kubelet kube-scheduler
fi
build_containerd "$containerd_dir"
for b in containerd containerd-shim-runc-v2 ctr; do ln -sfn "$containerd_dir/$b" "$node_dir/$b"; done
echo "$node_dir"

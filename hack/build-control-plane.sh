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

export GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath

log() { printf '[control-plane] %s\n' "$*" >&2; }

have_k8s() { # dir version
  [[ -x "$1/kube-apiserver" && -x "$1/kube-controller-manager" && -x "$1/kubectl" ]] &&
    "$1/kube-apiserver" --version 2>/dev/null | grep -qx "Kubernetes $2"
}

build_etcd() { # outdir
  local out=$1 work
  if [[ -x "$out/etcd" ]] && "$out/etcd" --version 2>/dev/null | grep -q "etcd Version: ${ETCD_VERSION#v}"; then
    return 0
  fi
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
  local k=$1 out=$2 s minor work mod godebug ld date
  s="v0.${k#v1.}"
  minor=$(echo "$k" | cut -d. -f2)
  log "building kube-apiserver, kube-controller-manager and kubectl $k (staging $s)"
  work=$(mktemp -d)
  (
    set -euo pipefail
    cd "$work"
    go mod init local/k8sbuild >/dev/null 2>&1
    mod=$(go mod download -json "k8s.io/kubernetes@$k" |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
    # The staging list is derived from this release's own go.mod, never hard-coded.
    for m in $(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/.*#\1#p' "$mod"); do
      go mod edit -replace="$m=$m@$s"
    done
    godebug=$(sed -n 's#^godebug[[:space:]]\{1,\}\(default=go1\.[0-9]*\).*#\1#p' "$mod" | head -n1)
    [[ -n "$godebug" ]] && go mod edit -godebug="$godebug"
    go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$k" "k8s.io/kubernetes/cmd/kube-controller-manager@$k" \
      "k8s.io/kubernetes/cmd/kubectl@$k" >&2
    go mod tidy >&2
    date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    ld="-s -w"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ld="$ld -X $p.gitVersion=$k -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=$date"
    done
    mkdir -p "$out/.tmp"
    go build -p 2 -pgo=off -tags=selinux,notest,grpcnotrace -ldflags "$ld" -o "$out/.tmp/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kubectl >&2
    mv "$out/.tmp/kube-apiserver" "$out/.tmp/kube-controller-manager" "$out/.tmp/kubectl" "$out/"
    rmdir "$out/.tmp"
  ) || { rm -rf "$work"; return 1; }
  rm -rf "$work"
  have_k8s "$out" "$k"
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

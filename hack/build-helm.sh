#!/usr/bin/env bash
# Builds Helm from source through the Go module proxy and caches it by version outside the
# repository. Prints the path of the helm binary.
#
#   hack/build-helm.sh            # build (or reuse) and print the binary's path
#
# Environment:
#   LOCALCACHE_HELM_VERSION   Helm v3 release (default v3.22.0)
#   LOCALCACHE_TOOLS_CACHE    cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/localcache/tools)
set -euo pipefail

HELM_VERSION=${LOCALCACHE_HELM_VERSION:-v3.22.0}
CACHE_ROOT=${LOCALCACHE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/localcache/tools}

log() { printf '[helm] %s\n' "$*" >&2; }

dir="$CACHE_ROOT/helm-$HELM_VERSION"
# `helm version --short` prints the version set by -X below (go install has no VCS stamp)
have_helm() { [[ -x "$dir/helm" ]] && [[ "$("$dir/helm" version --short 2>/dev/null)" == "$HELM_VERSION"* ]]; }

if ! have_helm; then
  log "building helm $HELM_VERSION (go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION)"
  mkdir -p "$dir"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  GOBIN="$work" go install -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
  mv "$work/helm" "$dir/helm"
  have_helm || { log "built helm does not report $HELM_VERSION"; exit 1; }
fi
echo "$dir/helm"

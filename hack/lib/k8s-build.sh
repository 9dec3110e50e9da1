# Shared by hack/build-control-plane.sh and hack/build-node.sh (sourced, not run): builds
# Kubernetes commands from the Go module proxy with the staging `replace` list and the godebug
# line taken from that release's own go.mod, and stamps the real version in.

export GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath

# binary_reports BIN PATTERN: `BIN --version` prints output matching the glob PATTERN.
# The output is captured first: `cmd | grep -q` under pipefail fails at random when grep exits
# early and the writer gets SIGPIPE.
binary_reports() {
  local out
  [[ -x "$1" ]] || return 1
  out=$("$1" --version 2>/dev/null) || return 1
  # shellcheck disable=SC2053 # $2 is a glob on purpose
  [[ "$out" == $2 ]]
}

# k8s_build VERSION OUTDIR CMD...: builds k8s.io/kubernetes/cmd/CMD for each CMD into OUTDIR.
k8s_build() {
  local k=$1 out=$2 s minor work mod godebug ld date pkgs=() c
  shift 2
  s="v0.${k#v1.}"
  minor=$(echo "$k" | cut -d. -f2)
  for c in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
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
    local tools=()
    for p in "${pkgs[@]}"; do tools+=("$p@$k"); done
    go get -tool "${tools[@]}" >&2
    go mod tidy >&2
    date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    ld="-s -w"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ld="$ld -X $p.gitVersion=$k -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=$date"
    done
    mkdir -p "$out/.tmp"
    go build -p 2 -pgo=off -tags=selinux,notest,grpcnotrace -ldflags "$ld" -o "$out/.tmp/" "${pkgs[@]}" >&2
    for c in "$@"; do mv "$out/.tmp/$c" "$out/$c"; done
    rmdir "$out/.tmp"
  ) || { rm -rf "$work" "$out/.tmp"; return 1; }
  rm -rf "$work"
}

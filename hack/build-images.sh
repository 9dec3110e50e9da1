#!/usr/bin/env bash
# Builds the container images of the local stack without Docker or a registry, and caches them
# outside the repository under a hash of their inputs: each is rebuilt only when those change.
#
#   hack/build-images.sh [NAME...]         # build (or reuse) NAMEs, default all
#   hack/build-images.sh --plan [NAME...]  # print the JSON a build would write; build nothing
#
# The last line on stdout is the path of a JSON file in the cache that maps each NAME to
# {"ref": "<image ref>", "tar": "<tarball path>"}. A tarball is an OCI layout and a docker-archive
# in one (hack/mkimage.py), accepted by `ctr -n k8s.io images import` and `docker load`.
# Progress goes to stderr; nothing is printed there when everything is cached.
#
# pause                pause.c of k8s.io/kubernetes@$LOCALCACHE_K8S_VERSION, gcc -Os -static,
#                      as upstream's (USER 65535); ref localhost/localcache/pause:3.10.
#                      Key: the version.
# python-base          debootstrap --variant=minbase bookworm with $PYTHON_PACKAGES: Python
#                      3.11, as the Dockerfile's python:3.11-slim. Key: suite and packages.
# localcache           python-base + hack/install-localcache.sh (the Dockerfile's recipe) on the
#                      project sources, user 65532:65532, the Dockerfile's env and entrypoint.
#                      Key: the rootfs, pyproject.toml, constraints.txt, README.md, localcache/,
#                      the install script.
# storage-initializer  debootstrap trixie with $PYTHON_PACKAGES (Python 3.13), kserve-storage in
#                      /opt/storage, KServe's initializer-entrypoint, user 1000, as KServe's
#                      kserve/storage-initializer. Key: the rootfs, hack/storage-initializer/*.
# kserve-localmodel    KServe's own local model cache controller (cmd/localmodel) and node agent
# kserve-localmodelnode  (cmd/localmodelnode) of github.com/kserve/kserve@$LOCALCACHE_KSERVE_VERSION,
#                      for the migration tests (tests/e2e/migration). Built from the Go module
#                      proxy in a module of our own that requires KServe and carries the replace
#                      directives of KServe's go.mod (read from it; the resulting build list is
#                      checked to be KServe's own), as KServe's localmodel.Dockerfile and
#                      localmodel-agent.Dockerfile build them: CGO_ENABLED=0, -mod=readonly,
#                      /manager on a distroless/static:nonroot-like rootfs (passwd and group with
#                      nonroot 65532, the host's CA bundle, /tmp, /home/nonroot), USER 65532.
#                      Unlike theirs, -trimpath and no `-a`, so Go's build cache serves rebuilds
#                      (cold: ~10 min on 2 cores, warm: ~35 s). Refs
#                      localhost/localcache/<name>:$VERSION-<key>. Key: the version, the Go
#                      version.
# kserve-manager       KServe's InferenceService controller and webhooks (cmd/manager) and its
# kserve-llmisvc       LLMInferenceService controller and webhooks (cmd/llmisvc), the same way
#                      and key, for tests/e2e/kservectl (go build under `nice -n 10`; warm
#                      rebuild with the dependencies in Go's build cache: ~30 s each).
# runtime-standin      python-base + hack/runtime-standin/standin.py, as `standin` (a
#                      ServingRuntime's model server) and `vllm` (a vLLM preset's `vllm serve`):
#                      reads the files at its model path and serves their digests; user 65532.
#                      Key: the rootfs, the script.
# Every key also covers hack/mkimage.py and the text of the shell functions that build the image
# (`declare -f`), so editing a recipe rebuilds what it makes. The debootstrapped root filesystems
# are cached as directories too: the images start from a copy of one.
#
# Why trixie for the storage initializer: kserve-storage unpacks .tar.gz models with tarfile's
# extraction filters (PEP 706, CPython 3.11.4+); Debian 12 ships Python 3.11.2 without them
# ("extractall() got an unexpected keyword argument 'filter'"). KServe's own image runs on
# python:3.11-slim (CPython 3.11.x latest); kserve-storage supports Python 3.10 to 3.13.
#
# Environment:
#   LOCALCACHE_IMAGE_CACHE    cache directory
#                             (default ${XDG_CACHE_HOME:-$HOME/.cache}/localcache/images)
#   LOCALCACHE_K8S_VERSION    k8s.io/kubernetes module version for pause.c (default v1.36.3)
#   LOCALCACHE_KSERVE_VERSION github.com/kserve/kserve version of the kserve-* images
#                             (default v0.20.0)
#   LOCALCACHE_DEBIAN_MIRROR  Debian mirror for both suites (default: the first deb source for
#                             bookworm in /etc/apt/sources.list or sources.list.d/*.{list,sources})
#
# Needs root (debootstrap, chroot, mknod), go, gcc and python3; installs debootstrap, gcc and
# libc6-dev with apt-get when missing. pip in the chroots trusts the host's CA bundle (PyPI may
# sit behind a TLS proxy that only the host trusts) and gets the host's proxy and index settings.
# Concurrent runs take turns on a flock in the cache. Everything is built in a temporary directory
# in the cache and renamed into place, so a crash never leaves a half image that looks complete;
# the next run removes the leftovers. The three most recently used versions of each image stay.

# shellcheck disable=SC2329 # the recipes run by name (build_<image>), cleanup from a trap
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${LOCALCACHE_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/localcache/images}
K8S_VERSION=${LOCALCACHE_K8S_VERSION:-v1.36.3}
KSERVE_VERSION=${LOCALCACHE_KSERVE_VERSION:-v0.20.0}
KSERVE_MODULE=github.com/kserve/kserve
BASE_SUITE=bookworm   # python-base and localcache
STORAGE_SUITE=trixie  # storage-initializer (see above)
PYTHON_PACKAGES=python3,python3-venv,ca-certificates
ALL_IMAGES=(pause python-base localcache storage-initializer kserve-localmodel
  kserve-localmodelnode kserve-manager kserve-llmisvc runtime-standin)
KEEP=3
CHROOT_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
STORAGE_REQUIREMENTS=$ROOT/hack/storage-initializer/requirements.txt
STORAGE_ENTRYPOINT=$ROOT/hack/storage-initializer/initializer-entrypoint
STANDIN_SERVER=$ROOT/hack/runtime-standin/standin.py
WORK=

log() { printf '[images] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ---- keys ------------------------------------------------------------------------------------

sha() { sha256sum | cut -c1-64; }

localcache_sources() { # the files the localcache image is built from, relative to $ROOT, sorted
  (
    cd "$ROOT"
    printf '%s\n' pyproject.toml constraints.txt README.md hack/install-localcache.sh
    find localcache -type f ! -path '*/__pycache__/*' ! -name '*.py[co]'
  ) | LC_ALL=C sort
}

storage_version() {
  sed -n 's/^kserve-storage==\([^[:space:]#]*\).*/\1/p' "$STORAGE_REQUIREMENTS" | head -n1
}

compute_keys() {
  local mk sources suite version n
  local chroot_recipe=(chroot_prepare chroot_run chroot_finish slim_rootfs add_user)
  version=$(storage_version)
  [[ -n $version ]] || die "$STORAGE_REQUIREMENTS pins no kserve-storage==VERSION"
  mk=$(sha <"$ROOT/hack/mkimage.py")
  sources=$(cd "$ROOT" && localcache_sources | tr '\n' '\0' | xargs -0 sha256sum | sha)
  PAUSE_KEY=$(printf 'pause\n%s\n%s\n%s\n' "$K8S_VERSION" "$mk" "$(declare -f build_pause)" | sha)
  declare -gA ROOTFS ROOTFS_KEY REF TAR
  for suite in "$BASE_SUITE" "$STORAGE_SUITE"; do
    ROOTFS_KEY[$suite]=$(printf 'rootfs\n%s\n%s\n%s\n' "$suite" "$PYTHON_PACKAGES" \
      "$(declare -f make_rootfs slim_rootfs)" | sha)
    ROOTFS[$suite]=$CACHE/rootfs-$suite-${ROOTFS_KEY[$suite]:0:12}
  done
  BASE_KEY=$(printf 'python-base\n%s\n%s\n%s\n' "${ROOTFS_KEY[$BASE_SUITE]}" "$mk" \
    "$(declare -f build_python_base)" | sha)
  LOCALCACHE_KEY=$(printf 'localcache\n%s\n%s\n%s\n%s\n' "${ROOTFS_KEY[$BASE_SUITE]}" "$mk" \
    "$sources" "$(declare -f build_localcache localcache_sources "${chroot_recipe[@]}")" | sha)
  KSERVE_KEY=$(printf 'kserve\n%s\n%s\n%s\n%s\n' "$KSERVE_VERSION" "$mk" \
    "$(go env GOVERSION 2>/dev/null || echo no-go)" \
    "$(declare -f build_kserve_localmodel build_kserve_localmodelnode build_kserve_manager \
      build_kserve_llmisvc kserve_manager kserve_module go_module_dir distroless_rootfs)" | sha)
  STANDIN_KEY=$(printf 'runtime-standin\n%s\n%s\n%s\n%s\n' "${ROOTFS_KEY[$BASE_SUITE]}" "$mk" \
    "$(sha <"$STANDIN_SERVER")" "$(declare -f build_runtime_standin)" | sha)
  STORAGE_KEY=$(printf 'storage-initializer\n%s\n%s\n%s\n%s\n%s\n' "${ROOTFS_KEY[$STORAGE_SUITE]}" \
    "$mk" "$(sha <"$STORAGE_REQUIREMENTS")" "$(sha <"$STORAGE_ENTRYPOINT")" \
    "$(declare -f build_storage_initializer "${chroot_recipe[@]}")" | sha)

  REF[pause]=localhost/localcache/pause:3.10
  TAR[pause]=$CACHE/pause-${PAUSE_KEY:0:12}.tar
  REF[python-base]=localhost/localcache/python-base:${BASE_KEY:0:12}
  TAR[python-base]=$CACHE/python-base-${BASE_KEY:0:12}.tar
  REF[localcache]=localhost/localcache/localcache:${LOCALCACHE_KEY:0:12}
  TAR[localcache]=$CACHE/localcache-${LOCALCACHE_KEY:0:12}.tar
  REF[storage-initializer]=localhost/localcache/storage-initializer:$version-${STORAGE_KEY:0:8}
  TAR[storage-initializer]=$CACHE/storage-initializer-${STORAGE_KEY:0:12}.tar
  REF[runtime-standin]=localhost/localcache/runtime-standin:${STANDIN_KEY:0:12}
  TAR[runtime-standin]=$CACHE/runtime-standin-${STANDIN_KEY:0:12}.tar
  for n in kserve-localmodel kserve-localmodelnode kserve-manager kserve-llmisvc; do
    REF[$n]=localhost/localcache/$n:$KSERVE_VERSION-${KSERVE_KEY:0:12}
    TAR[$n]=$CACHE/$n-${KSERVE_KEY:0:12}.tar
  done
}

images_json() { # NAME... -> the JSON document on stdout
  local n args=()
  for n in "$@"; do args+=("$n" "${REF[$n]}" "${TAR[$n]}"); done
  python3 - "${args[@]}" <<'PY'
import json, sys
a = sys.argv[1:]
doc = {a[i]: {"ref": a[i + 1], "tar": a[i + 2]} for i in range(0, len(a), 3)}
print(json.dumps(doc, indent=2, sort_keys=True))
PY
}

# ---- helpers ---------------------------------------------------------------------------------

quiet() { # LOGFILE COMMAND... : output to LOGFILE, shown on failure (COMMAND: not a shell function)
  local logfile=$1 kept
  shift
  if ! "$@" >"$logfile" 2>&1; then
    tail -n 40 "$logfile" >&2
    kept=$CACHE/failed-${logfile##*/} # $WORK goes away on exit
    cp "$logfile" "$kept" || true
    die "${kept##*/failed-}: $1 failed; the last lines are above, the whole log is in $kept"
  fi
}

need_root() { [[ $EUID -eq 0 ]] || die "$1: needs root"; }

ensure_cmd() { # COMMAND PACKAGE... : apt-get install the packages when COMMAND is missing
  local cmd=$1
  shift
  command -v "$cmd" >/dev/null && return 0
  need_root "installing $*"
  log "installing $* with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends "$@" >"$WORK/apt.log" 2>&1; then
    quiet "$WORK/apt-update.log" apt-get update -qq
    quiet "$WORK/apt.log" apt-get install -y -qq --no-install-recommends "$@"
  fi
}

umount_under() { # DIR : unmount whatever a crashed debootstrap left mounted below DIR
  local dir m
  dir=$(realpath -m "$1")
  awk -v d="$dir" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo |
    sort -r | while read -r m; do umount -l "$m" || true; done
}

remove_tree() { # PATH : safely, never crossing into a mount
  umount_under "$1"
  rm -rf --one-file-system "$1"
}

cleanup() { [[ -z $WORK ]] || remove_tree "$WORK"; }

debian_mirror() { # the host's Debian mirror: the first deb source for $BASE_SUITE
  if [[ -n ${LOCALCACHE_DEBIAN_MIRROR:-} ]]; then
    echo "$LOCALCACHE_DEBIAN_MIRROR"
    return 0
  fi
  python3 - "$BASE_SUITE" <<'PY' || die "no Debian mirror for $BASE_SUITE in /etc/apt/sources.list" \
    "or /etc/apt/sources.list.d/*.{list,sources}; set LOCALCACHE_DEBIAN_MIRROR"
import glob, re, sys

suite = sys.argv[1]


def one_line_style(text):  # deb [opts] URI SUITE COMPONENT...
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        rest = line[4:].strip()
        if rest.startswith("["):
            rest = rest[rest.find("]") + 1 :]
        words = rest.split()
        if len(words) >= 2 and words[1] == suite:
            yield words[0]


def deb822_style(text):  # paragraphs of Types:, URIs:, Suites:, Enabled: ...
    for para in re.split(r"\n\s*\n", text):
        fields, key = {}, None
        for line in para.splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            if line[0] in " \t" and key:
                fields[key] += " " + line.strip()
                continue
            key, _, value = line.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
        if (
            "deb" in fields.get("types", "").split()
            and suite in fields.get("suites", "").split()
            and fields.get("enabled", "yes").lower() != "no"
        ):
            yield from fields.get("uris", "").split()


files = ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]
files += sorted(glob.glob("/etc/apt/sources.list.d/*.sources"))
for path in files:
    try:
        text = open(path).read()
    except OSError:
        continue
    parse = deb822_style if path.endswith(".sources") else one_line_style
    for uri in parse(text):
        if uri.startswith(("http://", "https://")):
            print(uri)
            sys.exit(0)
sys.exit(1)
PY
}

mkimage() { python3 "$ROOT/hack/mkimage.py" "$@" >/dev/null; }

# ---- recipes ---------------------------------------------------------------------------------
# The text of these functions is part of the image keys: keep them the whole recipe.

build_pause() { # OUT.tar
  local out=$1 dir=$WORK/pause moddir
  ensure_cmd gcc gcc libc6-dev
  command -v go >/dev/null || die "pause needs go (pause.c comes from the k8s.io/kubernetes module)"
  mkdir -p "$dir/rootfs"
  moddir=$(cd "$dir" &&
    GOWORK=off GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
  gcc -Os -Wall -Werror -static -DVERSION="v3.10-localcache-$K8S_VERSION" \
    -o "$dir/rootfs/pause" "$moddir/build/pause/linux/pause.c"
  strip "$dir/rootfs/pause"
  # as upstream's build/pause/Dockerfile: FROM scratch, /pause, USER 65535:65535
  mkimage "$dir/rootfs" "${REF[pause]}" "$out" --entrypoint /pause --user 65535:65535
}

slim_rootfs() { # ROOTFS : drop what a container never uses, like debian:*-slim
  local r=$1
  rm -rf "${r:?}"/dev/* "$r"/proc/* "$r"/sys/* "$r"/tmp/* "$r"/root/.cache \
    "$r"/var/cache/apt/archives/*.deb "$r"/var/cache/apt/*.bin "$r"/var/lib/apt/lists/* \
    "$r"/var/cache/debconf/*-old "$r"/var/lib/dpkg/*-old \
    "$r"/usr/share/man/* "$r"/usr/share/info/* "$r"/usr/share/locale/* "$r"/usr/share/groff/* \
    "$r"/usr/share/lintian/*
  find "$r/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
  find "$r/usr/share/doc" -mindepth 1 -type d -empty -delete
  find "$r/var/log" -type f -delete
  : >"$r/etc/resolv.conf" # the runtime provides resolv.conf and hostname
  : >"$r/etc/hostname"
}

make_rootfs() { # SUITE OUTDIR
  local suite=$1 out=$2 mirror
  need_root "a Debian rootfs"
  ensure_cmd debootstrap debootstrap
  mirror=$(debian_mirror)
  log "debootstrap $suite ($PYTHON_PACKAGES) from $mirror"
  quiet "$WORK/debootstrap-$suite.log" debootstrap --variant=minbase --include="$PYTHON_PACKAGES" \
    "$suite" "$out" "$mirror"
  umount_under "$out"
  slim_rootfs "$out"
}

build_python_base() { # OUT.tar
  mkimage "${ROOTFS[$BASE_SUITE]}" "${REF[python-base]}" "$1" --cmd python3 --env LANG=C.UTF-8
}

chroot_prepare() { # ROOTFS : device nodes, the host's DNS and CA bundle, for pip in a chroot
  local r=$1
  need_root "a chroot image"
  mknod -m 666 "$r/dev/null" c 1 3
  mknod -m 666 "$r/dev/zero" c 1 5
  mknod -m 666 "$r/dev/random" c 1 8
  mknod -m 666 "$r/dev/urandom" c 1 9
  cp /etc/resolv.conf "$r/etc/resolv.conf"
  if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
    cp /etc/ssl/certs/ca-certificates.crt "$r/tmp/host-ca.crt"
  fi
}

chroot_run() { # ROOTFS LOGFILE SCRIPT : SCRIPT by sh -e in the chroot, in a clean environment
  local r=$1 logfile=$2 script=$3 v
  local env=(PATH="$CHROOT_PATH" HOME=/root LANG=C.UTF-8 PIP_DISABLE_PIP_VERSION_CHECK=1
    PIP_NO_CACHE_DIR=1 PIP_DEFAULT_TIMEOUT="${PIP_DEFAULT_TIMEOUT:-60}")
  if [[ -f $r/tmp/host-ca.crt ]]; then
    env+=(PIP_CERT=/tmp/host-ca.crt REQUESTS_CA_BUNDLE=/tmp/host-ca.crt
      SSL_CERT_FILE=/tmp/host-ca.crt)
  fi
  for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY \
    PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST; do
    [[ -z ${!v:-} ]] || env+=("$v=${!v}")
  done
  quiet "$logfile" env -i "${env[@]}" chroot "$r" /bin/sh -ec "$script"
}

chroot_finish() { # ROOTFS : undo chroot_prepare and drop build leftovers
  local r=$1
  rm -f "$r/tmp/host-ca.crt"
  slim_rootfs "$r"
}

add_user() { # ROOTFS NAME UID HOME : a passwd and group entry, NAME:UID:UID
  printf '%s:x:%s:%s:%s:%s:/usr/sbin/nologin\n' "$2" "$3" "$3" "$2" "$4" >>"$1/etc/passwd"
  printf '%s:x:%s:\n' "$2" "$3" >>"$1/etc/group"
}

build_localcache() { # OUT.tar : the Dockerfile's image, by the same hack/install-localcache.sh
  local out=$1 r=$WORK/localcache.rootfs
  cp -a "${ROOTFS[$BASE_SUITE]}" "$r"
  mkdir -p "$r/src"
  (cd "$ROOT" && localcache_sources | tar -cf - --no-recursion -T -) | tar -C "$r/src" -xf -
  chroot_prepare "$r"
  chroot_run "$r" "$WORK/localcache.log" 'sh /src/hack/install-localcache.sh /src'
  rm -rf "$r/src"
  add_user "$r" nonroot 65532 /tmp
  chroot_finish "$r"
  mkimage "$r" "${REF[localcache]}" "$out" --entrypoint localcache --cmd '["--help"]' \
    --user 65532:65532 --workdir /tmp --env "PATH=/opt/localcache/bin:$CHROOT_PATH" \
    --env LANG=C.UTF-8 --env PYTHONUNBUFFERED=1 --env PYTHONDONTWRITEBYTECODE=1 \
    --env HOME=/tmp --env TMPDIR=/tmp
  remove_tree "$r"
}

build_storage_initializer() { # OUT.tar : KServe's storage initializer on kserve-storage
  local out=$1 r=$WORK/storage-initializer.rootfs
  cp -a "${ROOTFS[$STORAGE_SUITE]}" "$r"
  install -D -m 0755 "$STORAGE_ENTRYPOINT" "$r/storage-initializer/scripts/initializer-entrypoint"
  install -m 0644 "$STORAGE_REQUIREMENTS" "$r/tmp/requirements.txt"
  mkdir -p "$r/work"
  chroot_prepare "$r"
  # shellcheck disable=SC2016 # $PATH and $rc expand in the chroot
  chroot_run "$r" "$WORK/storage-initializer.log" '
    python3 -m venv /opt/storage
    /opt/storage/bin/pip install --requirement /tmp/requirements.txt
    /opt/storage/bin/pip freeze --all >/opt/storage/requirements.lock
    /opt/storage/bin/python -m compileall -q /opt/storage/lib
    /opt/storage/bin/python -c "import kserve_storage, boto3, google.cloud.storage, azure.storage.blob"
    /opt/storage/bin/python -c "import tarfile; tarfile.data_filter"  # PEP 706: archives unpack
    rc=0
    PATH=/opt/storage/bin:$PATH /storage-initializer/scripts/initializer-entrypoint 2>/dev/null || rc=$?
    test "$rc" = 2  # the usage error: the script and its imports load
  '
  add_user "$r" kserve 1000 /tmp
  chroot_finish "$r"
  mkimage "$r" "${REF[storage-initializer]}" "$out" \
    --entrypoint '["/storage-initializer/scripts/initializer-entrypoint"]' \
    --user 1000 --workdir /work --env "PATH=/opt/storage/bin:$CHROOT_PATH" --env LANG=C.UTF-8 \
    --env PYTHONDONTWRITEBYTECODE=1 --env HOME=/tmp --env TMPDIR=/tmp
  remove_tree "$r"
}

go_module_dir() { # MODULE@VERSION : its directory in the Go module cache (downloaded if missing)
  (cd "$WORK" && GOWORK=off GOFLAGS=-mod=mod go mod download -json "$1") |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])'
}

kserve_module() { # DIR : a Go module requiring KServe, with KServe's go directive and replaces
  local dir=$1 kserve edits
  [[ -f $dir/go.sum ]] && return 0 # made by the other kserve image of this run
  command -v go >/dev/null || die "the kserve images need go"
  kserve=$(go_module_dir "$KSERVE_MODULE@$KSERVE_VERSION")
  mkdir -p "$dir"
  printf 'module localcache.invalid/kserve-addon\n' >"$dir/go.mod"
  # Go ignores the replace directives of a dependency's go.mod: only the main module's count
  mapfile -t edits < <(GOWORK=off go mod edit -json "$kserve/go.mod" | python3 -c '
import json, sys
mod = json.load(sys.stdin)
at = lambda m: m["Path"] + ("@" + m["Version"] if m.get("Version") else "")
print("-go=" + mod["Go"])
for r in mod.get("Replace") or []:
    print("-replace=" + at(r["Old"]) + "=" + at(r["New"]))
')
  ((${#edits[@]} > 1)) || die "no replace directives read from $kserve/go.mod"
  (cd "$dir" && GOWORK=off go mod edit "${edits[@]}")
  install -m 0644 "$kserve/go.sum" "$dir/go.sum"
  log "resolving $KSERVE_MODULE@$KSERVE_VERSION (the first time downloads its dependencies)"
  (cd "$dir" && quiet "$WORK/kserve-get.log" env GOWORK=off GOFLAGS=-mod=mod go get \
    "$KSERVE_MODULE/cmd/localmodel@$KSERVE_VERSION" "$KSERVE_MODULE/cmd/localmodelnode@$KSERVE_VERSION" \
    "$KSERVE_MODULE/cmd/manager@$KSERVE_VERSION" "$KSERVE_MODULE/cmd/llmisvc@$KSERVE_VERSION")
  python3 - "$kserve/go.mod" "$dir/go.mod" "$KSERVE_MODULE" <<'PY' ||
import json, os, subprocess, sys

def requires(path):
    out = subprocess.run(["go", "mod", "edit", "-json", path], capture_output=True, text=True,
                         check=True, env={**os.environ, "GOWORK": "off"}).stdout
    return {r["Path"]: r["Version"] for r in json.loads(out).get("Require") or []}

theirs, ours = requires(sys.argv[1]), requires(sys.argv[2])
ours.pop(sys.argv[3])
bad = sorted((p, v, theirs.get(p)) for p, v in ours.items() if theirs.get(p) != v)
for path, got, want in bad:
    print(f"[images] {path} {got}; KServe's go.mod: {want}", file=sys.stderr)
sys.exit(1 if bad else 0)
PY
    die "the build list differs from KServe's go.mod (above)"
}

distroless_rootfs() { # DIR : like gcr.io/distroless/static:nonroot (users, CA bundle, /tmp)
  local r=$1
  [[ -f /etc/ssl/certs/ca-certificates.crt ]] || die "no CA bundle in /etc/ssl/certs"
  mkdir -p "$r/etc/ssl/certs" "$r/tmp" "$r/home/nonroot" "$r/root"
  chmod 1777 "$r/tmp"
  chmod 0700 "$r/root" "$r/home/nonroot"
  chown 65532:65532 "$r/home/nonroot"
  printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
    'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
    'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$r/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'tty:x:5:' 'staff:x:50:' 'nonroot:x:65532:' \
    >"$r/etc/group"
  install -m 0644 /etc/ssl/certs/ca-certificates.crt "$r/etc/ssl/certs/ca-certificates.crt"
}

kserve_manager() { # NAME CMD OUT.tar : KServe's cmd/CMD as /manager in the image NAME
  local name=$1 cmd=$2 out=$3 r=$WORK/$1.rootfs
  need_root "$name (files owned by 65532)"
  kserve_module "$WORK/kserve-module"
  distroless_rootfs "$r"
  (cd "$WORK/kserve-module" && quiet "$WORK/$name-build.log" nice -n 10 env GOWORK=off \
    CGO_ENABLED=0 GOOS=linux GOFLAGS=-mod=readonly go build -trimpath -o "$r/manager" "$KSERVE_MODULE/cmd/$cmd")
  # as KServe's Dockerfiles: FROM gcr.io/distroless/static:nonroot, /manager, ENTRYPOINT
  mkimage "$r" "${REF[$name]}" "$out" --entrypoint /manager --user 65532:65532 \
    --workdir /home/nonroot --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
  remove_tree "$r"
}

build_kserve_localmodel() { kserve_manager kserve-localmodel localmodel "$1"; }

build_kserve_localmodelnode() { kserve_manager kserve-localmodelnode localmodelnode "$1"; }

build_kserve_manager() { kserve_manager kserve-manager manager "$1"; }

build_kserve_llmisvc() { kserve_manager kserve-llmisvc llmisvc "$1"; }

build_runtime_standin() { # OUT.tar : python-base + a model server stand-in, also as `vllm`
  local out=$1 r=$WORK/runtime-standin.rootfs
  cp -a "${ROOTFS[$BASE_SUITE]}" "$r"
  install -D -m 0755 "$STANDIN_SERVER" "$r/opt/standin/standin.py"
  mkdir -p "$r/usr/local/bin"
  ln -s /opt/standin/standin.py "$r/usr/local/bin/vllm" # runs a vLLM preset's `vllm serve`
  ln -s /opt/standin/standin.py "$r/usr/local/bin/standin"
  add_user "$r" nonroot 65532 /tmp
  mkimage "$r" "${REF[runtime-standin]}" "$out" --entrypoint standin --user 65532:65532 \
    --workdir /tmp --env "PATH=$CHROOT_PATH" --env LANG=C.UTF-8 --env PYTHONUNBUFFERED=1 \
    --env HOME=/tmp
  remove_tree "$r"
}

# ---- cache -----------------------------------------------------------------------------------

ensure_rootfs() { # SUITE
  local suite=$1 t0=$SECONDS
  if [[ -d ${ROOTFS[$suite]} ]]; then
    touch "${ROOTFS[$suite]}"
    return 0
  fi
  log "building the $suite rootfs"
  make_rootfs "$suite" "$WORK/rootfs-$suite"
  mv -T "$WORK/rootfs-$suite" "${ROOTFS[$suite]}"
  log "built the $suite rootfs in $((SECONDS - t0)) s: ${ROOTFS[$suite]}"
}

ensure_image() { # NAME BUILDER
  local name=$1 builder=$2 t0
  if [[ -f ${TAR[$name]} ]]; then
    touch "${TAR[$name]}"
    return 0
  fi
  case $name in
    python-base | localcache | runtime-standin) ensure_rootfs "$BASE_SUITE" ;;
    storage-initializer) ensure_rootfs "$STORAGE_SUITE" ;;
  esac
  t0=$SECONDS
  log "building $name (${REF[$name]})"
  "$builder" "$WORK/$name.tar"
  mv -f "$WORK/$name.tar" "${TAR[$name]}"
  log "built $name in $((SECONDS - t0)) s: ${TAR[$name]}"
}

prune() { # PATTERN [KEEP] : keep the most recently used entries of the cache matching PATTERN
  local f
  find "$CACHE" -maxdepth 1 -name "$1" -printf '%T@ %p\n' | sort -rn |
    tail -n +"$((${2:-$KEEP} + 1))" | cut -d' ' -f2- | while IFS= read -r f; do remove_tree "$f"; done
}

main() {
  local plan=0 names=() n t0=$SECONDS json out
  for n in "$@"; do
    case $n in
      --plan) plan=1 ;;
      -h | --help) sed -n '2,/^$/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
      pause | python-base | localcache | storage-initializer | kserve-localmodel | \
        kserve-localmodelnode | kserve-manager | kserve-llmisvc | runtime-standin) names+=("$n") ;;
      *) die "unknown image $n (known: ${ALL_IMAGES[*]})" ;;
    esac
  done
  ((${#names[@]})) || names=("${ALL_IMAGES[@]}")
  compute_keys
  if ((plan)); then
    images_json "${names[@]}"
    exit 0
  fi

  mkdir -p "$CACHE"
  exec 9>"$CACHE/.lock"
  if ! flock -n 9; then
    log "waiting for another build to finish ($CACHE/.lock)"
    flock 9
  fi
  for n in "$CACHE"/.tmp-*; do # leftovers of a crashed run: we hold the lock, it is dead
    if [[ -e $n ]]; then remove_tree "$n"; fi
  done
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  WORK=$(mktemp -d "$CACHE/.tmp-XXXXXX")

  for n in "${names[@]}"; do
    ensure_image "$n" "build_${n//-/_}"
  done

  json=$(images_json "${names[@]}")
  out=$CACHE/images-$(printf '%s' "$json" | sha | cut -c1-12).json
  printf '%s\n' "$json" >"$WORK/images.json"
  mv -f "$WORK/images.json" "$out"
  for n in "${ALL_IMAGES[@]}"; do prune "$n-*.tar"; done
  prune "rootfs-$BASE_SUITE-*"
  prune "rootfs-$STORAGE_SUITE-*"
  prune 'images-*.json' 10
  prune 'failed-*'
  ((SECONDS - t0 < 2)) || log "done in $((SECONDS - t0)) s"
  echo "$out"
}

{ main "$@"; exit; } # parsed whole before it runs: editing this file during a build is safe

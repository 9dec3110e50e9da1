#!/bin/sh
# The one recipe that installs localcache into the virtualenv /opt/localcache. Both image builds
# run it: the Dockerfile's builder stage, and hack/build-images.sh in a chroot of a Debian rootfs.
# A test (tests/unit/images/test_install_recipe.py) holds both to it.
#
#   sh hack/install-localcache.sh [SOURCE_DIR]      # default: the current directory
#
# SOURCE_DIR holds pyproject.toml, constraints.txt, README.md and localcache/. Needs python3
# (3.11+, with venv) and the package index. Steps: a fresh venv; the project's wheel
# (no dependencies); that wheel installed with every dependency at the version pinned in
# constraints.txt; bytecode compiled ahead of time (the image runs with a read-only root and
# PYTHONDONTWRITEBYTECODE); and `localcache --help` as a smoke test.
# pip settings from the environment (PIP_QUIET, PIP_INDEX_URL, PIP_CERT, ...) are honoured.
set -eu

src=${1:-.}
venv=/opt/localcache

: "${PIP_DISABLE_PIP_VERSION_CHECK:=1}" "${PIP_NO_CACHE_DIR:=1}" "${PYTHONDONTWRITEBYTECODE:=1}"
export PIP_DISABLE_PIP_VERSION_CHECK PIP_NO_CACHE_DIR PYTHONDONTWRITEBYTECODE

wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT

python3 -m venv "$venv"
"$venv/bin/pip" wheel --no-deps --wheel-dir "$wheels" "$src"
"$venv/bin/pip" install --constraint "$src/constraints.txt" "$wheels"/localcache-*.whl
"$venv/bin/python" -m compileall -q "$venv/lib"
"$venv/bin/localcache" --help >/dev/null

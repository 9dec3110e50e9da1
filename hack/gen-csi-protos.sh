#!/usr/bin/env bash
# Regenerates the gRPC stubs of localcache's CSI node plugin (localcache/csi/proto/) from the
# two protocols it speaks, both taken from the Go module proxy (no other download site):
#   csi.proto                 github.com/container-storage-interface/spec@$CSI_SPEC_VERSION
#   pluginregistration.proto  k8s.io/kubelet@$KUBELET_VERSION pkg/apis/pluginregistration/v1/api.proto
#                             (the kubelet's plugin-watcher API that node-driver-registrar serves;
#                             that module is not on the proxy here, so the plugin serves it itself)
# The .proto files are checked in beside the generated *_pb2.py, *_pb2.pyi and *_pb2_grpc.py;
# a unit test fails when they drift (tests/unit/csi/test_protos.py).
#
#   hack/gen-csi-protos.sh          # needs go and the dev virtualenv (grpcio-tools, mypy-protobuf)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CSI_SPEC_VERSION=${CSI_SPEC_VERSION:-v1.12.0}
KUBELET_VERSION=${KUBELET_VERSION:-v0.36.3}
PY=${PY:-$ROOT/.venv/bin/python}
OUT=localcache/csi/proto

module_dir() {  # module@version -> its directory in the module cache
  local work
  work=$(mktemp -d)
  (cd "$work" && go mod init gen >/dev/null 2>&1 && go mod download -json "$1" |
    "$PY" -c 'import json,sys; d=json.load(sys.stdin); sys.exit(d.get("Error")) if "Error" in d else print(d["Dir"])')
  rm -rf "$work"
}

spec=$(module_dir "github.com/container-storage-interface/spec@$CSI_SPEC_VERSION")
kubelet=$(module_dir "k8s.io/kubelet@$KUBELET_VERSION")
cd "$ROOT"
install -m 0644 "$spec/csi.proto" "$OUT/csi.proto"
install -m 0644 "$kubelet/pkg/apis/pluginregistration/v1/api.proto" "$OUT/pluginregistration.proto"
includes=$("$PY" -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')
"$PY" -m grpc_tools.protoc -I. -I"$includes" --python_out=. --mypy_out=. --grpc_python_out=. \
  "$OUT/csi.proto" "$OUT/pluginregistration.proto"
echo "regenerated $OUT from spec $CSI_SPEC_VERSION and kubelet $KUBELET_VERSION" >&2

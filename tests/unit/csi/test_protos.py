"""The checked-in gRPC stubs are what hack/gen-csi-protos.sh makes of the checked-in .proto
files (the script fetches those from the Go module proxy; this regenerates offline)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import grpc_tools
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[3]
PROTO = Path("localcache/csi/proto")


def test_the_generated_stubs_match_the_protos(tmp_path: Path) -> None:
    (tmp_path / PROTO).mkdir(parents=True)
    for name in ("csi.proto", "pluginregistration.proto"):
        shutil.copy(ROOT / PROTO / name, tmp_path / PROTO / name)
    includes = Path(os.path.dirname(grpc_tools.__file__)) / "_proto"
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        code = protoc.main(
            [
                "protoc",
                "-I.",
                f"-I{includes}",
                "--python_out=.",
                "--grpc_python_out=.",
                str(PROTO / "csi.proto"),
                str(PROTO / "pluginregistration.proto"),
            ]
        )
    finally:
        os.chdir(cwd)
    assert code == 0
    for generated in sorted((tmp_path / PROTO).glob("*_pb2*.py")):
        committed = ROOT / PROTO / generated.name
        assert committed.read_text() == generated.read_text(), (
            f"{committed} is stale: run hack/gen-csi-protos.sh"
        )

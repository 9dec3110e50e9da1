#!/usr/bin/env python3
"""Turn a root filesystem directory into an image tarball, with the standard library only.

The tarball holds one layer (the whole rootfs as a gzip tar) and is at once an OCI image layout
(`oci-layout`, `index.json`, `blobs/sha256/...`) and a docker-archive (`manifest.json` with
`RepoTags`), so `ctr -n k8s.io images import` and `docker load` both accept it.

    mkimage.py ROOTFS REF OUT.tar [--entrypoint CMD] [--cmd CMD] [--env K=V]...
               [--workdir DIR] [--user UID[:GID]] [--mtime EPOCH]

CMD is either one word (`--entrypoint /pause`) or a JSON list (`--cmd '["sh", "-c", "x"]'`).

Promised: entries in sorted order, numeric owners only (no user or group names), a gzip stream
without timestamp or file name, and compact JSON with sorted keys. With `--mtime EPOCH` every
file time and the image's `created` time are set to EPOCH, so the same rootfs content gives a
byte-identical tarball; leave it out for a rootfs with timestamp-checked `.pyc` files, whose
recorded source times would no longer match (Python would then recompile on every start).
`OUT` appears complete or not at all: it is written beside itself and renamed into place.

Not promised: more than one layer, whiteouts, sockets (skipped), any platform but the host's,
or reproducibility without `--mtime` (file times and `created` then come from the clock).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import io
import json
import os
import platform
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_GO_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
_OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ImageConfig:
    """The runtime part of an image config (OCI `config`); the empty default runs nothing."""

    entrypoint: tuple[str, ...] | None = None
    cmd: tuple[str, ...] | None = None
    env: tuple[str, ...] = ()
    workdir: str = "/"
    user: str | None = None

    def to_json(self) -> dict[str, Any]:
        env = list(self.env)
        if not any(e.startswith("PATH=") for e in env):
            env.insert(0, DEFAULT_PATH)
        out: dict[str, Any] = {"Env": env, "WorkingDir": self.workdir}
        if self.entrypoint is not None:
            out["Entrypoint"] = list(self.entrypoint)
        if self.cmd is not None:
            out["Cmd"] = list(self.cmd)
        if self.user is not None:
            out["User"] = self.user
        return out


@dataclasses.dataclass(frozen=True)
class BuiltImage:
    """What was written: digests are `sha256:<hex>`; `layer_size` is the compressed size."""

    ref: str
    path: Path
    manifest_digest: str
    config_digest: str
    layer_digest: str
    diff_id: str
    layer_size: int


class _Sink(Protocol):
    def write(self, data: bytes, /) -> int: ...
    def flush(self) -> None: ...


class _HashingWriter:
    """A write-only file object that hashes and counts what passes through it."""

    def __init__(self, sink: _Sink) -> None:
        self._sink = sink
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        self.size += len(data)
        self._sink.write(data)
        return len(data)

    def flush(self) -> None:
        self._sink.flush()


def _walk(directory: str, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(path, arcname) of every entry below directory: depth first, siblings sorted by name."""
    with os.scandir(directory) as it:
        children = sorted(it, key=lambda e: e.name)
    for entry in children:
        arcname = f"{prefix}{entry.name}"
        yield entry.path, arcname
        if entry.is_dir(follow_symlinks=False):
            yield from _walk(entry.path, f"{arcname}/")


def _write_layer(rootfs: Path, sink: IO[bytes], *, mtime: int | None) -> tuple[str, str, int]:
    """Write rootfs as a gzip tar to sink: (digest, diff_id, compressed size)."""
    compressed = _HashingWriter(sink)
    with gzip.GzipFile(filename="", mode="wb", fileobj=compressed, compresslevel=1, mtime=0) as gz:
        plain = _HashingWriter(gz)
        with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
            for path, arcname in _walk(str(rootfs)):
                info = tar.gettarinfo(path, arcname)
                if info is None:  # a socket: nothing an image can hold
                    continue
                info.uname = info.gname = ""
                info.mtime = int(info.mtime) if mtime is None else mtime
                if info.isreg():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    return (
        f"sha256:{compressed.sha256.hexdigest()}",
        f"sha256:{plain.sha256.hexdigest()}",
        compressed.size,
    )


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = mtime
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def _json_bytes(doc: object) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _descriptor(media_type: str, digest: str, size: int) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": digest, "size": size}


def build_image(
    rootfs: Path, ref: str, out: Path, *, config: ImageConfig, mtime: int | None = None
) -> BuiltImage:
    """Write the image tarball for rootfs to out (atomically) and describe it."""
    if not rootfs.is_dir():
        raise NotADirectoryError(f"rootfs {rootfs} is not a directory")
    name, sep, tag = ref.rpartition(":")
    if not sep or not name or "/" in tag:
        raise ValueError(f"image reference {ref!r} needs a tag, e.g. localhost/x/y:1.0")
    stamp = int(time.time()) if mtime is None else mtime
    arch = _GO_ARCH.get(platform.machine(), platform.machine())
    out.parent.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryFile(dir=out.parent, prefix=f".{out.name}.layer-") as layer:
        layer_digest, diff_id, layer_size = _write_layer(rootfs, layer, mtime=mtime)
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stamp))
        config_bytes = _json_bytes(
            {
                "architecture": arch,
                "os": "linux",
                "created": created,
                "config": config.to_json(),
                "rootfs": {"type": "layers", "diff_ids": [diff_id]},
                "history": [{"created": created, "created_by": "hack/mkimage.py"}],
            }
        )
        config_digest = f"sha256:{hashlib.sha256(config_bytes).hexdigest()}"
        manifest_bytes = _json_bytes(
            {
                "schemaVersion": 2,
                "mediaType": _OCI_MANIFEST,
                "config": _descriptor(
                    "application/vnd.oci.image.config.v1+json", config_digest, len(config_bytes)
                ),
                "layers": [
                    _descriptor(
                        "application/vnd.oci.image.layer.v1.tar+gzip", layer_digest, layer_size
                    )
                ],
            }
        )
        manifest_digest = f"sha256:{hashlib.sha256(manifest_bytes).hexdigest()}"
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    **_descriptor(_OCI_MANIFEST, manifest_digest, len(manifest_bytes)),
                    "annotations": {
                        "io.containerd.image.name": ref,
                        "org.opencontainers.image.ref.name": tag,
                    },
                    "platform": {"architecture": arch, "os": "linux"},
                }
            ],
        }
        docker_manifest = [
            {
                "Config": f"blobs/sha256/{config_digest.removeprefix('sha256:')}",
                "RepoTags": [ref],
                "Layers": [f"blobs/sha256/{layer_digest.removeprefix('sha256:')}"],
            }
        ]

        fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
        try:
            with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w") as tar:
                info = tarfile.TarInfo(f"blobs/sha256/{layer_digest.removeprefix('sha256:')}")
                info.size = layer_size
                info.mtime = stamp
                info.mode = 0o644
                layer.seek(0)
                tar.addfile(info, layer)
                for digest, data in (
                    (config_digest, config_bytes),
                    (manifest_digest, manifest_bytes),
                ):
                    _add_bytes(tar, f"blobs/sha256/{digest.removeprefix('sha256:')}", data, stamp)
                _add_bytes(tar, "oci-layout", _json_bytes({"imageLayoutVersion": "1.0.0"}), stamp)
                _add_bytes(tar, "index.json", _json_bytes(index), stamp)
                _add_bytes(tar, "manifest.json", _json_bytes(docker_manifest), stamp)
            os.chmod(tmp_name, 0o644)
            os.replace(tmp_name, out)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise

    return BuiltImage(
        ref=ref,
        path=out,
        manifest_digest=manifest_digest,
        config_digest=config_digest,
        layer_digest=layer_digest,
        diff_id=diff_id,
        layer_size=layer_size,
    )


def _command(value: str) -> tuple[str, ...]:
    """One word, or a JSON list of strings."""
    if not value.startswith("["):
        return (value,)
    parsed = json.loads(value)
    if not isinstance(parsed, list) or not all(isinstance(v, str) for v in parsed):
        raise argparse.ArgumentTypeError(f"not a JSON list of strings: {value}")
    return tuple(parsed)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("rootfs", type=Path)
    ap.add_argument("ref", help="image reference with a tag, e.g. localhost/localcache/x:1.0")
    ap.add_argument("out", type=Path, help="tarball to write")
    ap.add_argument("--entrypoint", type=_command, default=None)
    ap.add_argument("--cmd", type=_command, default=None)
    ap.add_argument("--env", action="append", default=[], metavar="K=V")
    ap.add_argument("--workdir", default="/")
    ap.add_argument("--user", default=None, metavar="UID[:GID]")
    ap.add_argument("--mtime", type=int, default=None, metavar="EPOCH")
    args = ap.parse_args(argv)
    for env in args.env:
        if "=" not in env:
            ap.error(f"--env {env!r} is not K=V")
    image = build_image(
        args.rootfs,
        args.ref,
        args.out,
        config=ImageConfig(
            entrypoint=args.entrypoint,
            cmd=args.cmd,
            env=tuple(args.env),
            workdir=args.workdir,
            user=args.user,
        ),
        mtime=args.mtime,
    )
    print(f"{image.path}: {image.ref} {image.manifest_digest} layer {image.layer_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Core/v1 schemas for CRD fields that embed a Kubernetes type, taken from the Kubernetes
OpenAPI of the version we build, never written by hand.

`corev1-schemas.json` (next to this module, checked in) holds the structural schema of each
type in `TYPES`, extracted from `api/openapi-spec/v3/api__v1_openapi.json` of the
`k8s.io/kubernetes` module at `KUBERNETES_VERSION`. `crdgen` reads only that file, so
generating CRDs needs no network and no Go. Regenerate it after changing the version:

    python -m localcache.api.coreschema            # write corev1-schemas.json
    python -m localcache.api.coreschema --check    # exit 1 if it differs from the module's

The module source is looked up in the Go module cache (`go env GOMODCACHE`) and, when absent,
fetched with `go mod download` through the Go module proxy (`--no-download` forbids that).

`structural(openapi, name)` turns one OpenAPI definition into the CRD dialect, the way
controller-gen renders the same Go types (what KServe's CRDs carry):

- `$ref`s (bare, or `allOf: [{$ref}]` beside a field description) are inlined; the field's
  own description wins over the type's.
- `resource.Quantity` becomes int-or-string with the quantity pattern (`schema.QUANTITY_SCHEMA`
  semantics), `intstr.IntOrString` int-or-string.
- `default` is dropped: CRD defaulting would fill required fields with zero values
  (`hostPath: {}` would become `{path: ""}` and pass) and change what is stored; the core API
  applies its own defaults when the PV or PVC is created.
- Descriptions, `required`, `format`, `x-kubernetes-list-type`, `x-kubernetes-list-map-keys`
  and `x-kubernetes-map-type` are kept. Any other keyword raises `SchemaError`, so a new
  Kubernetes version cannot slip something CRDs refuse (or we have not reviewed) into our CRDs.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from localcache.api.quantity import CRD_PATTERN

Schema = dict[str, Any]

KUBERNETES_VERSION: Final = "v1.36.3"
OPENAPI_FILE: Final = "api/openapi-spec/v3/api__v1_openapi.json"
CORE: Final = "io.k8s.api.core.v1."
TYPES: Final = ("PersistentVolumeSpec", "PersistentVolumeClaimSpec")
DATA_FILE: Final = Path(__file__).resolve().with_name("corev1-schemas.json")
GO_TIMEOUT: Final = 600.0

QUANTITY: Final = "io.k8s.apimachinery.pkg.api.resource.Quantity"
INT_OR_STRING: Final = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
_SPECIAL: Final[dict[str, Schema]] = {
    QUANTITY: {
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": CRD_PATTERN,
        "x-kubernetes-int-or-string": True,
    },
    INT_OR_STRING: {
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "x-kubernetes-int-or-string": True,
    },
}
_KEPT: Final = frozenset(
    {
        "description",
        "type",
        "format",
        "required",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
    }
)
_DROPPED: Final = frozenset({"default"})
_NESTED: Final = frozenset({"properties", "items", "additionalProperties", "allOf", "$ref"})


class SchemaError(ValueError):
    """The OpenAPI document has something we cannot (or do not yet) turn into a CRD schema."""


@dataclass(frozen=True)
class CoreSchema:
    """Field metadata for `schema`: use the extracted schema of core/v1 type `name` (one of
    `TYPES`) instead of the schema of the field's Python type.

        persistent_volume_spec: Annotated[dict[str, Any], CoreSchema("PersistentVolumeSpec")]
    """

    name: str

    def schema(self) -> Schema:
        fresh: Schema = json.loads(json.dumps(load()["schemas"][self.name]))  # a deep copy
        return fresh


@functools.cache
def load() -> dict[str, Any]:
    """The checked-in extraction: `{"source": ..., "schemas": {name: schema}}`."""
    return dict(json.loads(DATA_FILE.read_text()))


def _ref_name(ref: str) -> str:
    prefix = "#/components/schemas/"
    if not ref.startswith(prefix):
        raise SchemaError(f"unsupported $ref {ref!r}")
    return ref[len(prefix) :]


def _resolve(definitions: dict[str, Schema], name: str, stack: tuple[str, ...]) -> Schema:
    if name in _SPECIAL:
        return dict(_SPECIAL[name])
    if name in stack:
        raise SchemaError(f"recursive type {' -> '.join((*stack, name))}: CRDs cannot express it")
    if name not in definitions:
        raise SchemaError(f"no definition {name!r} in the OpenAPI document")
    return _convert(definitions, definitions[name], (*stack, name))


def _convert(definitions: dict[str, Schema], node: Schema, stack: tuple[str, ...]) -> Schema:
    where = stack[-1] if stack else "?"
    unknown = set(node) - _KEPT - _DROPPED - _NESTED
    if unknown:
        raise SchemaError(f"{where}: keywords {sorted(unknown)} have no reviewed CRD form")
    refs = [node["$ref"]] if "$ref" in node else []
    for part in node.get("allOf", []):
        if set(part) != {"$ref"}:
            raise SchemaError(f"{where}: allOf other than a single $ref: {part}")
        refs.append(part["$ref"])
    if len(refs) > 1:
        raise SchemaError(f"{where}: more than one $ref in one schema")
    out: Schema = _resolve(definitions, _ref_name(refs[0]), stack) if refs else {}
    if refs and node.get("type") not in (None, out.get("type")):
        raise SchemaError(f"{where}: type {node['type']} beside a $ref of another type")
    for key in sorted(_KEPT & set(node)):
        out[key] = node[key]
    if "properties" in node:
        out["properties"] = {
            field: _convert(definitions, value, stack)
            for field, value in sorted(node["properties"].items())
        }
    if "items" in node:
        out["items"] = _convert(definitions, node["items"], stack)
    if "additionalProperties" in node:
        extra = node["additionalProperties"]
        if not isinstance(extra, dict):
            raise SchemaError(f"{where}: additionalProperties must be a schema")
        out["additionalProperties"] = _convert(definitions, extra, stack)
    if "x-kubernetes-int-or-string" not in out and "type" not in out:
        raise SchemaError(f"{where}: a schema without a type is not structural: {node}")
    return out


def structural(openapi: dict[str, Any], name: str) -> Schema:
    """The structural CRD schema of core/v1 type `name` from an OpenAPI v3 document."""
    definitions: dict[str, Schema] = openapi["components"]["schemas"]
    return _resolve(definitions, CORE + name, ())


def extract(openapi: dict[str, Any], *, version: str = KUBERNETES_VERSION) -> dict[str, Any]:
    """What `corev1-schemas.json` holds, extracted from the OpenAPI document of `version`."""
    return {
        "source": f"k8s.io/kubernetes@{version} {OPENAPI_FILE}",
        "schemas": {name: structural(openapi, name) for name in TYPES},
    }


def render(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def _go(*args: str, cwd: Path) -> str:
    env = {**os.environ, "GOWORK": "off", "GOFLAGS": "-mod=mod"}
    result = subprocess.run(
        ["go", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=GO_TIMEOUT
    )
    if result.returncode != 0:
        raise SchemaError(f"go {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout.strip()


def module_openapi(version: str = KUBERNETES_VERSION) -> Path | None:
    """The OpenAPI file of `k8s.io/kubernetes@version` in the Go module cache, if present
    (`None` also when Go is not installed)."""
    cache = os.environ.get("GOMODCACHE")
    if not cache:
        try:
            cache = _go("env", "GOMODCACHE", cwd=Path.cwd())
        except (OSError, SchemaError, subprocess.TimeoutExpired):
            return None
    path = Path(cache) / f"k8s.io/kubernetes@{version}" / OPENAPI_FILE
    return path if path.is_file() else None


def download_openapi(version: str = KUBERNETES_VERSION) -> Path:
    """Fetch `k8s.io/kubernetes@version` into the module cache (Go module proxy) and return
    its OpenAPI file, as `hack/lib/k8s-build.sh` fetches the module it builds."""
    with tempfile.TemporaryDirectory() as work:
        _go("mod", "init", "local/coreschema", cwd=Path(work))
        info = json.loads(
            _go("mod", "download", "-json", f"k8s.io/kubernetes@{version}", cwd=Path(work))
        )
    path = Path(info["Dir"]) / OPENAPI_FILE
    if not path.is_file():
        raise SchemaError(f"{path} is missing from k8s.io/kubernetes@{version}")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m localcache.api.coreschema",
        description=f"Extract core/v1 CRD schemas from k8s.io/kubernetes@{KUBERNETES_VERSION}.",
    )
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if stale")
    parser.add_argument(
        "--no-download", action="store_true", help="fail instead of using the Go module proxy"
    )
    args = parser.parse_args(argv)
    source = module_openapi()
    if source is None:
        if args.no_download:
            print(
                f"k8s.io/kubernetes@{KUBERNETES_VERSION} is not in the Go module cache",
                file=sys.stderr,
            )
            return 2
        source = download_openapi()
    text = render(extract(json.loads(source.read_text())))
    if args.check:
        if not DATA_FILE.is_file() or DATA_FILE.read_text() != text:
            print(f"stale: {DATA_FILE} (run python -m localcache.api.coreschema)", file=sys.stderr)
            return 1
        return 0
    DATA_FILE.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Install CustomResourceDefinitions into a test control plane and wait until they serve.

`install_crds(control_plane, paths)` reads every YAML file given (directories: their `*.yaml`
files, sorted), keeps the `CustomResourceDefinition` documents, creates each one (or replaces
it when it already exists, retrying on conflict), then waits until every CRD reports
`Established=True`, the apiserver's discovery lists its plural for every served version and
a LIST of each answers 200 (a new CRD's storage may still be initializing: 429), so the very
next request for the kind succeeds. Like envtest's `InstallCRDs`, it talks to the
apiserver only through the harness (`ControlPlane.rest`), never through the code under test.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from localcache.devenv import waiting
from localcache.devenv.assets import ControlPlaneError
from localcache.devenv.controlplane import ControlPlane

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
WRITE_ATTEMPTS = 5


def load_crds(paths: Iterable[Path | str]) -> list[dict[str, Any]]:
    """The CRD documents in `paths` (files, or directories of `*.yaml`), in order."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        files.extend(sorted(path.glob("*.yaml")) if path.is_dir() else [path])
    crds: list[dict[str, Any]] = []
    for file in files:
        for doc in yaml.safe_load_all(file.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                crds.append(doc)
    return crds


def _apply(control_plane: ControlPlane, crd: dict[str, Any]) -> None:
    name = crd["metadata"]["name"]
    for _ in range(WRITE_ATTEMPTS):
        status, body = control_plane.rest("POST", CRD_PATH, crd)
        if status == 201:
            return
        if status != 409:
            raise ControlPlaneError(f"creating CRD {name}: {status} {body}")
        status, current = control_plane.rest("GET", f"{CRD_PATH}/{name}")
        if status != 200:
            continue  # deleted in between: create again
        replacement = {
            **crd,
            "metadata": {
                **crd["metadata"],
                "resourceVersion": current["metadata"]["resourceVersion"],
            },
        }
        status, body = control_plane.rest("PUT", f"{CRD_PATH}/{name}", replacement)
        if status == 200:
            return
        if status != 409:
            raise ControlPlaneError(f"replacing CRD {name}: {status} {body}")
    raise ControlPlaneError(f"CRD {name}: still conflicting after {WRITE_ATTEMPTS} attempts")


def _established(control_plane: ControlPlane, name: str) -> bool:
    status, body = control_plane.rest("GET", f"{CRD_PATH}/{name}")
    if status != 200:
        return False
    conditions = (body.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def _served_versions(crd: dict[str, Any]) -> list[str]:
    return [v["name"] for v in crd["spec"]["versions"] if v.get("served", True)]


def _discoverable(control_plane: ControlPlane, crd: dict[str, Any]) -> bool:
    group = crd["spec"]["group"]
    plural = crd["spec"]["names"]["plural"]
    for version in _served_versions(crd):
        status, body = control_plane.rest("GET", f"/apis/{group}/{version}")
        if status != 200:
            return False
        if plural not in {r.get("name") for r in body.get("resources", [])}:
            return False
    return True


def _listable(control_plane: ControlPlane, crd: dict[str, Any]) -> bool:
    group = crd["spec"]["group"]
    plural = crd["spec"]["names"]["plural"]
    return all(
        control_plane.rest("GET", f"/apis/{group}/{version}/{plural}?limit=1")[0] == 200
        for version in _served_versions(crd)
    )


def _serving(control_plane: ControlPlane, crd: dict[str, Any]) -> bool:
    """Established, discoverable, then listable: each step only once the one before holds."""
    return (
        _established(control_plane, crd["metadata"]["name"])
        and _discoverable(control_plane, crd)
        and _listable(control_plane, crd)
    )


def install_crds(
    control_plane: ControlPlane, paths: Iterable[Path | str], *, timeout: float = 30.0
) -> list[str]:
    """Create or replace the CRDs found in `paths`; return their names once all serve."""
    crds = load_crds(paths)
    for crd in crds:
        _apply(control_plane, crd)
    for crd in crds:
        waiting.wait_until_sync(
            functools.partial(_serving, control_plane, crd),
            timeout=timeout,
            what=f"CRD {crd['metadata']['name']} is Established, discovered and listable",
        )
    return [crd["metadata"]["name"] for crd in crds]

"""KServe-shaped CRDs for tests: localcache's generated CRDs minus localcache's extras.

KServe's own CRD YAML (`config/crd/full/localmodel/…`, KServe v0.20) is not available
offline, so the CRDs "as KServe's chart installs them" are built here from ours: the field
paths and CEL rules below are what localcache adds to KServe's v0.20 schema (reference:
`/work/shared/reference/kserve-localmodel.md`, section 1). Everything else, the full
core/v1 PersistentVolume(Claim)Spec schemas included, is left as ours. Printer columns,
short names and categories (also ours only) do not matter to the schema check.
"""

from __future__ import annotations

from typing import Any, Final

from localcache.api import crdgen
from tests.support import schemastrip

Obj = dict[str, Any]

#: CRD name -> (field paths KServe's schema lacks, paths whose CEL rules KServe lacks)
EXTRAS: Final[dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {
    "localmodelcaches.serving.kserve.io": (
        ("spec.download", "status.conditions", "status.sharedVolume"),
        ("spec.modelSize",),
    ),
    "localmodelnamespacecaches.serving.kserve.io": (
        ("spec.download", "spec.pvcRef", "status.conditions", "status.sharedVolume"),
        ("spec", "spec.modelSize"),
    ),
    "localmodelnodes.serving.kserve.io": (
        ("status.downloadJobs", "status.modelProgress", "status.summary"),
        (),
    ),
    "localmodelnodegroups.serving.kserve.io": (
        ("spec.download", "spec.tolerations"),
        ("spec.storageLimit",),
    ),
}


#: CRD name -> (schema path, fields KServe v0.20 requires there that ours does not)
REQUIRED: Final[dict[str, tuple[str, tuple[str, ...]]]] = {
    # KServe v0.20 has no shared-volume mode (#6107): every namespace cache names node groups
    "localmodelnamespacecaches.serving.kserve.io": ("spec", ("nodeGroups",)),
}


def our_crds() -> list[Obj]:
    """localcache's CRDs, as `make manifests` generates them."""
    return [crdgen.crd(source) for source in crdgen.SOURCES]


def kserve_shaped(crd: Obj) -> Obj:
    """`crd` with localcache's extras (`EXTRAS`) removed from every version's schema, and
    without our printer columns, short names and categories."""
    fields, rules = EXTRAS[crd["metadata"]["name"]]
    versions = []
    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        stripped = schemastrip.drop_rules(schemastrip.strip(schema, fields), rules)
        if (required := REQUIRED.get(crd["metadata"]["name"])) is not None:
            node = stripped["properties"][required[0]]
            node["required"] = sorted({*node.get("required", ()), *required[1]})
        lean = {k: v for k, v in version.items() if k != "additionalPrinterColumns"}
        versions.append({**lean, "schema": {"openAPIV3Schema": stripped}})
    names = {k: v for k, v in crd["spec"]["names"].items() if k not in ("shortNames", "categories")}
    return {
        **crd,
        "metadata": {"name": crd["metadata"]["name"]},
        "spec": {**crd["spec"], "names": names, "versions": versions},
    }

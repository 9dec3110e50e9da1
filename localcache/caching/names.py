"""Names of the PVs and PVCs derived from a cache, its node groups and namespaces: valid
for any input, and never the same for two different derivations.

KServe's forms (reference §2.2, spec §3) are plain `-` joins:

    serving PVC                  {cache}-{group}              (both kinds; the ISVC's
                                                               `localmodel-pvc-name`)
    cluster download PVC         {cache}-{group}              (in jobNamespace)
    namespace download PVC       {cache}-{group}-download     (in the cache's namespace)
    cluster download PV          {cache}-{group}-download
    namespace download PV        {cache}-{group}-{ns}-download
    serving PV                   {cache}-{group}-{ns}

A join can be read back in several ways (`a-b`+`c` and `a`+`b-c` both give `a-b-c`), and it
may exceed the 253 characters of a DNS-1123 subdomain (PV and PVC names). So KServe's form is
kept only when it is **unambiguous and fits**:
- it is at most 253 characters;
- no part contains `--`, starts or ends with `-`, or is the word `download`;
- the parts that follow a variable-length part are single words (no `-`), so that the name
  parses back into exactly one derivation among all the names of its object space (PV names
  among PV names; PVC names among PVC names of a namespace): the group (and the namespace)
  of every form, and, for download PVs, the cache name too (else the cluster download PV of
  cache `llama-cpu` on group `gpu` and the namespace download PV of cache `llama` on group
  `cpu` in namespace `gpu` would both be `llama-cpu-gpu-download`).

Otherwise the name is `<KServe's form, cut to fit>--<12 hex chars of SHA-256 over the role
and the full parts>`: deterministic, readable, and distinct from every kept form (those never
contain `--`). The usual case, a cache `qwen-model` on group `gpu1`, keeps `qwen-model-gpu1`
as its serving PVC, the name KServe's own defaulter would set.

Not promised: that the same (cache, group) gives different names for its serving PVC and its
cluster download PVC when both are kept in KServe's form (an InferenceService in jobNamespace
itself); KServe's add-on has the same clash.

**The serving PVC is an exception** (issue 21): KServe's LLMInferenceService controller does
not read a claim name for a LoRA adapter, it recomputes `<cache>-<nodeGroup>` (KServe #5690,
`pvcNameForNodeGroup`). So `serving_pvc` is KServe's plain join whenever that is a valid
name (a DNS-1123 subdomain of at most 253 characters), ambiguous or not. The ambiguity is
handled where it can bite, in one namespace at plan time: the first cache whose claim holds
the name keeps it; another cache whose derivation gives the same name finds it held by a
claim that is not provably its own (`controllers.adoption`), leaves it alone and reports
`Degraded`/`VolumeNameTaken` with a Warning Event naming the claim and its owner; two caches
never share a claim. Where the plain join is longer than 253 characters the claim gets the
hash-shortened name (the base model still works: it reads `localmodel-pvc-name`); a LoRA
adapter of that cache cannot be served from it: KServe's controller names a claim that does
not exist and the pods of that LLMInferenceService stay Pending (`persistentvolumeclaim
"<name>" not found`); the controller logs `lora_claim_name_not_plain`.

Migration: earlier versions hashed the serving PVC whenever the plain join was ambiguous
(`legacy_serving_pvc`). Such claims stay in place while an InferenceService or
LLMInferenceService of their namespace still names them in `localmodel-pvc-name` (its pods
mount them); the plain claim is made next to them with a PV of its own (`serving_pv` gives
the plain claim's PV a hashed name of its own role wherever the two claim names differ), and
the old pair is deleted once no user names it (a pod that still mounts it holds the claim
Terminating until it ends, pvc-protection).
"""

from __future__ import annotations

import hashlib
import re
from typing import Final, Literal

MAX_NAME: Final = 253
"""DNS-1123 subdomain: the limit of PV and PVC names."""
HASH_LENGTH: Final = 12
MARK: Final = "--"
"""Separates a shortened prefix from the hash; never part of a name kept in KServe's form."""
DOWNLOAD: Final = "download"

Role = Literal[
    "serving-pvc",
    "cluster-download-pvc",
    "namespace-download-pvc",
    "cluster-download-pv",
    "namespace-download-pv",
    "serving-pv",
    "plain-serving-pv",
]

_SUBDOMAIN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _keepable(part: str, *, single_word: bool) -> bool:
    return (
        bool(part)
        and part != DOWNLOAD
        and MARK not in part
        and not part.startswith("-")
        and not part.endswith("-")
        and not (single_word and "-" in part)
    )


def _derive(role: Role, parts: tuple[str, ...], *, words: tuple[bool, ...], suffix: str) -> str:
    """KServe's form of `parts` (+ `suffix`) when kept (module docstring), else shortened;
    `words[i]` says whether part i must be a single word for the form to be kept."""
    plain = "-".join([*parts, suffix] if suffix else parts)
    if len(plain) <= MAX_NAME and all(
        _keepable(part, single_word=word) for part, word in zip(parts, words, strict=True)
    ):
        return plain
    return _hashed(role, parts, plain)


def _hashed(role: Role, parts: tuple[str, ...], plain: str) -> str:
    digest = hashlib.sha256("\n".join([role, *parts]).encode("utf-8")).hexdigest()
    head = plain[: MAX_NAME - len(MARK) - HASH_LENGTH].rstrip("-.")
    return f"{head}{MARK}{digest[:HASH_LENGTH]}"


def is_valid_name(name: str) -> bool:
    """A DNS-1123 subdomain: what PV and PVC names must be."""
    return len(name) <= MAX_NAME and _SUBDOMAIN.fullmatch(name) is not None


def plain_serving_pvc(cache: str, group: str) -> str:
    """`{cache}-{group}` as KServe's LLMInferenceService controller computes it for a LoRA
    adapter (whether or not it is a valid name)."""
    return f"{cache}-{group}"


def serving_pvc(cache: str, group: str) -> str:
    """`{cache}-{group}` wherever that is a valid name (module docstring), else shortened:
    the serving PVC in each namespace with users of the cache (both kinds)."""
    plain = plain_serving_pvc(cache, group)
    if is_valid_name(plain):
        return plain
    return legacy_serving_pvc(cache, group)


def legacy_serving_pvc(cache: str, group: str) -> str:
    """The serving PVC's name before issue 21: KServe's form only when unambiguous."""
    return _derive("serving-pvc", (cache, group), words=(False, True), suffix="")


def download_pvc(cache: str, group: str, *, namespaced: bool) -> str:
    """`{cache}-{group}-download` in a namespace cache's namespace; `{cache}-{group}` in
    jobNamespace for a cluster cache."""
    if namespaced:
        return _derive(
            "namespace-download-pvc", (cache, group), words=(False, True), suffix=DOWNLOAD
        )
    return _derive("cluster-download-pvc", (cache, group), words=(False, True), suffix="")


def download_pv(cache: str, group: str, namespace: str | None) -> str:
    """`{cache}-{group}-{ns}-download` for a namespace cache, `{cache}-{group}-download` for
    a cluster cache (`namespace` None or empty)."""
    if namespace:
        return _derive(
            "namespace-download-pv",
            (cache, group, namespace),
            words=(True, True, True),
            suffix=DOWNLOAD,
        )
    return _derive("cluster-download-pv", (cache, group), words=(True, True), suffix=DOWNLOAD)


def serving_pv(cache: str, group: str, namespace: str) -> str:
    """`{cache}-{group}-{ns}`: the serving PV for the users of `namespace`, bound to
    `serving_pvc`. Where that claim name differs from `legacy_serving_pvc`, the PV's name is
    hashed under a role of its own, so the old pair (`legacy_serving_pv`) can stay beside it
    during a migration (module docstring)."""
    if serving_pvc(cache, group) == legacy_serving_pvc(cache, group):
        return legacy_serving_pv(cache, group, namespace)
    parts = (cache, group, namespace)
    return _hashed("plain-serving-pv", parts, "-".join(parts))


def legacy_serving_pv(cache: str, group: str, namespace: str) -> str:
    """The serving PV's name before issue 21 (bound to `legacy_serving_pvc`)."""
    return _derive("serving-pv", (cache, group, namespace), words=(False, True, True), suffix="")

"""A shared-volume namespace cache's import Job (`spec.pvcRef`, KServe #6107), as pure
functions: its name, its spec hash, the batch/v1 Job in Kubernetes JSON, and what its pod
reports (progress and the placed size). No I/O.

Contract of `build_import_job` (KServe's Job, field for field, plus localcache's atomic
placement, `download.importlayout`):
- name `import_job_name(cache)` (KServe's `importJobName`), in the cache's namespace;
  annotations `ANNOTATION_PVC_UID` (the claim's uid), `ANNOTATION_STORAGE_KEY`,
  `ANNOTATION_SPEC_HASH` (`import_spec_hash`); labels `model` and `modelNamespace` (label
  values, hash-shortened past 63 characters: `caching.labels`); a controller ownerReference to
  the cache with its uid; `parallelism` 1, `completions` 1, `backoffLimit` 2, no
  `ttlSecondsAfterFinished` (the finished Job is the evidence), no node selector (any node
  that mounts the claim), `podReplacementPolicy: Failed` (a failed pod's successor starts only
  once it has stopped, so two pods never write the same staging folder).
- The claim is the volume `CLAIM_VOLUME`. Containers, in order:
  init `prepare` and init `progress` (a native sidecar, `restartPolicy: Always`) and main
  `place` run `image` (localcache's) with `subPath: models` at `CLAIM_MOUNT`:
  `localcache import prepare|place --models /mnt/claim --key <key>`,
  `localcache import progress --dir /mnt/claim/.localcache-import/<key>/data`;
  init `DOWNLOAD_CONTAINER` is `container` (`caching.downloadcontainer.select_container`,
  renamed to `DOWNLOAD_CONTAINER` so its status is found by name) with
  `args [uri, /mnt/models]`, the claim at `/mnt/models` with `subPath`
  `models/.localcache-import/<key>/data` (it sees only its staging folder),
  `terminationMessagePolicy: FallbackToLogsOnError` (publish only `caching.jobfailures`' gist),
  the download layers then the cache's own `spec.download` (`downloadenv.tenant_layer`:
  tuning variables only) through `downloadenv.apply`, and the credentials of `injection`
  (env by reference and volumes appended, never copied values).
- Pod Security `restricted`: RuntimeDefault seccomp, no privilege escalation, every capability
  dropped, `runAsNonRoot`, every container (the download container's own identity overridden)
  as `RUN_AS_USER` (localcache image's uid), so what one pod writes the next can remove; HOME
  is /tmp for the download container (images whose user has a home only under their own uid).
  `fsGroup` (and `runAsGroup`) only from `localModel.sharedPVCImportFSGroup`; the global
  `fsGroup` is not used (KServe's rule).
- The pod runs as `injection.service_account_name` when set; `injection.pod_labels` are added
  to the pod's labels.

`progress_from_log` and `placed_from_message` read the pod's own output: a tenant controls
it (the pod runs in its namespace), so both are bounded, accept only the exact JSON shape
the program writes with sane numbers, and answer None for anything else.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from localcache.api import groupversion, modelcache
from localcache.api.download import DownloadSpec
from localcache.caching import config, credentials, downloadcontainer, downloadenv, labels
from localcache.download import importlayout

IMPORT_JOB_SUFFIX: Final = "-import"
ANNOTATION_PVC_UID: Final = "serving.kserve.io/import-pvc-uid"
ANNOTATION_STORAGE_KEY: Final = "serving.kserve.io/import-storage-key"
ANNOTATION_SPEC_HASH: Final = "serving.kserve.io/import-spec-hash"
LABEL_MODEL: Final = "model"
LABEL_MODEL_NAMESPACE: Final = "modelNamespace"
LABEL_IMPORT: Final = "localcache.kserve.io/import"
"""On the Job only: the controller's Job policies select Jobs by it (a tenant's own Jobs, without
it, are never looked at; a policy's params are looked up before its match conditions)."""

PREPARE_CONTAINER: Final = "prepare"
PROGRESS_CONTAINER: Final = "progress"
DOWNLOAD_CONTAINER: Final = downloadcontainer.CONTAINER_NAME
PLACE_CONTAINER: Final = "place"

CLAIM_VOLUME: Final = "kserve-pvc-source"
CLAIM_MOUNT: Final = "/mnt/claim"
DOWNLOAD_MOUNT: Final = "/mnt/models"
RUN_AS_USER: Final = 65532
"""The localcache image's uid (Dockerfile `USER`): every container of the pod runs as it."""
BACKOFF_LIMIT: Final = 2
_MAX_NAME: Final = 63
_HASH_CHARS: Final = 8

RESTRICTED_CONTAINER: Final = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "capabilities": {"drop": ["ALL"]},
}
PROGRAM_RESOURCES: Final = {
    "requests": {"cpu": "10m", "memory": "64Mi"},
    "limits": {"cpu": "500m", "memory": "256Mi"},
}
"""Our three containers: a Python interpreter walking or renaming folders."""

MAX_LOG_CHARS: Final = 65536
"""Of a progress log, only the tail this long is read."""
MAX_LINE_CHARS: Final = 256
MAX_REPORTED_BYTES: Final = 2**53 - 1
MAX_REPORTED_FILES: Final = 10**9


def import_job_name(cache_name: str) -> str:
    """`<cache>-import`; past 63 characters the cache name is cut (trailing `-` stripped) and
    8 hex characters of its SHA-256 added: `<prefix>-<hash>-import` (KServe's rule)."""
    name = cache_name + IMPORT_JOB_SUFFIX
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(cache_name.encode("utf-8")).hexdigest()[:_HASH_CHARS]
    keep = _MAX_NAME - len(IMPORT_JOB_SUFFIX) - 1 - _HASH_CHARS
    return f"{cache_name[:keep].rstrip('-')}-{digest}{IMPORT_JOB_SUFFIX}"


def _go_json(value: Any) -> str:
    """JSON as Go's `json.Marshal` writes it: compact, UTF-8, `<`, `>`, `&`, U+2028 and
    U+2029 escaped (map keys sorted by the caller)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for raw, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(raw, escaped)
    return text


def import_spec_hash(spec: modelcache.LocalModelNamespaceCacheSpec) -> str:
    """SHA-256 hex of the spec fields that shape the import's credentials
    (`serviceAccountName`, `storage`), serialised as KServe does, so the same spec hashes the
    same in both and a changed one differs."""
    storage: dict[str, Any] | None = None
    if spec.storage is not None:
        storage = {}
        if spec.storage.key is not None:
            storage["key"] = spec.storage.key
        if spec.storage.parameters is not None:
            storage["parameters"] = dict(sorted(spec.storage.parameters.items()))
    payload = {"serviceAccountName": spec.service_account_name or "", "storage": storage}
    return hashlib.sha256(_go_json(payload).encode("utf-8", "replace")).hexdigest()


def _program(name: str, image: str, args: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "command": ["localcache", "import", *args],
        "resources": copy.deepcopy(PROGRAM_RESOURCES),
        "securityContext": dict(RESTRICTED_CONTAINER),
        "volumeMounts": [
            {"name": CLAIM_VOLUME, "mountPath": CLAIM_MOUNT, "subPath": importlayout.MODELS}
        ],
    }


def _download_container(
    container: dict[str, Any],
    *,
    storage_key: str,
    injection: credentials.Injection,
    layers: Sequence[DownloadSpec | None],
    identity: dict[str, Any],
) -> dict[str, Any]:
    main = downloadenv.apply(
        container, layers, injected=[str(e.get("name")) for e in injection.env]
    )
    main["name"] = DOWNLOAD_CONTAINER
    main["args"] = [injection.uri, DOWNLOAD_MOUNT]
    env = [*(main.get("env") or []), *copy.deepcopy(list(injection.env))]
    if not any(e.get("name") == "HOME" for e in env):
        env.append({"name": "HOME", "value": "/tmp"})
    main["env"] = env
    main["volumeMounts"] = [
        {
            "name": CLAIM_VOLUME,
            "mountPath": DOWNLOAD_MOUNT,
            "readOnly": False,
            "subPath": importlayout.data_subpath(storage_key),
        },
        *copy.deepcopy(list(injection.volume_mounts)),
    ]
    main["terminationMessagePolicy"] = "FallbackToLogsOnError"
    own = main.get("securityContext")
    main["securityContext"] = {
        **(own if isinstance(own, dict) else {}),
        **RESTRICTED_CONTAINER,
        **identity,
    }
    return main


def build_import_job(
    *,
    cache: modelcache.LocalModelNamespaceCache,
    claim_uid: str,
    storage_key: str,
    container: dict[str, Any],
    injection: credentials.Injection,
    local_model: config.LocalModelConfig,
    image: str,
    download: Sequence[DownloadSpec | None] = (),
) -> dict[str, Any]:
    """The import Job of `cache` onto the claim of uid `claim_uid` (module contract).
    `download` are layers applied before the cache's own `spec.download`, which this function
    applies itself (tenant variables only): do not pass it again. `ValueError` when the cache
    is not a shared-volume cache, has no uid, or `storage_key` is not a safe key."""
    spec = cache.spec
    if spec.pvc_ref is None:
        raise ValueError(f"cache {cache.name!r} has no spec.pvcRef")
    if not cache.metadata.uid or not cache.metadata.namespace:
        raise ValueError(f"cache {cache.name!r} has no uid or namespace")
    importlayout.check_key(storage_key)
    namespace = cache.metadata.namespace
    job_labels = {
        LABEL_MODEL: labels.value(cache.name),
        LABEL_MODEL_NAMESPACE: labels.value(namespace),
    }
    identity: dict[str, Any] = {"runAsUser": RUN_AS_USER, "runAsNonRoot": True}
    fs_group = local_model.shared_pvc_import_fs_group
    if fs_group is not None:
        identity["runAsGroup"] = fs_group
    pod_security: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}, **identity}
    if fs_group is not None:
        pod_security["fsGroup"] = fs_group
    key_args = ["--models", CLAIM_MOUNT, "--key", storage_key]
    data_dir = f"{CLAIM_MOUNT}/{importlayout.staging(storage_key)}/{importlayout.DATA}"
    progress = _program(PROGRESS_CONTAINER, image, ["progress", "--dir", data_dir])
    progress["restartPolicy"] = "Always"
    fetch = _download_container(
        container,
        storage_key=storage_key,
        injection=injection,
        layers=[*download, downloadenv.tenant_layer(spec.download)],
        identity=identity,
    )
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "securityContext": pod_security,
        "initContainers": [
            _program(PREPARE_CONTAINER, image, ["prepare", *key_args]),
            progress,
            fetch,
        ],
        "containers": [_program(PLACE_CONTAINER, image, ["place", *key_args])],
        "volumes": [
            {"name": CLAIM_VOLUME, "persistentVolumeClaim": {"claimName": spec.pvc_ref}},
            *copy.deepcopy(list(injection.volumes)),
        ],
    }
    if injection.service_account_name:
        pod_spec["serviceAccountName"] = injection.service_account_name
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": import_job_name(cache.name),
            "namespace": namespace,
            "labels": {**job_labels, LABEL_IMPORT: "true"},
            "annotations": {
                ANNOTATION_PVC_UID: claim_uid,
                ANNOTATION_STORAGE_KEY: storage_key,
                ANNOTATION_SPEC_HASH: import_spec_hash(spec),
            },
            "ownerReferences": [
                {
                    "apiVersion": groupversion.LOCAL_MODEL_NAMESPACE_CACHE.api_version,
                    "kind": groupversion.LOCAL_MODEL_NAMESPACE_CACHE.kind,
                    "name": cache.name,
                    "uid": cache.metadata.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": BACKOFF_LIMIT,
            "podReplacementPolicy": "Failed",
            "template": {
                "metadata": {"labels": {**job_labels, **injection.pod_labels}},
                "spec": pod_spec,
            },
        },
    }


@dataclass(frozen=True)
class Progress:
    """What the import pod reported: bytes and regular files under its folder."""

    bytes: int
    files: int


def _parse_line(line: str) -> Progress | None:
    line = line.strip()
    if not line.startswith("{") or len(line) > MAX_LINE_CHARS:
        return None
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict) or set(data) != {"bytes", "files"}:
        return None
    size, files = data["bytes"], data["files"]
    if type(size) is not int or type(files) is not int:  # bool and float are refused
        return None
    if not (0 <= size <= MAX_REPORTED_BYTES and 0 <= files <= MAX_REPORTED_FILES):
        return None
    return Progress(bytes=size, files=files)


def progress_from_log(text: str) -> Progress | None:
    """The last `{"bytes": N, "files": M}` line of the progress sidecar's log (only its last
    `MAX_LOG_CHARS` are read); None when there is none. Other lines are skipped."""
    for line in reversed(text[-MAX_LOG_CHARS:].splitlines()):
        if (found := _parse_line(line)) is not None:
            return found
    return None


def placed_from_message(message: str) -> Progress | None:
    """The size the `place` container wrote as its termination message (its last non-blank
    line, that exact JSON shape); None for anything else (e.g. a failure's one line)."""
    lines = [line for line in message[-MAX_LOG_CHARS:].splitlines() if line.strip()]
    return _parse_line(lines[-1]) if lines else None

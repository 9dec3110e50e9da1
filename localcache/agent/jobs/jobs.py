"""Download Job construction: pure functions from entry, node, node group, config and
credentials to a batch/v1 Job in Kubernetes JSON (reference §4.4, spec §5 "Job shape").

Contract:
- `job_name` is `lmd-<storage key>-<tag>-<attempt>-<random suffix>`: the tag (64 bits of a
  hash of node and credential scope) says which scope the Job downloads in; the suffix makes
  each name new, so a Job someone else created first never blocks a download. The agent
  finds its Jobs again by the uids it records (`agent.jobs.trust`), never by name.
- The container's `terminationMessagePolicy` is always `FallbackToLogsOnError`: KServe's
  storage initializer writes no termination message, so the kubelet keeps the tail of its log
  there; the agent publishes only the fixed-vocabulary gist of such a text
  (`caching.jobfailures`), never the log lines themselves.
- The Job runs in the entry's namespace (namespace cache) or `jobNamespace` (cluster cache),
  mounts the entry's download PVC with `subPath` = its staging folder (`layout.staging_subpath`)
  at `/mnt/models`, and downloads `[uri, /mnt/models]`; the agent promotes the staging folder
  after success. The pod sees only its staging folder, never other models.
- The pod meets Pod Security `restricted` (`RESTRICTED_CONTAINER`, RuntimeDefault seccomp,
  non-root when the agent's uid is given).
- The pod is pinned with `nodeSelector` `kubernetes.io/hostname`, gets `fsGroup`, the node
  group's tolerations, `storageInitializer` resources (unless a ClusterStorageContainer sets
  its own), the Hugging Face variables KServe sets and the node group's and cache's
  `spec.download` (`caching.downloadenv`), the injected credentials (env and volumes appended
  to the container's own), the named ServiceAccount, `restartPolicy: Never`,
  `ttlSecondsAfterFinished`, and a controller ownerReference to the LocalModelNode.
- Labels `model`, `node`, `modelNamespace` (namespace entries) and `storageKey` are valid label
  values whatever the names' length: longer than 63 characters they are cut and suffixed with
  a hash (`label_value`), so selectors must use `label_value` too.
"""

from __future__ import annotations

import copy
import hashlib
import re
import secrets
from collections.abc import Hashable, Sequence
from typing import Any, Final

from localcache.agent.disk import layout
from localcache.api import download as download_api
from localcache.api import groupversion, modelnode, nodegroup
from localcache.caching import config, credentials, downloadcontainer, downloadenv, labels, names

CONTAINER_NAME: Final = downloadcontainer.CONTAINER_NAME
VOLUME_NAME: Final = "kserve-pvc-source"
MOUNT_PATH: Final = "/mnt/models"
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
LABEL_MODEL: Final = "model"
LABEL_NODE: Final = "node"
LABEL_MODEL_NAMESPACE: Final = "modelNamespace"
LABEL_STORAGE_KEY: Final = "storageKey"
_NAME_PREFIX: Final = "lmd"
RESTRICTED_CONTAINER: Final = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "capabilities": {"drop": ["ALL"]},
}
TAG_LENGTH: Final = 16
"""Hex characters of the scope tag in Job names (64 bits)."""
SUFFIX_LENGTH: Final = 8
_SUFFIX_ALPHABET: Final = "abcdefghijklmnopqrstuvwxyz0123456789"
_SUFFIX = re.compile(rf"[a-z0-9]{{{SUFFIX_LENGTH}}}")


def _digest(text: str, length: int = 8) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


label_value = labels.value
"""`value` as a valid label value (`caching.labels.value`)."""


def job_name(
    *, storage_key: str, node_name: str, attempt: int, scope: Hashable | None, suffix: str
) -> str:
    """`lmd-<storage key>-<tag>-<attempt>-<suffix>`, where the tag is 64 bits of a hash of
    node and scope and `suffix` is random (`name_suffix`): a name nobody can take first."""
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, got {attempt}")
    if not _SUFFIX.fullmatch(suffix):
        raise ValueError(f"suffix must be {SUFFIX_LENGTH} of [a-z0-9], got {suffix!r}")
    return (
        f"{job_tag(storage_key=storage_key, node_name=node_name, scope=scope)}-{attempt}-{suffix}"
    )


def job_tag(*, storage_key: str, node_name: str, scope: Hashable | None) -> str:
    """`lmd-<storage key>-<tag>`: the Job names of one download unit without attempt and
    suffix."""
    return f"{_NAME_PREFIX}-{storage_key}-{_digest(f'{node_name}|{scope!r}', TAG_LENGTH)}"


def name_suffix() -> str:
    """A random Job-name suffix (`SUFFIX_LENGTH` characters of [a-z0-9])."""
    return "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(SUFFIX_LENGTH))


def job_namespace(entry: modelnode.LocalModelInfo, local_model: config.LocalModelConfig) -> str:
    """A namespace entry's Job runs in its namespace; a cluster entry's in `jobNamespace`."""
    return entry.namespace or local_model.job_namespace


def download_pvc_name(entry: modelnode.LocalModelInfo, node_group: str) -> str:
    """The download PVC the controller creates for this entry (spec §3, reference §2.2):
    `{cache}-{group}` in jobNamespace, `{cache}-{group}-download` in a namespace cache's
    namespace; hash-shortened like the controller's (`caching.names`)."""
    return names.download_pvc(entry.model_name, node_group, namespaced=bool(entry.namespace))


def job_labels(
    entry: modelnode.LocalModelInfo, *, node_name: str, storage_key: str
) -> dict[str, str]:
    """The labels that identify a download Job (and select it, with `label_value`)."""
    labels = {
        LABEL_MODEL: label_value(entry.model_name),
        LABEL_NODE: label_value(node_name),
        LABEL_STORAGE_KEY: storage_key,
    }
    if entry.namespace:
        labels[LABEL_MODEL_NAMESPACE] = label_value(entry.namespace)
    return labels


def build_job(
    *,
    entry: modelnode.LocalModelInfo,
    node: modelnode.LocalModelNode,
    node_group: nodegroup.LocalModelNodeGroup,
    storage_key: str,
    attempt: int,
    container: dict[str, Any],
    injection: credentials.Injection,
    local_model: config.LocalModelConfig,
    scope: Hashable | None = None,
    backoff_limit: int | None = None,
    suffix: str,
    run_as_user: int | None = None,
    download: Sequence[download_api.DownloadSpec | None] = (),
) -> dict[str, Any]:
    """The download Job for `entry` on `node` (see the module contract). `container` comes
    from `downloadcontainer.select_container`, `injection` from `credentials.resolve`, `scope` from
    `credentials.credential_scope`, `download` is the node group's and the cache's
    `spec.download` (`caching.downloadenv.apply`: later wins, credentials are never replaced)."""
    node_name = node.name
    name = job_name(
        storage_key=storage_key, node_name=node_name, attempt=attempt, scope=scope, suffix=suffix
    )
    labels = job_labels(entry, node_name=node_name, storage_key=storage_key)
    main = downloadenv.apply(
        container, download, injected=[str(e.get("name")) for e in injection.env]
    )
    main["args"] = [injection.uri, MOUNT_PATH]
    main["env"] = [*(main.get("env") or []), *copy.deepcopy(list(injection.env))]
    main["volumeMounts"] = [
        {
            "name": VOLUME_NAME,
            "mountPath": MOUNT_PATH,
            "readOnly": False,
            "subPath": layout.staging_subpath(storage_key, name),
        },
        *copy.deepcopy(list(injection.volume_mounts)),
    ]
    # The log tail when the program writes no termination message (KServe's storage
    # initializer): the agent reads only its gist (`jobfailures.gist`, a fixed vocabulary), so a
    # tenant's pod logs never reach the cluster-scoped LocalModelNode status or Events.
    main["terminationMessagePolicy"] = "FallbackToLogsOnError"
    if not main["env"]:
        del main["env"]
    claim = download_pvc_name(entry, node_group.name)
    pod_spec: dict[str, Any] = {
        "nodeSelector": {HOSTNAME_LABEL: node_name},
        "restartPolicy": "Never",
        "containers": [main],
        "volumes": [
            {"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": claim}},
            *copy.deepcopy(list(injection.volumes)),
        ],
    }
    # Pod Security `restricted` (the job namespace enforces it): no privilege escalation, no
    # capability, the runtime's seccomp profile; a container template asking for more is
    # overridden, and the agent's Job-shape policy refuses any Job that asks for more.
    pod_spec["securityContext"] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if local_model.fs_group is not None:
        pod_spec["securityContext"]["fsGroup"] = local_model.fs_group
    main_security = main.get("securityContext")
    main["securityContext"] = {
        **(main_security if isinstance(main_security, dict) else {}),
        **RESTRICTED_CONTAINER,
    }
    if run_as_user is not None:
        # The agent's uid (issue 13 bug 4): the agent owns what the pod writes, so it can set
        # the promoted modes and delete the folder later. HOME is made writable for images
        # (KServe's storage initializer) whose user has a home only under their own uid.
        # A ClusterStorageContainer's own runAsUser/runAsGroup would win over the pod's, and
        # leave folders the agent cannot delete: the container gets the same identity.
        identity: dict[str, Any] = {"runAsUser": run_as_user, "runAsNonRoot": True}
        if local_model.fs_group is not None:
            identity["runAsGroup"] = local_model.fs_group
        pod_spec["securityContext"].update(identity)
        main["securityContext"].update(identity)
        if not any(e.get("name") == "HOME" for e in main.get("env") or []):
            main["env"] = [*(main.get("env") or []), {"name": "HOME", "value": "/tmp"}]
    if node_group.spec.tolerations:
        pod_spec["tolerations"] = [t.to_dict() for t in node_group.spec.tolerations]
    if injection.service_account_name:
        pod_spec["serviceAccountName"] = injection.service_account_name
    job_spec: dict[str, Any] = {
        "ttlSecondsAfterFinished": local_model.job_ttl_seconds_after_finished,
        "template": {
            "metadata": {"labels": {**labels, **injection.pod_labels}},
            "spec": pod_spec,
        },
    }
    if backoff_limit is not None:
        job_spec["backoffLimit"] = backoff_limit
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": job_namespace(entry, local_model),
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": groupversion.LOCAL_MODEL_NODE.api_version,
                    "kind": groupversion.LOCAL_MODEL_NODE.kind,
                    "name": node_name,
                    "uid": node.metadata.uid or "",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": job_spec,
    }

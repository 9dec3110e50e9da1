"""The peer-mode download Job: a pure transform of the origin Job (`jobs.build_job`) into one
whose pod fetches the model from peer nodes (`localcache fetch`, design "Peer-mode Job").

`peer_job(origin, ...)` returns a new Job (the input is not mutated) that keeps the origin
Job's name, labels, namespace, ownerReference, volumes' download PVC and staging `subPath`,
securityContext, nodeSelector, tolerations, ServiceAccount (`default` made explicit when the
origin names none: a projected token needs a named one), restart policy, TTL and backoff
limit, and changes only:
- label `localcache.kserve.io/peer-fetch: "true"` on the Job and its pod template;
- the download container: image `image` (the agent's `--peer-image`), command
  `["localcache", "fetch"]` and the fetcher's arguments (`fetch_args`), env
  `LOCALCACHE_PEER_CA` (the CA certificate, public) plus the container's literal env (no
  `valueFrom`, no `envFrom`),
  the staging mount plus the projected ServiceAccount token (audience `localcache-peer`,
  600 s) at `/var/run/secrets/localcache/peer`;
- `automountServiceAccountToken: false` (the audience-bound token is the only one mounted);
- no credential env, volumes or mounts (the `credentials.Injection` the origin Job carried
  is taken out again by name), no resources of the storage initializer's beyond its own;
  except with `prove_uri` (its sources hold the model for other scopes): the pod keeps the
  origin Job's credentials (env, `envFrom`, volumes), which sign the presigned HEADs of its
  proof at the origin, and gets `--prove-s3 <uri>`;
- `--resume-origin <uri>` for an `http(s)://` model the origin Job reads without credentials
  and stores as it is: a file the peers break off is finished from the origin by Range.

`is_peer(job)` says whether a Job carries the peer-fetch label (the agent's own Jobs only are
read this way: they are matched by uid first, `agent.jobs.trust`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Final

from localcache.agent.jobs import jobs
from localcache.api import nodegroup, originpaths, peer
from localcache.caching import credentials

Obj = dict[str, Any]

PEER_LABEL: Final = "localcache.kserve.io/peer-fetch"
CA_ENV: Final = "LOCALCACHE_PEER_CA"
TOKEN_VOLUME: Final = "localcache-peer-token"
TOKEN_DIR: Final = "/var/run/secrets/localcache/peer"
TOKEN_FILE: Final = "token"
TOKEN_PATH: Final = f"{TOKEN_DIR}/{TOKEN_FILE}"
TOKEN_EXPIRATION_S: Final = 600
REPORT_PATH: Final = "/dev/termination-log"
COMMAND: Final = ("localcache", "fetch")
CONTAINER: Final = jobs.CONTAINER_NAME
DEFAULT_SERVICE_ACCOUNT: Final = "default"
SEED_FILES_ENV: Final = "S3_MAX_FILE_CONCURRENCY"
SEED_FILES: Final = "2"
SUMS_LABEL: Final = "localcache.kserve.io/origin-sums"
SUMS_CONTAINER: Final = "origin-sums"
SUMS_COMMAND: Final = ("localcache", "origin-sums")
SUMS_RESOURCES: Final = {
    "requests": {"cpu": "10m", "memory": "64Mi"},
    "limits": {"cpu": "500m", "memory": "256Mi"},
}
_SUMS_KEEPS: Final = ("env", "envFrom", "volumeMounts", "securityContext")
SEED_GRACE_S: Final = originpaths.SUMS_DEADLINE_S + 30
"""A seed pod's termination grace: its sidecar holds SIGTERM until it has the origin's answer."""


def is_peer(job: Mapping[str, Any]) -> bool:
    """Whether `job` is a peer-mode Job (its label)."""
    return _labelled(job, PEER_LABEL)


def is_seed(job: Mapping[str, Any]) -> bool:
    """Whether `job` is an origin Job with the checksum sidecar (`seed_job`, its label)."""
    return _labelled(job, SUMS_LABEL)


def unchecked_origin(job: Mapping[str, Any], uri: str) -> bool:
    """Whether `job` downloaded an `s3://` model from the origin without the checksum sidecar
    (`seed_job`: peer distribution off at its launch, a fallback after a seed did not start
    or was refused, no peer image): nothing checked its copy against the checksums the
    origin stores, so it is served to no peer, also once peer distribution is on. Decided
    by the Job alone, never by the node group at promotion (missing, or changed since)."""
    return uri.startswith("s3://") and not is_peer(job) and not is_seed(job)


def _labelled(job: Mapping[str, Any], label: str) -> bool:
    labels = (job.get("metadata") or {}).get("labels") or {}
    return isinstance(labels, Mapping) and labels.get(label) == "true"


def fetch_args(
    *,
    storage_key: str,
    digest: str,
    sources: Sequence[tuple[str, str]],
    max_size: int,
    prove_uri: str | None = None,
    resume_uri: str | None = None,
) -> list[str]:
    """The `localcache fetch` arguments: key, digest, ranked sources, token, CA, bound,
    report and destination."""
    if not sources:
        raise ValueError("a peer-mode Job needs at least one source")
    args = ["--storage-key", storage_key, "--digest", digest]
    for node, endpoint in sources[: peer.MAX_SOURCES]:
        args += ["--source", f"{node}={endpoint}"]
    if prove_uri is not None:
        args += ["--prove-s3", prove_uri]
    if resume_uri is not None:
        args += ["--resume-origin", resume_uri]
    return [
        *args,
        "--token-file", TOKEN_PATH,
        "--ca-env", CA_ENV,
        "--max-size", str(max_size),
        "--report", REPORT_PATH,
        jobs.MOUNT_PATH,
    ]  # fmt: skip


def peer_job(
    origin: Obj,
    injection: credentials.Injection,
    *,
    image: str,
    storage_key: str,
    digest: str,
    sources: Sequence[tuple[str, str]],
    ca_pem: str,
    max_size: int,
    prove_uri: str | None = None,
) -> Obj:
    """The peer-mode Job of `origin` (see the module docstring); `injection` is what
    `build_job` injected into it (taken out here, kept when the pod proves access to
    `prove_uri` at the origin)."""
    if not image:
        raise ValueError("a peer-mode Job needs the agent's --peer-image")
    job = copy.deepcopy(origin)
    job["metadata"]["labels"] = {**(job["metadata"].get("labels") or {}), PEER_LABEL: "true"}
    template = job["spec"]["template"]
    template["metadata"]["labels"] = {**template["metadata"].get("labels", {}), PEER_LABEL: "true"}
    pod = template["spec"]
    # A projected token needs a named ServiceAccount (the admission plugin's default, made
    # explicit); the pod needs no other token than the audience-bound one.
    pod.setdefault("serviceAccountName", DEFAULT_SERVICE_ACCOUNT)
    pod["automountServiceAccountToken"] = False
    resume_uri = _resumable(injection) if prove_uri is None else None
    if prove_uri is not None:  # its credentials sign the proof's HEADs
        injection = credentials.Injection(uri=injection.uri)
    secret_volumes = {str(v.get("name")) for v in injection.volumes}
    pod["volumes"] = [
        *(v for v in pod.get("volumes") or [] if v.get("name") not in secret_volumes),
        _token_volume(),
    ]
    main = _download_container(pod["containers"])
    main["name"] = CONTAINER  # a ClusterStorageContainer's own name: the pod report is read here
    secret_env = {str(e.get("name")) for e in injection.env}
    env = [
        e
        for e in main.get("env") or []
        if e.get("name") not in secret_env | {CA_ENV}
        and ("valueFrom" not in e or prove_uri is not None)
    ]
    main["env"] = [*env, {"name": CA_ENV, "value": ca_pem}]
    if prove_uri is None:
        main.pop("envFrom", None)
    secret_mounts = {str(m.get("name")) for m in injection.volume_mounts} | secret_volumes
    main["volumeMounts"] = [
        *(m for m in main.get("volumeMounts") or [] if m.get("name") not in secret_mounts),
        {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True},
    ]
    main["image"] = image
    main["command"] = list(COMMAND)
    main["args"] = fetch_args(
        storage_key=storage_key,
        digest=digest,
        sources=sources,
        max_size=max_size,
        prove_uri=prove_uri,
        resume_uri=resume_uri,
    )
    return job


def _download_container(containers: list[Obj]) -> Obj:
    """The download container: ours by name, or the only one (a ClusterStorageContainer keeps
    its own container name)."""
    main = next((c for c in containers if c.get("name") == CONTAINER), None)
    if main is None and len(containers) == 1:
        main = containers[0]
    if main is None:
        raise ValueError("a download Job whose download container cannot be told")
    return main


def _resumable(injection: credentials.Injection) -> str | None:
    """The URI a fetcher may finish a broken file from: one read without credentials whose
    bytes the storage initializer stores as they are (`api.originpaths.http_origin_path`)."""
    if injection.env or injection.volumes or injection.volume_mounts:
        return None
    try:
        originpaths.http_origin_path(injection.uri)
    except ValueError:
        return None
    return injection.uri


def _token_volume() -> Obj:
    return {
        "name": TOKEN_VOLUME,
        "projected": {
            "sources": [
                {
                    "serviceAccountToken": {
                        "audience": peer.TOKEN_AUDIENCE,
                        "expirationSeconds": TOKEN_EXPIRATION_S,
                        "path": TOKEN_FILE,
                    }
                }
            ]
        },
    }


def seed_job(job: Obj, group: nodegroup.LocalModelNodeGroup, uri: str, *, image: str = "") -> Obj:
    """The origin Job of an `s3://` model in a group with peer distribution: KServe's storage
    initializer fetches at most `SEED_FILES` objects at once (its default is 4), so that files
    become whole in turn, servable to the nodes following this one, rather than all near the
    end (the origin's total rate is the same). A value the Job already sets is kept. With the
    agent's peer `image`, a sidecar (an init container that keeps running, started before the
    download and beside it: it adds time only where its answer comes after the download's
    end) records the SHA-256 the origin stores for each
    object (`localcache origin-sums --sidecar`, `download.seedsums`) with the download
    container's env, credentials, mounts and security context, small resources of its own
    (`SUMS_RESOURCES`) and the image's default pull policy, and the pod a termination grace of
    at least `SEED_GRACE_S` (the sidecar finishes its answer before it stops, so that the Job
    completes with it); the Job carries the label
    `SUMS_LABEL` (the admission policies check that container's image and command). A Job whose
    download container cannot be told (several, none named `CONTAINER`) is unchanged."""
    spec = group.spec.peer_distribution
    if spec is None or not spec.enabled or not uri.startswith("s3://"):
        return job
    job = copy.deepcopy(job)
    pod = job["spec"]["template"]["spec"]
    try:
        main = _download_container(pod["containers"])
    except ValueError:
        return job
    env = main.setdefault("env", [])
    if not any(e.get("name") == SEED_FILES_ENV for e in env):
        env.append({"name": SEED_FILES_ENV, "value": SEED_FILES})
    if image:
        job["metadata"]["labels"] = {**(job["metadata"].get("labels") or {}), SUMS_LABEL: "true"}
        sums = {k: copy.deepcopy(main[k]) for k in _SUMS_KEEPS if k in main}
        sums |= {"name": SUMS_CONTAINER, "image": image, "command": list(SUMS_COMMAND)}
        sums |= {"restartPolicy": "Always", "resources": copy.deepcopy(SUMS_RESOURCES)}
        pod["initContainers"] = [{**sums, "args": [uri, jobs.MOUNT_PATH, "--sidecar"]}]
        grace = pod.get("terminationGracePeriodSeconds")
        pod["terminationGracePeriodSeconds"] = max(SEED_GRACE_S, grace or 0)
    return job

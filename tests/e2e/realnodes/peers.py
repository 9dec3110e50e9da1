"""What the peer data plane's real-node tests need (tests/e2e/realnodes/test_peer_distribution):

- node groups with `spec.peerDistribution`, and readers of what nodes publish about it
  (`status.peer`, `modelProgress[...].source/originBytes/peerBytes`), their Events and their
  agents' metrics (read through the apiserver's pod proxy);
- the origin's own count of what it served: the S3 store's request log (one line per request,
  with its status) and the HTTP model server's per-path byte counts;
- a caller of the agents' peer endpoints from a tenant's pod or Job (`PROBE`): it speaks TLS to
  `https://<pod IP>:8476` verifying the chain against the public CA (Secret
  `localcache-peer-tls`, key `ca.crt`) and the name `localcache-peer`, and asks for a manifest
  and files with each token it holds (none, garbage, its ServiceAccount's default token, its
  projected `localcache-peer` token), printing per request the status, the body's length and
  sha256 (never the body).
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from localcache.agent.disk import layout
from localcache.agent.jobs import jobs as jobs_mod
from localcache.api import groupversion
from localcache.api import inferenceservice as isvc_api
from localcache.api import peer as peer_api
from tests.e2e.realnodes import objects
from tests.e2e.realnodes.cluster import GROUP_LABEL, LOCALCACHE_IMAGE, SYSTEM_NS, Cluster

Obj = dict[str, Any]
LMN = groupversion.LOCAL_MODEL_NODE
PEER_FETCH_LABEL = "localcache.kserve.io/peer-fetch"
TOKEN_VOLUME = "localcache-peer-token"
TOKEN_DIR = "/var/run/secrets/localcache/peer"
PEER_TLS_SECRET = "localcache-peer-tls"
CA_ENV = "LOCALCACHE_PEER_CA"
AGENT_SELECTOR = "app.kubernetes.io/component=agent"
AGENT_METRICS_PORT = 8080

# ------------------------------------------------------------------------- node groups


def label_node(cluster: Cluster, node: str, value: str | None) -> None:
    """Set (or with None remove) the e2e group label on `node`."""
    change = f"{GROUP_LABEL}={value}" if value else f"{GROUP_LABEL}-"
    cluster.kubectl("label", "node", node, change, "--overwrite")


def peer_group(
    cluster: Cluster, name: str, *, selector: dict[str, str] | None = None, **knobs: object
) -> Obj:
    """`cluster.node_group` with `spec.peerDistribution: {enabled: true, **knobs}`."""
    group = cluster.node_group(name, selector=selector)
    group["spec"]["peerDistribution"] = {"enabled": True, **knobs}
    return group


def lmn_status(cluster: Cluster, node: str) -> Obj:
    status: Obj = (cluster.get(LMN.plural, node) or {}).get("status") or {}
    return status


def progress(cluster: Cluster, node: str, status_key: str) -> Obj:
    """`status.modelProgress[status_key]` of `node` (empty when absent)."""
    found: Obj = (lmn_status(cluster, node).get("modelProgress") or {}).get(status_key) or {}
    return found


def served(cluster: Cluster, node: str, storage_key: str) -> Obj | None:
    """The `status.peer.models` entry of `storage_key` on `node`, if it serves it."""
    peer = lmn_status(cluster, node).get("peer") or {}
    for model in peer.get("models") or []:
        if model.get("storageKey") == storage_key:
            found: Obj = model
            return found
    return None


def unservable(cluster: Cluster, node: str, storage_key: str) -> str | None:
    """The reason `node` lists `storage_key` in `status.peer.unservable`, if it does."""
    for entry in (lmn_status(cluster, node).get("peer") or {}).get("unservable") or []:
        if entry.get("storageKey") == storage_key:
            reason: str = entry.get("reason") or ""
            return reason
    return None


def endpoint(cluster: Cluster, node: str) -> str | None:
    found: str | None = (lmn_status(cluster, node).get("peer") or {}).get("endpoint")
    return found


def lmn_events(cluster: Cluster, node: str | None = None) -> list[Obj]:
    """Events about LocalModelNodes (`node`'s only, when given), oldest first."""
    found = [
        e
        for e in cluster.items("events", namespace="default")
        if e["involvedObject"].get("kind") == LMN.kind
        and (node is None or e["involvedObject"].get("name") == node)
    ]
    return sorted(found, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))


def describe_events(events: list[Obj]) -> list[str]:
    return [
        f"{e['involvedObject'].get('name')} {e.get('reason')}: {e.get('message')}" for e in events
    ]


def agent_pod(cluster: Cluster, node: str) -> Obj:
    for pod in cluster.items("pods", namespace=SYSTEM_NS, selector=AGENT_SELECTOR):
        if pod["spec"].get("nodeName") == node and not pod["metadata"].get("deletionTimestamp"):
            return pod
    raise AssertionError(f"no agent pod on {node}")


def agent_replaced(cluster: Cluster, node: str, killed: str) -> bool:
    """Whether an agent pod other than `killed` is Ready on `node`."""
    pod = agent_pod(cluster, node)
    ready = (cluster.condition(pod, "Ready") or {}).get("status") == "True"
    return ready and pod["metadata"]["name"] != killed


def agent_metrics(cluster: Cluster, node: str) -> str:
    """The Prometheus text of `node`'s agent, through the apiserver's pod proxy."""
    name = agent_pod(cluster, node)["metadata"]["name"]
    path = f"/api/v1/namespaces/{SYSTEM_NS}/pods/{name}:{AGENT_METRICS_PORT}/proxy/metrics"
    return cluster.kubectl("get", "--raw", path).stdout


def metric_total(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` (0 when none)."""
    total = 0.0
    pattern = re.compile(rf"^{re.escape(name)}(\{{(?P<labels>[^}}]*)\}})?\s+(?P<value>\S+)$")
    for line in text.splitlines():
        match = pattern.match(line)
        if match is None:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"] or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(match["value"])
    return total


def peer_ca(cluster: Cluster) -> str:
    """The peer CA certificate (PEM): public, every download pod gets it."""
    secret = cluster.get("secret", PEER_TLS_SECRET, namespace=SYSTEM_NS)
    assert secret is not None, f"no Secret {SYSTEM_NS}/{PEER_TLS_SECRET}"
    return base64.b64decode(secret["data"]["ca.crt"]).decode()


# ------------------------------------------------------------------------- Jobs


def download_jobs(cluster: Cluster, namespace: str, storage_key: str) -> list[Obj]:
    return cluster.items("jobs", namespace=namespace, selector=f"storageKey={storage_key}")


def is_peer_job(job: Obj) -> bool:
    return (job["metadata"].get("labels") or {}).get(PEER_FETCH_LABEL) == "true"


def peer_jobs_of(cluster: Cluster, namespace: str, storage_key: str, node: str) -> list[Obj]:
    """The peer-fetch Jobs of `storage_key` for `node`."""
    return [
        j
        for j in download_jobs(cluster, namespace, storage_key)
        if is_peer_job(j) and (j["metadata"].get("labels") or {}).get("node") == node
    ]


def staged_bytes(root: Path, storage_key: str, job: str) -> int:
    """The bytes `job` has staged so far under the models root `root` (seen from the host)."""
    folder = root / layout.staging_subpath(storage_key, job)
    if not folder.is_dir():
        return 0
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def peer_traits(job: Obj) -> list[str]:
    """What in `job` belongs to peer mode (empty for an origin Job of today's shape)."""
    traits = []
    if PEER_FETCH_LABEL in (job["metadata"].get("labels") or {}):
        traits.append(f"label {PEER_FETCH_LABEL}")
    spec = job["spec"]["template"]["spec"]
    for volume in spec.get("volumes") or []:
        sources = (volume.get("projected") or {}).get("sources") or []
        audiences = {(s.get("serviceAccountToken") or {}).get("audience") for s in sources}
        if volume.get("name") == TOKEN_VOLUME or peer_api.TOKEN_AUDIENCE in audiences:
            traits.append(f"volume {volume.get('name')}")
    for container in spec["containers"]:
        if container.get("command", [])[:2] == ["localcache", "fetch"]:
            traits.append("command localcache fetch")
        if any(e.get("name") == CA_ENV for e in container.get("env") or []):
            traits.append(f"env {CA_ENV}")
    return traits


def fetch_reports(cluster: Cluster, namespace: str, job: str) -> list[Obj]:
    """The termination messages (FetchReport JSON) of `job`'s pods that wrote one."""
    reports = []
    for pod in cluster.items("pods", namespace=namespace, selector=f"job-name={job}"):
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            message = ((status.get("state") or {}).get("terminated") or {}).get("message")
            if message:
                try:
                    reports.append(json.loads(message))
                except ValueError:
                    reports.append({"unparsed": message[:300]})
    return reports


# ------------------------------------------------------------------------- origins

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_REQUEST = re.compile(
    r'"(?P<method>[A-Z]+) (?P<path>/[^ ?"]*)(\?[^ "]*)? HTTP/[\d.]+" (?P<code>\d{3})'
)


def s3_requests(log: Path, bucket: str) -> Counter[tuple[str, str, int]]:
    """(method, object key, status) -> count of the requests the S3 store logged for `bucket`
    (key "": the bucket itself, e.g. a listing) and its objects (werkzeug's access log: one line
    per request)."""
    found: Counter[tuple[str, str, int]] = Counter()
    for line in log.read_text(errors="replace").splitlines():
        match = _REQUEST.search(_ANSI.sub("", line))
        path = match["path"] if match else ""
        if match and (path == f"/{bucket}" or path.startswith(f"/{bucket}/")):
            key = path[len(bucket) + 2 :]
            found[(match["method"], key, int(match["code"]))] += 1
    return found


def s3_gets(log: Path, bucket: str, *, ok: bool = True) -> Counter[str]:
    """Object key -> GETs of it answered 2xx (`ok`) or not (listings left out)."""
    found: Counter[str] = Counter()
    for (method, key, code), count in s3_requests(log, bucket).items():
        if method == "GET" and key and (200 <= code < 300) == ok:
            found[key] += count
    return found


# ------------------------------------------------------------------------- callers

PROBE = r"""
import hashlib, http.client, json, os, socket, ssl, urllib.parse
ca = os.environ["PEER_CA"]
targets = json.loads(os.environ["PEER_TARGETS"])
tokens = {"none": None, "garbage": "not-a-token"}
for name, path in (("default-audience", "/var/run/secrets/kubernetes.io/serviceaccount/token"),
                   ("peer-audience", os.environ["PEER_TOKEN_DIR"] + "/token")):
    if os.path.exists(path):
        tokens[name] = open(path).read().strip()
tokens.update(json.loads(os.environ.get("PEER_TOKENS") or "{}"))
proofs = json.loads(os.environ.get("PEER_PROOFS") or "{}")
if proofs:  # presigned here, with the localcache image's botocore
    import datetime, botocore.auth, botocore.config, botocore.session
    signed_now = botocore.auth.get_current_datetime
context = ssl.create_default_context(cadata=ca)
results = []

def call(endpoint, method, path, token, data=None):
    host, port = endpoint.removeprefix("https://").rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=10)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.sock = context.wrap_socket(raw, server_hostname="localcache-peer")
    headers = {"Authorization": "Bearer " + token} if token else {}
    if data is not None:
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=headers)
    resp = conn.getresponse()
    body = resp.read(64 << 20)
    conn.close()
    return resp.status, body

def nonce_of(target, token):
    try:
        status, body = call(target["endpoint"], "GET",
                            "/p2p/v1/models/%s/proofs/nonce" % target["key"], token)
        return json.loads(body)["nonce"] if status == 200 else "lc-" + "0" * 32
    except Exception:
        return "lc-" + "0" * 32

def presigned(spec, nonce):
    # a signature made `signed_ago_s` ago (one that leaked and has expired since)
    ago = datetime.timedelta(seconds=spec.get("signed_ago_s", 0))
    botocore.auth.get_current_datetime = lambda: signed_now() - ago
    client = botocore.session.get_session().create_client(
        "s3", region_name="us-east-1", endpoint_url=spec["endpoint"],
        aws_access_key_id=spec["key_id"], aws_secret_access_key=spec["secret"],
        config=botocore.config.Config(signature_version="s3v4",
                                      s3={"addressing_style": "path"}))
    heads = [{"path": p, "url": client.generate_presigned_url(
        "head_object", Params={"Bucket": spec["bucket"], "Key": k, "IfNoneMatch": '"%s"' % nonce,
                               "ChecksumMode": "ENABLED"}, ExpiresIn=spec["expires_s"])}
             for p, k in spec["keys"].items()]
    return json.dumps({"uri": spec["uri"], "nonce": nonce, "heads": heads})

for target in targets:
    base = "/p2p/v1/models/%s/" % target["key"]
    other = next((t for t in targets if t is not target), target)
    paths = {"manifest": ("GET", base + "manifest")}
    for f in target["files"]:
        paths["file " + f] = ("GET", base + "files/" + urllib.parse.quote(f))
    for token_name, token in tokens.items():
        # proofs first (each presigned in this pod with the nonce it was given), then what
        # they would open
        for name, spec in proofs.items():
            row = {"node": target["node"], "token": token_name, "what": "proof " + name}
            try:
                nonce = nonce_of(other if spec.get("nonce_from") == "other-node" else target,
                                 token)
                data = presigned(spec, nonce)
                sends = 2 if spec.get("nonce_from") == "replay" else 1
                for _ in range(sends):  # a replay: the same proof, the same nonce, again
                    status, body = call(target["endpoint"], "POST", base + "proofs", token, data)
                text = body[:160].decode("utf-8", "replace")
                row.update(status=status, bytes=len(body), text=text)
            except Exception as e:
                row.update(status=0, error=repr(e)[:200])
            results.append(row)
        for what, (method, path) in paths.items():
            row = {"node": target["node"], "token": token_name, "what": what}
            try:
                status, body = call(target["endpoint"], method, path, token)
                row.update(status=status, bytes=len(body),
                           sha256=hashlib.sha256(body).hexdigest(),
                           text=body[:160].decode("utf-8", "replace"))
            except Exception as e:
                row.update(status=0, error=repr(e)[:200])
            results.append(row)
print(json.dumps(results))
"""


def probe_pod_spec(
    *,
    node: str,
    ca: str,
    targets: list[Obj],
    tokens: dict[str, str] | None = None,
    proofs: dict[str, Obj] | None = None,
) -> Obj:
    """A pod spec on `node` that runs `PROBE` against `targets` ({node, endpoint, key,
    files}), holding a projected token for the peer audience, as a download pod would, and
    trying `tokens` (name -> token) too; with `proofs` (name -> {uri, bucket, keys: {path:
    object key}, key_id, secret, expires_s, endpoint, optional signed_ago_s, nonce_from
    "other-node"|"replay"}), each token first asks the target for a nonce (or the other
    target, `other-node`), presigns the HEADs with it in the pod and POSTs the proof (twice,
    `replay`: the row is the second answer): rows `proof <name>`."""
    return {
        "restartPolicy": "Never",
        "nodeSelector": {jobs_mod.HOSTNAME_LABEL: node},
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
        "containers": [
            {
                "name": "probe",
                "image": LOCALCACHE_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["python3", "-c", PROBE],
                "env": [
                    {"name": "PEER_CA", "value": ca},
                    {"name": "PEER_TARGETS", "value": json.dumps(targets)},
                    {"name": "PEER_TOKEN_DIR", "value": TOKEN_DIR},
                    {"name": "PEER_TOKENS", "value": json.dumps(tokens or {})},
                    {"name": "PEER_PROOFS", "value": json.dumps(proofs or {})},
                ],
                "volumeMounts": [{"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True}],
            }
        ],
        "volumes": [
            {
                "name": TOKEN_VOLUME,
                "projected": {
                    "sources": [
                        {
                            "serviceAccountToken": {
                                "audience": peer_api.TOKEN_AUDIENCE,
                                "expirationSeconds": 600,
                                "path": "token",
                            }
                        }
                    ]
                },
            }
        ],
    }


def probe_pod(
    name: str,
    namespace: str,
    *,
    node: str,
    ca: str,
    targets: list[Obj],
    tokens: dict[str, str] | None = None,
    proofs: dict[str, Obj] | None = None,
) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": probe_pod_spec(node=node, ca=ca, targets=targets, tokens=tokens, proofs=proofs),
    }


def targets(cluster: Cluster, storage_key: str, files: list[str]) -> list[Obj]:
    """`PROBE` targets: every node's published peer endpoint, asked for `storage_key`."""
    found = []
    for node in cluster.node_names:
        address = endpoint(cluster, node)
        assert address, f"{node} publishes no peer endpoint"
        assert address.endswith(f":{peer_api.DEFAULT_PORT}"), (node, address)
        found.append({"node": node, "endpoint": address, "key": storage_key, "files": files})
    return found


def forged_download_job(
    namespace: str, *, cache: str, storage_key: str, node: str, ca: str, targets: list[Obj]
) -> Obj:
    """A Job a tenant can create in its namespace, shaped like the agent's download Job of
    `cache` on `node` (name pattern and labels), whose pod runs `PROBE` with a projected
    token of the peer audience."""
    name = f"lmd-{storage_key}-{uuid.uuid4().hex[:16]}-0-{uuid.uuid4().hex[:8]}"
    labels = {
        jobs_mod.LABEL_MODEL: cache,
        jobs_mod.LABEL_NODE: node,
        jobs_mod.LABEL_STORAGE_KEY: storage_key,
        jobs_mod.LABEL_MODEL_NAMESPACE: namespace,
        PEER_FETCH_LABEL: "true",
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": probe_pod_spec(node=node, ca=ca, targets=targets),
            },
        },
    }


def probe_results(cluster: Cluster, namespace: str, pod: str) -> list[Obj]:
    """What `PROBE` printed in `pod`, once it has finished."""

    def finished() -> bool:
        got = cluster.get("pod", pod, namespace=namespace) or {}
        phase = (got.get("status") or {}).get("phase")
        return phase in ("Succeeded", "Failed")

    cluster.wait(finished, timeout=120, what=f"the probe pod {namespace}/{pod} finishes")
    logs = cluster.kubectl("logs", "-n", namespace, pod).stdout
    try:
        found: list[Obj] = json.loads(logs.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise AssertionError(f"the probe {namespace}/{pod} printed no results: {logs!r}") from exc
    return found


def container_stopped(cluster: Cluster, namespace: str, job: str, container: str) -> bool:
    """Whether the kubelet said it stops `container` of a pod of `job` (a `Killing` Event:
    recorded as it sends the container SIGTERM)."""
    pods = {
        p["metadata"]["name"]
        for p in cluster.items("pods", namespace=namespace, selector=f"job-name={job}")
    }
    for event in cluster.items("events", namespace=namespace):
        about = event.get("involvedObject") or {}
        field_path = str(about.get("fieldPath") or "")
        if (
            event.get("reason") == "Killing"
            and about.get("name") in pods
            and f"{{{container}}}" in field_path
        ):
            return True
    return False


def job_pod(cluster: Cluster, namespace: str, job: str) -> str | None:
    pods = cluster.items("pods", namespace=namespace, selector=f"job-name={job}")
    return pods[0]["metadata"]["name"] if pods else None


# ------------------------------------------------------------------------- claims


def serving_claim(cluster: Cluster, namespace: str, cache: str, uri: str) -> str:
    """The serving PVC the webhook names for an InferenceService of `uri` in `namespace`,
    once Bound (how a tenant's model server reads the model)."""
    cluster.create(objects.isvc("reader", namespace, uri))
    meta = (cluster.get(objects.ISVC.plural, "reader", namespace=namespace) or {})["metadata"]
    assert meta.get("labels", {}).get(isvc_api.LOCAL_MODEL_LABEL) == cache, meta
    claim: str = meta["annotations"][isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION]
    cluster.wait_bound(claim, namespace=namespace, timeout=60)
    return claim


def files_through_pod(
    cluster: Cluster, namespace: str, *, claim: str, sub_path: str, node: str
) -> dict[str, str]:
    """sha256 by path of the model as a pod on `node` reads it through `claim`."""
    name = f"digest-{uuid.uuid4().hex[:6]}"
    cluster.apply(objects.digest_pod(name, namespace, claim=claim, sub_path=sub_path, node=node))

    def succeeded() -> bool:
        got = cluster.get("pod", name, namespace=namespace) or {}
        phase = (got.get("status") or {}).get("phase")
        assert phase != "Failed", f"the reader on {node} failed: {got.get('status')}"
        return phase == "Succeeded"

    cluster.wait(succeeded, timeout=120, what=f"the reader pod on {node} finishes")
    found: dict[str, str] = json.loads(cluster.kubectl("logs", "-n", namespace, name).stdout)
    cluster.kubectl("delete", "pod", "-n", namespace, name, "--wait=false")
    return found


def download_pod_token(
    cluster: Cluster, namespace: str, storage_key: str, *, user: str
) -> str | None:
    """A `localcache-peer` token bound to the pod of a download Job of `storage_key` in
    `namespace` (a Job the agent made and records), minted by the tenant `user` itself
    (`cluster.tenant`); None when no such pod exists (any more)."""
    for job in download_jobs(cluster, namespace, storage_key):
        pods = cluster.items(
            "pods", namespace=namespace, selector=f"job-name={job['metadata']['name']}"
        )
        for pod in pods:
            meta = pod["metadata"]
            minted = cluster.kubectl(
                "create", "token", pod["spec"].get("serviceAccountName") or "default",
                "-n", namespace, f"--audience={peer_api.TOKEN_AUDIENCE}",
                "--bound-object-kind=Pod", f"--bound-object-name={meta['name']}",
                f"--bound-object-uid={meta['uid']}", "--duration=10m", f"--as={user}",
                check=False,
            )  # fmt: skip
            if minted.returncode == 0:
                return minted.stdout.strip()
            assert "not found" in minted.stderr, minted.stderr
    return None

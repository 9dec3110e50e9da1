"""The framework: informers, work queue, controllers, leader election, metrics, admission.

Hand-rolled on raw kubernetes-asyncio watches with client-go semantics. Knows nothing of
LocalModel types: objects are plain dicts (`runtime.kube.Obj`) keyed by `runtime.keys.ObjectKey`.

The pipeline, one way, level-based (the queue carries keys, never events):

    kube-apiserver ──watch──▶ reflector ──▶ store (+ indexes) ──▶ handlers / predicates
        ──▶ work queue (keys) ──▶ workers ──▶ reconcile(key)
        ──reads store, writes API──▶ kube-apiserver

1. watch: `kube.Kube.watch()` (over `transport`) streams raw events; `listwatch.ListWatch`
   is one resource's LIST + WATCH.
2. reflector: `reflector.Reflector` lists, then watches from the list's resourceVersion,
   relisting on 410 and backing off on errors, forever.
3. store: `store.Store` holds the latest object per key with secondary indexes; consumers read
   it through `store.Reader`. A writer's own writes stand in for the store's lagging copy
   through `store.WriteOverlay` (read-your-own-writes).
4. handlers: `informer.Informer` tells `handlers` (filtered by `predicates`) about every
   change; `factory.InformerFactory` shares one informer per watched thing per process.
5. queue: `workqueue.WorkQueue` deduplicates keys, delays retries (`ratelimit`), and never
   hands one key to two workers at once.
6. workers: `controller.Controller` runs N workers per queue, each calling the reconciler.
7. reconcile: `reconcile.Reconciler.reconcile(key) -> Result`; raising retries with backoff,
   `errors.TerminalError` does not.
8. API: writes go back through `kube.Kube` (merge patches from `patch`, Events from `events`).

`manager.Manager` starts it all in order under one TaskGroup (informers synced before
workers, leader-only controllers under `leaderelection`) and stops it within a deadline.

Modules by role:
- API access: `kube` (the only kubernetes_asyncio importer: configuration), `apiverbs` (the
  verbs), `transport` (HTTP, deadlines, error mapping, watch streams), `apitypes` (`Resource`,
  list answers, patch bodies), `errors` (the error tree), `patch` (RFC 7386 merge-patch
  diffs), `events` (the one Event recorder, deduplicating with a count bump).
- Caches: `listwatch`, `reflector`, `store` (+ `WriteOverlay`), `informer`, `factory`.
- Work: `handlers`, `predicates`, `workqueue`, `ratelimit`, `reconcile`, `controller`.
- Process: `manager`, `leaderelection`, `metrics` (the only prometheus_client importer: the
  registry, the framework families' collector and the domain families), `series/` (the
  framework series as plain numbers and their recorders), `logging`, `clock` (the Clock
  protocol and the one RFC 3339 formatter), `keys`, `onchange`, `durable` (fsync'd files on
  local disks), `fstree` (trees walked without recursion).
- `crds/`: kinds whose CRDs come and go: `crdwait`, `optional` informers, the schema check
  `crdcheck` and its diff `schemadiff`.
- `serving/`: what the process answers: `httpserver` (/metrics and probes), `admission` and
  `review` (AdmissionReview over TLS, `tls`), `certgen` and `certs` (self-managed serving
  certificates). With `transport`, the only place in the framework that imports aiohttp.
"""

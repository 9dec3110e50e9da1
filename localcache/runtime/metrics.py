"""Prometheus metrics on the operator's own registry; the only importer of prometheus_client.

One `Metrics` object is built by the composition root and passed down; nothing here is
global and the process-wide default registry is never touched. It holds:

- controller-runtime's controller metrics (`controller_runtime_*`, label `controller`), via
  `Metrics.controller(name)`, which returns the recorder a `Controller` reports to;
- client-go/controller-runtime's work queue metrics (`workqueue_*`, labels `name` and
  `controller`, both the controller name; `workqueue_depth` also carries `priority=""` as the
  classic queue does), via `Metrics.workqueue(name)`;
- `leader_election_master_status{name}`, via `Metrics.leader_election(name)`;
- client-go's REST client metrics `rest_client_requests_total{code,method,host}` and
  `rest_client_request_duration_seconds{verb,host}`, via `Metrics.rest_client()`, which
  returns the recorder `transport.Transport` reports every API request to;
- process and Python runtime collectors (`process_*`, `python_*`);
- domain metrics made with `counter()`, `gauge()` and `histogram()`, so domain code never
  imports prometheus_client;
- the peer data plane's series (`localcache_p2p_*`), via `Metrics.peer()` (`PeerMetrics`).

Here: `Metrics`, the registry and its process collectors, the recorders' factory, the
collector that exposes the framework series (`runtime.series`: plain numbers, moved inline by
the recorders there) and the counter, gauge and histogram wrappers domain code is given.
The `*_created` series that prometheus_client adds to counters and histograms are left out
of `render()`, as Go has none.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import prometheus_client
from prometheus_client import exposition, metrics_core, utils

from localcache.runtime.series import controllers, families, restclient

# The bucket and label constants callers know as `metrics.X`.
RECONCILE_TIME_BUCKETS = controllers.RECONCILE_TIME_BUCKETS
WORKQUEUE_BUCKETS = controllers.WORKQUEUE_BUCKETS
RECONCILE_RESULTS = controllers.RECONCILE_RESULTS
REST_CLIENT_LATENCY_BUCKETS = restclient.REST_CLIENT_LATENCY_BUCKETS
ControllerRecorder = controllers.ControllerRecorder
WorkqueueRecorder = controllers.WorkqueueRecorder
LeaderElectionRecorder = controllers.LeaderElectionRecorder
RestClientRecorder = restclient.RestClientRecorder

F = TypeVar("F")
CREATED_TYPES = frozenset({"counter", "histogram", "summary", "gaugehistogram"})


class _WithoutCreated:
    """A collector view of a registry minus the `*_created` samples."""

    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[metrics_core.Metric]:
        for family in self._registry.collect():
            if family.type in CREATED_TYPES:
                family = copy.copy(family)
                family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


class _Framework:
    """The collector of every framework family (`runtime.series`); one per `Metrics`."""

    def __init__(self, specs: Sequence[families.Spec]) -> None:
        self.families = families.families(specs)
        self._le = {n: tuple(_go_float(b) for b in f.bounds) for n, f in self.families.items()}

    def collect(self) -> Iterator[metrics_core.Metric]:
        for name, family in self.families.items():
            yield _metric(family, self._le[name])

    def describe(self) -> Iterator[metrics_core.Metric]:
        """The families (for the registry's duplicate-name check)."""
        return self.collect()


_go_float: Callable[[float], str] = utils.floatToGoString  # how `le` values are spelt


def _metric(family: families.Family, le: tuple[str, ...]) -> metrics_core.Metric:
    """A framework family with its current samples, as prometheus_client would render it."""
    labels = family.labelnames
    if family.kind == "histogram":
        hist = metrics_core.HistogramMetricFamily(family.name, family.documentation, labels=labels)
        for values, series in family.series_buckets.items():
            cumulative = map(float, itertools.accumulate(series.counts))
            hist.add_metric(values, list(zip(le, cumulative, strict=True)), series.sum)
        return hist
    kind = (
        metrics_core.CounterMetricFamily
        if family.kind == "counter"
        else metrics_core.GaugeMetricFamily
    )
    metric = kind(family.name, family.documentation, labels=labels)
    for values, number in family.numbers.items():
        metric.add_metric(values, number.value)
    return metric


# Domain metrics: what `Metrics.counter()`, `gauge()` and `histogram()` give domain code, so
# it never imports prometheus_client. Label values are passed as keyword arguments.


class CounterFamily:
    """A domain counter; pass label values as keyword arguments (any label name works)."""

    def __init__(self, metric: prometheus_client.Counter, labelled: bool) -> None:
        self._metric = metric
        self._labelled = labelled

    def inc(self, amount: float = 1.0, /, **labels: str) -> None:
        (self._metric.labels(**labels) if self._labelled else self._metric).inc(amount)


class GaugeFamily:
    """A domain gauge; pass label values as keyword arguments."""

    def __init__(self, metric: prometheus_client.Gauge, labelnames: tuple[str, ...]) -> None:
        self._metric = metric
        self._labelnames = labelnames
        self._labelled = bool(labelnames)

    def _child(self, labels: dict[str, str]) -> prometheus_client.Gauge:
        return self._metric.labels(**labels) if self._labelled else self._metric

    def set(self, value: float, /, **labels: str) -> None:
        self._child(labels).set(value)

    def inc(self, amount: float = 1.0, /, **labels: str) -> None:
        self._child(labels).inc(amount)

    def dec(self, amount: float = 1.0, /, **labels: str) -> None:
        self._child(labels).dec(amount)

    def remove(self, **labels: str) -> None:
        """Drop the series with these label values (e.g. a model that is gone)."""
        self._metric.remove(*(labels[n] for n in self._labelnames))


class HistogramFamily:
    """A domain histogram; pass label values as keyword arguments."""

    def __init__(self, metric: prometheus_client.Histogram, labelled: bool) -> None:
        self._metric = metric
        self._labelled = labelled

    def observe(self, value: float, /, **labels: str) -> None:
        (self._metric.labels(**labels) if self._labelled else self._metric).observe(value)


@dataclasses.dataclass(frozen=True, slots=True)
class PeerMetrics:
    """The peer data plane's series (issue 23), shared by the agent's peer server, the agent's
    planner/observer and anything counting origin bytes:

    - `bytes` `localcache_p2p_bytes_total{direction=sent|received,source}`: file bytes moved
      between peers (`source` is the other node: the receiver for sent, the source for
      received);
    - `origin_bytes` `localcache_p2p_origin_bytes_total`: bytes downloads took from the origin;
    - `fallbacks` `localcache_p2p_fallbacks_total{reason}`: peer attempts that fell back to the
      origin (`resumed-at-origin`: a file the peers broke off, finished from the origin);
    - `verify_failures` `localcache_p2p_verify_failures_total`: files a peer served that failed
      size or sha256 verification;
    - `refusals` `localcache_p2p_refusals_total{reason}`: requests the peer server refused
      (the authorizer's reasons, and `stale`, `busy`, `not-here`, `shutting-down`);
    - `uploads_in_flight` `localcache_p2p_uploads_in_flight`: file streams being served.
    """

    bytes: CounterFamily
    origin_bytes: CounterFamily
    fallbacks: CounterFamily
    verify_failures: CounterFamily
    refusals: CounterFamily
    uploads_in_flight: GaugeFamily


class Metrics:
    """All metrics of one process, on a private `CollectorRegistry`."""

    def __init__(self) -> None:
        reg = self._registry = prometheus_client.CollectorRegistry()
        self._exposed = _WithoutCreated(reg)
        prometheus_client.ProcessCollector(registry=reg)
        prometheus_client.PlatformCollector(registry=reg)
        prometheus_client.GCCollector(registry=reg)
        framework = _Framework((*controllers.FAMILIES, *restclient.FAMILIES))
        reg.register(framework)
        self.framework_families: Mapping[str, families.Family] = framework.families
        self._leader_status = prometheus_client.Gauge(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates "
            "backup, 1 indicates master. 'name' is the string used to identify the lease.",
            ("name",),
            registry=reg,
        )
        self._families: dict[str, tuple[str, tuple[str, ...], Any]] = {}

    # -- framework recorders -------------------------------------------------------------

    def controller(self, name: str) -> ControllerRecorder:
        """The recorder for controller `name`; call once per controller."""
        return ControllerRecorder(self, name)

    def workqueue(self, name: str) -> WorkqueueRecorder:
        """The recorder for the work queue of controller `name`."""
        return WorkqueueRecorder(self, name)

    def rest_client(self) -> RestClientRecorder:
        """The recorder of API requests (`kube.Kube.instrument` takes it)."""
        return RestClientRecorder(self)

    def leader_election(self, name: str) -> LeaderElectionRecorder:
        """The recorder for the lease `name` (starts at 0: not leading)."""
        return LeaderElectionRecorder(self, name)

    def leader_status(self, name: str) -> prometheus_client.Gauge:
        """The `leader_election_master_status` series of lease `name`."""
        return self._leader_status.labels(name)

    # -- domain metrics ------------------------------------------------------------------

    def _family(self, kind: str, name: str, labels: Sequence[str], make: Callable[[], F]) -> F:
        """The family `name`, made on first request. Asking again with the same kind and
        labels returns the same family (several components, e.g. two agents in one process,
        may declare the same series); a different kind or label set is a programming error."""
        wanted = tuple(labels)
        known = self._families.get(name)
        if known is not None:
            if known[:2] != (kind, wanted):
                raise ValueError(
                    f"metric {name} already exists as a {known[0]} with labels {known[1]}"
                )
            family: F = known[2]
            return family
        created = make()
        self._families[name] = (kind, wanted, created)
        return created

    def counter(self, name: str, help: str, *, labels: Sequence[str] = ()) -> CounterFamily:
        """The counter `name` (made once); `name` should end in `_total`."""

        def make() -> CounterFamily:
            metric = prometheus_client.Counter(name, help, tuple(labels), registry=self._registry)
            return CounterFamily(metric, bool(labels))

        return self._family("counter", name, labels, make)

    def gauge(self, name: str, help: str, *, labels: Sequence[str] = ()) -> GaugeFamily:
        """The gauge `name` (made once)."""

        def make() -> GaugeFamily:
            metric = prometheus_client.Gauge(name, help, tuple(labels), registry=self._registry)
            return GaugeFamily(metric, tuple(labels))

        return self._family("gauge", name, labels, make)

    def histogram(
        self,
        name: str,
        help: str,
        *,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = prometheus_client.Histogram.DEFAULT_BUCKETS,
    ) -> HistogramFamily:
        """The histogram `name` (made once; the first call's buckets apply)."""

        def make() -> HistogramFamily:
            metric = prometheus_client.Histogram(
                name, help, tuple(labels), buckets=tuple(buckets), registry=self._registry
            )
            return HistogramFamily(metric, bool(labels))

        return self._family("histogram", name, labels, make)

    def peer(self) -> PeerMetrics:
        """The `localcache_p2p_*` families (made on first call; the same ones afterwards)."""
        return PeerMetrics(
            bytes=self.counter(
                "localcache_p2p_bytes_total",
                "File bytes moved between peer nodes, by direction and the other node.",
                labels=("direction", "source"),
            ),
            origin_bytes=self.counter(
                "localcache_p2p_origin_bytes_total",
                "Bytes model downloads took from the origin (object store, hub).",
            ),
            fallbacks=self.counter(
                "localcache_p2p_fallbacks_total",
                "Peer download attempts that fell back to the origin, by reason.",
                labels=("reason",),
            ),
            verify_failures=self.counter(
                "localcache_p2p_verify_failures_total",
                "Files a peer served that failed size or sha256 verification.",
            ),
            refusals=self.counter(
                "localcache_p2p_refusals_total",
                "Requests the peer server refused, by reason.",
                labels=("reason",),
            ),
            uploads_in_flight=self.gauge(
                "localcache_p2p_uploads_in_flight",
                "File streams the peer server is serving now.",
            ),
        )

    # -- reading -------------------------------------------------------------------------

    def render(self) -> tuple[bytes, str]:
        """The text exposition of every metric, and its content type."""
        return exposition.generate_latest(self._exposed), exposition.CONTENT_TYPE_PLAIN_0_0_4

    def value(self, sample: str, /, **labels: str) -> float | None:
        """One sample's current value (e.g. `value("workqueue_depth", name="x", ...)`), or
        None when that series does not exist."""
        return self._registry.get_sample_value(sample, labels)

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
  imports prometheus_client.

The framework series are moved on every reconcile and every queue operation, so they are
plain Python numbers (`_Number`, `_Buckets`: no lock, no label lookup, a histogram
observation is one `bisect`) that one collector turns into metric families when the registry
is read; a scrape therefore always sees current values. Everything runs on one event loop.

Names, labels and buckets follow controller-runtime v0.24 (`pkg/internal/controller/metrics`,
`pkg/metrics/workqueue.go`, `pkg/metrics/leaderelection.go`) and client-go v0.36
(`component-base/metrics/prometheus/restclient`: `method`/`verb` carry the HTTP method,
`host` the apiserver's host:port, `code` the HTTP status or `<error>` when none came).
The `*_created` series that prometheus_client adds to counters and histograms are left out
of `render()`, as Go has none.
"""

from __future__ import annotations

import bisect
import copy
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import prometheus_client
from prometheus_client import exposition, metrics_core, utils

F = TypeVar("F")

#: controller_runtime_reconcile_time_seconds buckets (40), from controller-runtime.
RECONCILE_TIME_BUCKETS: tuple[float, ...] = (
    *(0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5),
    *(0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0),
    *(6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0),
)
#: workqueue duration buckets: Go's ExponentialBuckets(10e-9, 10, 12) = 1e-8 … 1e3 seconds.
WORKQUEUE_BUCKETS: tuple[float, ...] = (
    *(1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0, 1000.0),
)
#: rest_client_request_duration_seconds buckets, from client-go.
REST_CLIENT_LATENCY_BUCKETS: tuple[float, ...] = (
    *(0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0),
)
#: Values of the `result` label of controller_runtime_reconcile_total.
RECONCILE_RESULTS = ("success", "error", "requeue", "requeue_after")


_CREATED_TYPES = frozenset({"counter", "histogram", "summary", "gaugehistogram"})
_bisect = bisect.bisect_left


class _WithoutCreated:
    """A collector view of a registry minus the `*_created` samples."""

    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[metrics_core.Metric]:
        for family in self._registry.collect():
            if family.type in _CREATED_TYPES:
                family = copy.copy(family)
                family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


class _Number:
    """One series of a framework counter or gauge: a plain number, read when collected."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0


class _Buckets:
    """One series of a framework histogram: per-bucket (not cumulative) counts and the sum.
    The last bound is +Inf, so an observation `x` goes to `counts[bisect_left(bounds, x)]`
    (`le` is inclusive). Recorders update it inline: a method call per observation is a
    measurable share of a no-op reconcile."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0


_go_float: Callable[[float], str] = utils.floatToGoString  # how `le` values are spelt
_CTL = ("controller",)
_WQ = ("name", "controller")
#: Every framework family, in exposition order: (type, name, help, label names, buckets).
_FAMILIES: tuple[tuple[str, str, str, tuple[str, ...], tuple[float, ...]], ...] = (
    (
        "counter",
        "controller_runtime_reconcile_total",
        "Total number of reconciliations per controller",
        ("controller", "result"),
        (),
    ),
    (
        "counter",
        "controller_runtime_reconcile_errors_total",
        "Total number of reconciliation errors per controller",
        _CTL,
        (),
    ),
    (
        "counter",
        "controller_runtime_terminal_reconcile_errors_total",
        "Total number of terminal reconciliation errors per controller",
        _CTL,
        (),
    ),
    (
        "counter",
        "controller_runtime_reconcile_panics_total",
        "Total number of reconciliation panics per controller",
        _CTL,
        (),
    ),
    (
        "counter",
        "controller_runtime_reconcile_timeouts_total",
        "Total number of reconciliation timeouts per controller",
        _CTL,
        (),
    ),
    (
        "histogram",
        "controller_runtime_reconcile_time_seconds",
        "Length of time per reconciliation per controller",
        _CTL,
        RECONCILE_TIME_BUCKETS,
    ),
    (
        "gauge",
        "controller_runtime_max_concurrent_reconciles",
        "Maximum number of concurrent reconciles per controller",
        _CTL,
        (),
    ),
    (
        "gauge",
        "controller_runtime_active_workers",
        "Number of currently used workers per controller",
        _CTL,
        (),
    ),
    ("gauge", "workqueue_depth", "Current depth of workqueue", (*_WQ, "priority"), ()),
    ("counter", "workqueue_adds_total", "Total number of adds handled by workqueue", _WQ, ()),
    (
        "histogram",
        "workqueue_queue_duration_seconds",
        "How long in seconds an item stays in workqueue before being requested",
        _WQ,
        WORKQUEUE_BUCKETS,
    ),
    (
        "histogram",
        "workqueue_work_duration_seconds",
        "How long in seconds processing an item from workqueue takes",
        _WQ,
        WORKQUEUE_BUCKETS,
    ),
    (
        "gauge",
        "workqueue_unfinished_work_seconds",
        "How many seconds of work has been done that is in progress and hasn't been "
        "observed by work_duration. Large values indicate stuck threads. One can deduce "
        "the number of stuck threads by observing the rate at which this increases.",
        _WQ,
        (),
    ),
    (
        "gauge",
        "workqueue_longest_running_processor_seconds",
        "How many seconds has the longest running processor for workqueue been running.",
        _WQ,
        (),
    ),
    ("counter", "workqueue_retries_total", "Total number of retries handled by workqueue", _WQ, ()),
    (
        "counter",
        "rest_client_requests_total",
        "Number of HTTP requests, partitioned by status code, method, and host.",
        ("code", "method", "host"),
        (),
    ),
    (
        "histogram",
        "rest_client_request_duration_seconds",
        "Request latency in seconds. Broken down by verb, and host.",
        ("verb", "host"),
        REST_CLIENT_LATENCY_BUCKETS,
    ),
)


class _Family:
    """One framework family: its series by label values, as numbers or as bucket counts."""

    def __init__(
        self,
        kind: str,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...],
        buckets: tuple[float, ...],
    ) -> None:
        self._kind = kind
        self._name = name
        self._doc = documentation
        self._labelnames = labelnames
        self._bounds = (*buckets, math.inf)  # prometheus_client adds +Inf the same way
        self._le = tuple(_go_float(b) for b in self._bounds)
        self._numbers: dict[tuple[str, ...], _Number] = {}
        self._buckets: dict[tuple[str, ...], _Buckets] = {}

    def number(self, *labelvalues: str) -> _Number:
        return self._numbers.setdefault(labelvalues, _Number())

    def buckets(self, *labelvalues: str) -> _Buckets:
        return self._buckets.setdefault(labelvalues, _Buckets(self._bounds))

    def metric(self) -> metrics_core.Metric:
        """The family with its current samples, as prometheus_client would render it."""
        if self._kind == "histogram":
            hist = metrics_core.HistogramMetricFamily(
                self._name, self._doc, labels=self._labelnames
            )
            for values, series in self._buckets.items():
                cumulative = map(float, itertools.accumulate(series.counts))
                hist.add_metric(values, list(zip(self._le, cumulative, strict=True)), series.sum)
            return hist
        family = (
            metrics_core.CounterMetricFamily
            if self._kind == "counter"
            else metrics_core.GaugeMetricFamily
        )
        metric = family(self._name, self._doc, labels=self._labelnames)
        for values, number in self._numbers.items():
            metric.add_metric(values, number.value)
        return metric


class _Framework:
    """The collector of every framework family; one per `Metrics`."""

    def __init__(self) -> None:
        self.families = {spec[1]: _Family(*spec) for spec in _FAMILIES}

    def collect(self) -> Iterator[metrics_core.Metric]:
        for family in self.families.values():
            yield family.metric()

    def describe(self) -> Iterator[metrics_core.Metric]:
        """The families (for the registry's duplicate-name check)."""
        return self.collect()


class ControllerRecorder:
    """The `controller_runtime_*` series of one controller (see `controller.ControllerMetrics`)."""

    def __init__(self, metrics: Metrics, name: str) -> None:
        f = metrics._framework.families
        self._totals = {
            r: f["controller_runtime_reconcile_total"].number(name, r) for r in RECONCILE_RESULTS
        }
        self._errors = f["controller_runtime_reconcile_errors_total"].number(name)
        self._terminal = f["controller_runtime_terminal_reconcile_errors_total"].number(name)
        self._panics = f["controller_runtime_reconcile_panics_total"].number(name)
        self._timeouts = f["controller_runtime_reconcile_timeouts_total"].number(name)
        self._time = f["controller_runtime_reconcile_time_seconds"].buckets(name)
        self._max_concurrent = f["controller_runtime_max_concurrent_reconciles"].number(name)
        self._active = f["controller_runtime_active_workers"].number(name)

    def set_max_concurrent_reconciles(self, value: int) -> None:
        self._max_concurrent.value = value

    def inc_active_workers(self) -> None:
        self._active.value += 1

    def dec_active_workers(self) -> None:
        self._active.value -= 1

    def inc_reconcile_total(self, result: str) -> None:
        self._totals[result].value += 1

    def inc_reconcile_errors(self) -> None:
        self._errors.value += 1

    def inc_terminal_reconcile_errors(self) -> None:
        self._terminal.value += 1

    def inc_reconcile_panics(self) -> None:
        self._panics.value += 1

    def inc_reconcile_timeouts(self) -> None:
        self._timeouts.value += 1

    def observe_reconcile_time(self, seconds: float) -> None:
        series = self._time
        series.counts[_bisect(series.bounds, seconds)] += 1
        series.sum += seconds


class WorkqueueRecorder:
    """The `workqueue_*` series of one queue (see `workqueue.QueueMetrics`)."""

    def __init__(self, metrics: Metrics, name: str) -> None:
        f = metrics._framework.families
        self._depth = f["workqueue_depth"].number(name, name, "")
        self._adds = f["workqueue_adds_total"].number(name, name)
        self._queue_duration = f["workqueue_queue_duration_seconds"].buckets(name, name)
        self._work_duration = f["workqueue_work_duration_seconds"].buckets(name, name)
        self._retries = f["workqueue_retries_total"].number(name, name)
        self._unfinished = f["workqueue_unfinished_work_seconds"].number(name, name)
        self._longest = f["workqueue_longest_running_processor_seconds"].number(name, name)

    def set_depth(self, depth: int) -> None:
        self._depth.value = depth

    def inc_adds(self) -> None:
        self._adds.value += 1

    def observe_queue_duration(self, seconds: float) -> None:
        series = self._queue_duration
        series.counts[_bisect(series.bounds, seconds)] += 1
        series.sum += seconds

    def observe_work_duration(self, seconds: float) -> None:
        series = self._work_duration
        series.counts[_bisect(series.bounds, seconds)] += 1
        series.sum += seconds

    def inc_retries(self) -> None:
        self._retries.value += 1

    def set_unfinished_work(self, seconds: float) -> None:
        self._unfinished.value = seconds

    def set_longest_running_processor(self, seconds: float) -> None:
        self._longest.value = seconds


class RestClientRecorder:
    """client-go's `rest_client_*` series (see `transport.RequestMetrics`); one per process,
    shared by every client that reports to it."""

    def __init__(self, metrics: Metrics) -> None:
        f = metrics._framework.families
        self._requests = f["rest_client_requests_total"]
        self._latency = f["rest_client_request_duration_seconds"]

    def inc_requests(self, code: str, method: str, host: str) -> None:
        self._requests.number(code, method, host).value += 1

    def observe_request_duration(self, verb: str, host: str, seconds: float) -> None:
        series = self._latency.buckets(verb, host)
        series.counts[_bisect(series.bounds, seconds)] += 1
        series.sum += seconds


class LeaderElectionRecorder:
    """`leader_election_master_status{name}`: 1 while leading, 0 otherwise."""

    def __init__(self, metrics: Metrics, name: str) -> None:
        self._status = metrics._leader_status.labels(name)
        self._status.set(0)

    def set_master_status(self, leading: bool) -> None:
        self._status.set(1 if leading else 0)


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


class Metrics:
    """All metrics of one process, on a private `CollectorRegistry`."""

    def __init__(self) -> None:
        reg = self._registry = prometheus_client.CollectorRegistry()
        self._exposed = _WithoutCreated(reg)
        prometheus_client.ProcessCollector(registry=reg)
        prometheus_client.PlatformCollector(registry=reg)
        prometheus_client.GCCollector(registry=reg)
        self._framework = _Framework()
        reg.register(self._framework)
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

    # -- reading -------------------------------------------------------------------------

    def render(self) -> tuple[bytes, str]:
        """The text exposition of every metric, and its content type."""
        return exposition.generate_latest(self._exposed), exposition.CONTENT_TYPE_PLAIN_0_0_4

    def value(self, sample: str, /, **labels: str) -> float | None:
        """One sample's current value (e.g. `value("workqueue_depth", name="x", ...)`), or
        None when that series does not exist."""
        return self._registry.get_sample_value(sample, labels)

"""Prometheus metrics on the operator's own registry; the only importer of prometheus_client.

One `Metrics` object is built by the composition root and passed down; nothing here is
global and the process-wide default registry is never touched. It holds:

- controller-runtime's controller metrics (`controller_runtime_*`, label `controller`), via
  `Metrics.controller(name)`, which returns the recorder a `Controller` reports to;
- client-go/controller-runtime's work queue metrics (`workqueue_*`, labels `name` and
  `controller`, both the controller name; `workqueue_depth` also carries `priority=""` as the
  classic queue does), via `Metrics.workqueue(name)`;
- `leader_election_master_status{name}`, via `Metrics.leader_election(name)`;
- process and Python runtime collectors (`process_*`, `python_*`);
- domain metrics made with `counter()`, `gauge()` and `histogram()`, so domain code never
  imports prometheus_client.

Names, labels and buckets follow controller-runtime v0.24 (`pkg/internal/controller/metrics`,
`pkg/metrics/workqueue.go`, `pkg/metrics/leaderelection.go`). The `*_created` series that
prometheus_client adds to counters and histograms are left out of `render()`, as Go has none.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence

import prometheus_client
from prometheus_client import exposition, metrics_core

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
#: Values of the `result` label of controller_runtime_reconcile_total.
RECONCILE_RESULTS = ("success", "error", "requeue", "requeue_after")


_CREATED_TYPES = frozenset({"counter", "histogram", "summary", "gaugehistogram"})


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


class ControllerRecorder:
    """The `controller_runtime_*` series of one controller (see `controller.ControllerMetrics`)."""

    def __init__(self, metrics: Metrics, name: str) -> None:
        self._m = metrics
        self._name = name
        self._totals = {r: metrics._reconcile_total.labels(name, r) for r in RECONCILE_RESULTS}
        self._errors = metrics._reconcile_errors.labels(name)
        self._terminal = metrics._terminal_errors.labels(name)
        self._timeouts = metrics._reconcile_timeouts.labels(name)
        self._time = metrics._reconcile_time.labels(name)
        self._max_concurrent = metrics._max_concurrent.labels(name)
        self._active = metrics._active_workers.labels(name)

    def set_max_concurrent_reconciles(self, value: int) -> None:
        self._max_concurrent.set(value)

    def inc_active_workers(self) -> None:
        self._active.inc()

    def dec_active_workers(self) -> None:
        self._active.dec()

    def inc_reconcile_total(self, result: str) -> None:
        self._totals[result].inc()

    def inc_reconcile_errors(self) -> None:
        self._errors.inc()

    def inc_terminal_reconcile_errors(self) -> None:
        self._terminal.inc()

    def inc_reconcile_timeouts(self) -> None:
        self._timeouts.inc()

    def observe_reconcile_time(self, seconds: float) -> None:
        self._time.observe(seconds)


class WorkqueueRecorder:
    """The `workqueue_*` series of one queue (see `workqueue.QueueMetrics`)."""

    def __init__(self, metrics: Metrics, name: str) -> None:
        self._depth = metrics._wq_depth.labels(name, name, "")
        self._adds = metrics._wq_adds.labels(name, name)
        self._queue_duration = metrics._wq_queue_duration.labels(name, name)
        self._work_duration = metrics._wq_work_duration.labels(name, name)
        self._retries = metrics._wq_retries.labels(name, name)
        self._unfinished = metrics._wq_unfinished.labels(name, name)
        self._longest = metrics._wq_longest.labels(name, name)

    def set_depth(self, depth: int) -> None:
        self._depth.set(depth)

    def inc_adds(self) -> None:
        self._adds.inc()

    def observe_queue_duration(self, seconds: float) -> None:
        self._queue_duration.observe(seconds)

    def observe_work_duration(self, seconds: float) -> None:
        self._work_duration.observe(seconds)

    def inc_retries(self) -> None:
        self._retries.inc()

    def set_unfinished_work(self, seconds: float) -> None:
        self._unfinished.set(seconds)

    def set_longest_running_processor(self, seconds: float) -> None:
        self._longest.set(seconds)


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
        ctl = ("controller",)
        self._reconcile_total = prometheus_client.Counter(
            "controller_runtime_reconcile_total",
            "Total number of reconciliations per controller",
            ("controller", "result"),
            registry=reg,
        )
        self._reconcile_errors = prometheus_client.Counter(
            "controller_runtime_reconcile_errors_total",
            "Total number of reconciliation errors per controller",
            ctl,
            registry=reg,
        )
        self._terminal_errors = prometheus_client.Counter(
            "controller_runtime_terminal_reconcile_errors_total",
            "Total number of terminal reconciliation errors per controller",
            ctl,
            registry=reg,
        )
        self._reconcile_timeouts = prometheus_client.Counter(
            "controller_runtime_reconcile_timeouts_total",
            "Total number of reconciliation timeouts per controller",
            ctl,
            registry=reg,
        )
        self._reconcile_time = prometheus_client.Histogram(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            ctl,
            buckets=RECONCILE_TIME_BUCKETS,
            registry=reg,
        )
        self._max_concurrent = prometheus_client.Gauge(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            ctl,
            registry=reg,
        )
        self._active_workers = prometheus_client.Gauge(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            ctl,
            registry=reg,
        )
        wq = ("name", "controller")
        self._wq_depth = prometheus_client.Gauge(
            "workqueue_depth", "Current depth of workqueue", (*wq, "priority"), registry=reg
        )
        self._wq_adds = prometheus_client.Counter(
            "workqueue_adds_total", "Total number of adds handled by workqueue", wq, registry=reg
        )
        self._wq_queue_duration = prometheus_client.Histogram(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            wq,
            buckets=WORKQUEUE_BUCKETS,
            registry=reg,
        )
        self._wq_work_duration = prometheus_client.Histogram(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            wq,
            buckets=WORKQUEUE_BUCKETS,
            registry=reg,
        )
        self._wq_unfinished = prometheus_client.Gauge(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been "
            "observed by work_duration. Large values indicate stuck threads. One can deduce "
            "the number of stuck threads by observing the rate at which this increases.",
            wq,
            registry=reg,
        )
        self._wq_longest = prometheus_client.Gauge(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running.",
            wq,
            registry=reg,
        )
        self._wq_retries = prometheus_client.Counter(
            "workqueue_retries_total",
            "Total number of retries handled by workqueue",
            wq,
            registry=reg,
        )
        self._leader_status = prometheus_client.Gauge(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates "
            "backup, 1 indicates master. 'name' is the string used to identify the lease.",
            ("name",),
            registry=reg,
        )

    # -- framework recorders -------------------------------------------------------------

    def controller(self, name: str) -> ControllerRecorder:
        """The recorder for controller `name`; call once per controller."""
        return ControllerRecorder(self, name)

    def workqueue(self, name: str) -> WorkqueueRecorder:
        """The recorder for the work queue of controller `name`."""
        return WorkqueueRecorder(self, name)

    def leader_election(self, name: str) -> LeaderElectionRecorder:
        """The recorder for the lease `name` (starts at 0: not leading)."""
        return LeaderElectionRecorder(self, name)

    # -- domain metrics ------------------------------------------------------------------

    def counter(self, name: str, help: str, *, labels: Sequence[str] = ()) -> CounterFamily:
        """A new counter; `name` should end in `_total`."""
        metric = prometheus_client.Counter(name, help, tuple(labels), registry=self._registry)
        return CounterFamily(metric, bool(labels))

    def gauge(self, name: str, help: str, *, labels: Sequence[str] = ()) -> GaugeFamily:
        metric = prometheus_client.Gauge(name, help, tuple(labels), registry=self._registry)
        return GaugeFamily(metric, tuple(labels))

    def histogram(
        self,
        name: str,
        help: str,
        *,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = prometheus_client.Histogram.DEFAULT_BUCKETS,
    ) -> HistogramFamily:
        metric = prometheus_client.Histogram(
            name, help, tuple(labels), buckets=tuple(buckets), registry=self._registry
        )
        return HistogramFamily(metric, bool(labels))

    # -- reading -------------------------------------------------------------------------

    def render(self) -> tuple[bytes, str]:
        """The text exposition of every metric, and its content type."""
        return exposition.generate_latest(self._exposed), exposition.CONTENT_TYPE_PLAIN_0_0_4

    def value(self, sample: str, /, **labels: str) -> float | None:
        """One sample's current value (e.g. `value("workqueue_depth", name="x", ...)`), or
        None when that series does not exist."""
        return self._registry.get_sample_value(sample, labels)

"""controller-runtime's controller, work queue and leader-election series, and their recorders.

- `ControllerRecorder`: `controller_runtime_*` (label `controller`), one per controller;
- `WorkqueueRecorder`: `workqueue_*` (labels `name` and `controller`, both the controller
  name; `workqueue_depth` also carries `priority=""` as the classic queue does);
- `LeaderElectionRecorder`: `leader_election_master_status{name}`.

Names, labels and buckets follow controller-runtime v0.24 (`pkg/internal/controller/metrics`,
`pkg/metrics/workqueue.go`, `pkg/metrics/leaderelection.go`). Recorders update the plain
numbers of `families` inline: a method call per observation is a measurable share of a no-op
reconcile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from localcache.runtime.series import families

if TYPE_CHECKING:
    from localcache.runtime.metrics import Metrics

_bisect = families.bisect_left

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


_CTL = ("controller",)
_WQ = ("name", "controller")
#: controller-runtime's controller and work queue families, in exposition order.
FAMILIES: tuple[families.Spec, ...] = (
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
)


class ControllerRecorder:
    """The `controller_runtime_*` series of one controller (see `controller.ControllerMetrics`)."""

    def __init__(self, metrics: Metrics, name: str) -> None:
        f = metrics.framework_families
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
        f = metrics.framework_families
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


class LeaderElectionRecorder:
    """`leader_election_master_status{name}`: 1 while leading, 0 otherwise."""

    def __init__(self, metrics: Metrics, name: str) -> None:
        self._status = metrics.leader_status(name)
        self._status.set(0)

    def set_master_status(self, leading: bool) -> None:
        self._status.set(1 if leading else 0)

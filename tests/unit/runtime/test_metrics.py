"""Metrics: controller-runtime's names, labels and buckets, on a private registry.

Matrix: the exposition holds every framework metric name of spec §7 / reference §2.4 with its
labels; controller series are pre-initialised to 0; buckets match controller-runtime's, counted
inclusively and cumulatively with count and sum; recorders of one name share their series; two
Metrics objects do not share a registry; domain counters, gauges and histograms work with and
without labels, and cannot reuse a framework name; process metrics are present.
"""

from __future__ import annotations

import prometheus_client
import pytest

from localcache.runtime import metrics

FRAMEWORK_NAMES = (
    "controller_runtime_reconcile_total",
    "controller_runtime_reconcile_errors_total",
    "controller_runtime_terminal_reconcile_errors_total",
    "controller_runtime_reconcile_panics_total",
    "controller_runtime_reconcile_timeouts_total",
    "controller_runtime_reconcile_time_seconds",
    "controller_runtime_max_concurrent_reconciles",
    "controller_runtime_active_workers",
    "workqueue_depth",
    "workqueue_adds_total",
    "workqueue_queue_duration_seconds",
    "workqueue_work_duration_seconds",
    "workqueue_retries_total",
    "workqueue_unfinished_work_seconds",
    "workqueue_longest_running_processor_seconds",
    "leader_election_master_status",
)


def _exposition(m: metrics.Metrics) -> str:
    body, content_type = m.render()
    assert content_type.startswith("text/plain; version=0.0.4")
    return body.decode()


def test_exposition_contains_every_framework_metric_name() -> None:
    m = metrics.Metrics()
    m.controller("widget").set_max_concurrent_reconciles(2)
    queue = m.workqueue("widget")
    queue.observe_queue_duration(0.1)
    queue.observe_work_duration(0.2)
    m.leader_election("localcache-controller").set_master_status(True)
    text = _exposition(m)
    for name in FRAMEWORK_NAMES:
        assert f"# TYPE {name} " in text, name
    assert 'controller_runtime_reconcile_total{controller="widget",result="success"} 0.0' in text
    assert 'workqueue_depth{controller="widget",name="widget",priority=""} 0.0' in text
    assert 'workqueue_adds_total{controller="widget",name="widget"} 0.0' in text
    assert 'leader_election_master_status{name="localcache-controller"} 1.0' in text
    assert "process_resident_memory_bytes" in text
    assert "_created" not in text, "Go's controller-runtime exports no *_created series"


def test_controller_series_are_pre_initialised_to_zero() -> None:
    m = metrics.Metrics()
    m.controller("widget")
    for result in metrics.RECONCILE_RESULTS:
        value = m.value("controller_runtime_reconcile_total", controller="widget", result=result)
        assert value == 0.0, result
    for name in (
        "controller_runtime_reconcile_errors_total",
        "controller_runtime_terminal_reconcile_errors_total",
        "controller_runtime_reconcile_panics_total",
        "controller_runtime_active_workers",
    ):
        assert m.value(name, controller="widget") == 0.0, name


def test_recorders_move_the_series_they_name() -> None:
    m = metrics.Metrics()
    ctl = m.controller("widget")
    ctl.inc_reconcile_total("requeue_after")
    ctl.inc_reconcile_errors()
    ctl.inc_terminal_reconcile_errors()
    ctl.inc_active_workers()
    ctl.observe_reconcile_time(0.3)
    queue = m.workqueue("widget")
    queue.set_depth(4)
    queue.inc_adds()
    queue.inc_retries()
    queue.set_unfinished_work(2.5)
    queue.set_longest_running_processor(1.5)
    labels = {"name": "widget", "controller": "widget"}
    assert (
        m.value("controller_runtime_reconcile_total", controller="widget", result="requeue_after")
        == 1
    )
    assert m.value("controller_runtime_reconcile_errors_total", controller="widget") == 1
    assert m.value("controller_runtime_active_workers", controller="widget") == 1
    assert m.value("controller_runtime_reconcile_time_seconds_sum", controller="widget") == 0.3
    assert m.value("workqueue_depth", priority="", **labels) == 4
    assert m.value("workqueue_adds_total", **labels) == 1
    assert m.value("workqueue_retries_total", **labels) == 1
    assert m.value("workqueue_unfinished_work_seconds", **labels) == 2.5
    assert m.value("workqueue_longest_running_processor_seconds", **labels) == 1.5


def test_buckets_match_controller_runtime() -> None:
    assert len(metrics.RECONCILE_TIME_BUCKETS) == 40
    assert metrics.RECONCILE_TIME_BUCKETS[0] == 0.005
    assert metrics.RECONCILE_TIME_BUCKETS[-1] == 60.0
    go_exponential_buckets = tuple(10.0**exp for exp in range(-8, 4))  # (10e-9, 10, 12)
    assert go_exponential_buckets == metrics.WORKQUEUE_BUCKETS
    m = metrics.Metrics()
    m.controller("widget").observe_reconcile_time(0.01)
    m.workqueue("widget").observe_work_duration(0.01)
    text = _exposition(m)
    assert 'controller_runtime_reconcile_time_seconds_bucket{controller="widget",le="60.0"}' in text
    assert 'workqueue_work_duration_seconds_bucket{controller="widget",le="1e-08"' in text
    assert 'workqueue_work_duration_seconds_bucket{controller="widget",le="1000.0"' in text


def test_each_metrics_object_has_its_own_registry() -> None:
    first, second = metrics.Metrics(), metrics.Metrics()
    first.controller("widget").inc_reconcile_errors()
    second.controller("widget")
    assert second.value("controller_runtime_reconcile_errors_total", controller="widget") == 0
    assert (
        prometheus_client.REGISTRY.get_sample_value(
            "controller_runtime_reconcile_errors_total", {"controller": "widget"}
        )
        is None
    )


def test_domain_metrics_are_made_without_importing_prometheus() -> None:
    m = metrics.Metrics()
    downloads = m.counter(
        "localcache_downloads_total", "Model downloads started", labels=("result",)
    )
    downloads.inc(result="ok")
    downloads.inc(2, result="ok")
    models = m.gauge("localcache_cached_models", "Models on this node")
    models.set(3)
    models.dec()
    sizes = m.gauge("localcache_model_bytes", "Bytes per model", labels=("model",))
    sizes.set(10, model="iris")
    sizes.remove(model="iris")
    durations = m.histogram(
        "localcache_download_seconds", "Download durations", buckets=(1.0, 10.0)
    )
    durations.observe(4.0)
    assert m.value("localcache_downloads_total", result="ok") == 3
    assert m.value("localcache_cached_models") == 2
    assert m.value("localcache_model_bytes", model="iris") is None
    assert m.value("localcache_download_seconds_bucket", le="10.0") == 1
    assert m.value("localcache_download_seconds_bucket", le="1.0") == 0


def test_framework_histograms_count_each_bound_inclusively_and_cumulatively() -> None:
    m = metrics.Metrics()
    recorder = m.controller("widget")
    for seconds in (0.005, 0.3, 100.0):
        recorder.observe_reconcile_time(seconds)

    def bucket(le: str) -> float | None:
        return m.value(
            "controller_runtime_reconcile_time_seconds_bucket", controller="widget", le=le
        )

    assert (bucket("0.005"), bucket("0.25"), bucket("0.3"), bucket("60.0")) == (1, 1, 2, 2)
    assert bucket("+Inf") == 3
    name = "controller_runtime_reconcile_time_seconds"
    assert m.value(f"{name}_count", controller="widget") == 3
    assert m.value(f"{name}_sum", controller="widget") == pytest.approx(100.305)


def test_recorders_for_one_name_share_their_series() -> None:
    m = metrics.Metrics()
    m.controller("widget").inc_reconcile_errors()
    m.controller("widget").inc_reconcile_errors()
    m.workqueue("widget").inc_adds()
    m.workqueue("widget").inc_adds()
    assert m.value("controller_runtime_reconcile_errors_total", controller="widget") == 2
    assert m.value("workqueue_adds_total", name="widget", controller="widget") == 2


def test_a_domain_metric_cannot_take_a_framework_name() -> None:
    m = metrics.Metrics()
    with pytest.raises(ValueError, match="Duplicated"):
        m.counter("workqueue_adds_total", "Clashes with the work queue's counter")


def test_declaring_a_series_twice_returns_the_same_family() -> None:
    # Two agents in one process (`localcache run`) declare the same download series.
    m = metrics.Metrics()
    first = m.counter("localcache_test_downloads_total", "downloads")
    second = m.counter("localcache_test_downloads_total", "downloads")
    assert first is second
    first.inc()
    second.inc()
    assert m.value("localcache_test_downloads_total") == 2


def test_redeclaring_a_series_with_other_labels_is_refused() -> None:
    m = metrics.Metrics()
    m.gauge("localcache_test_depth", "depth", labels=("queue",))
    with pytest.raises(ValueError, match="already exists as a gauge"):
        m.gauge("localcache_test_depth", "depth", labels=("other",))
    with pytest.raises(ValueError, match="already exists as a gauge"):
        m.counter("localcache_test_depth", "depth", labels=("queue",))


def test_reconcile_panics_are_counted_per_controller() -> None:
    m = metrics.Metrics()
    m.controller("widget").inc_reconcile_panics()
    m.controller("gadget")
    assert m.value("controller_runtime_reconcile_panics_total", controller="widget") == 1
    assert m.value("controller_runtime_reconcile_panics_total", controller="gadget") == 0
    text = _exposition(m)
    assert "# TYPE controller_runtime_reconcile_panics_total counter" in text
    assert 'controller_runtime_reconcile_panics_total{controller="widget"} 1.0' in text


def test_rest_client_metrics_have_client_gos_names_labels_and_buckets() -> None:
    m = metrics.Metrics()
    rest = m.rest_client()
    rest.inc_requests("200", "GET", "127.0.0.1:6443")
    rest.inc_requests("200", "GET", "127.0.0.1:6443")
    rest.inc_requests("<error>", "PATCH", "127.0.0.1:6443")
    rest.observe_request_duration("GET", "127.0.0.1:6443", 0.02)
    labels = {"method": "GET", "host": "127.0.0.1:6443"}
    assert m.value("rest_client_requests_total", code="200", **labels) == 2
    assert (
        m.value("rest_client_requests_total", code="<error>", method="PATCH", host=labels["host"])
        == 1
    )
    timed = {"verb": "GET", "host": "127.0.0.1:6443"}
    assert m.value("rest_client_request_duration_seconds_bucket", le="0.005", **timed) == 0
    assert m.value("rest_client_request_duration_seconds_bucket", le="0.025", **timed) == 1
    assert m.value("rest_client_request_duration_seconds_count", **timed) == 1
    assert metrics.REST_CLIENT_LATENCY_BUCKETS == (
        0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
    )  # fmt: skip
    text = _exposition(m)
    assert "# TYPE rest_client_requests_total counter" in text
    assert "# TYPE rest_client_request_duration_seconds histogram" in text
    assert 'rest_client_requests_total{code="200",host="127.0.0.1:6443",method="GET"} 2.0' in text
    # Another recorder (another client of the process) adds to the same series.
    m.rest_client().inc_requests("200", "GET", "127.0.0.1:6443")
    assert m.value("rest_client_requests_total", code="200", **labels) == 3


def test_peer_metrics_are_declared_once_with_their_design_names() -> None:
    registry = metrics.Metrics()
    peer = registry.peer()
    assert registry.peer() == peer  # asking again gives the same families
    peer.bytes.inc(10, direction="sent", source="node-b")
    peer.bytes.inc(7, direction="received", source="node-a")
    peer.origin_bytes.inc(5)
    peer.fallbacks.inc(reason="no-source")
    peer.verify_failures.inc()
    peer.refusals.inc(reason="other-scope")
    peer.uploads_in_flight.set(2)
    samples = {
        ("localcache_p2p_bytes_total", (("direction", "sent"), ("source", "node-b"))): 10,
        ("localcache_p2p_bytes_total", (("direction", "received"), ("source", "node-a"))): 7,
        ("localcache_p2p_origin_bytes_total", ()): 5,
        ("localcache_p2p_fallbacks_total", (("reason", "no-source"),)): 1,
        ("localcache_p2p_verify_failures_total", ()): 1,
        ("localcache_p2p_refusals_total", (("reason", "other-scope"),)): 1,
        ("localcache_p2p_uploads_in_flight", ()): 2,
    }
    for (name, labels), value in samples.items():
        assert registry.value(name, **dict(labels)) == value, name

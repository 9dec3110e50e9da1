"""Optional kinds: a CRD counts as serving only when Established and serving our version;
readers answer empty while the kind is absent and refuse while it lists; the inner informer
starts when the CRD serves, stops when it goes and starts afresh when it comes back."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from localcache.devenv.waiting import wait_until
from localcache.runtime import clock, factory, informer, keys, kube, listwatch, manager
from localcache.runtime.crds import optional
from tests.unit.runtime.test_factory import FakeClient

Obj = dict[str, Any]
WIDGETS = kube.Resource("example.io", "v1beta1", "widgets", "Widget")
A = optional.Availability


def crd(
    *, established: str = "True", versions: tuple[tuple[str, bool], ...] = (("v1beta1", True),)
) -> Obj:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.io", "resourceVersion": "1"},
        "spec": {
            "group": "example.io",
            "versions": [
                {"name": n, "served": s, "schema": {"openAPIV3Schema": {"type": "object"}}}
                for n, s in versions
            ],
        },
        "status": {"conditions": [{"type": "Established", "status": established}]},
    }


def widget(name: str) -> Obj:
    return {
        "apiVersion": "example.io/v1beta1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": "5"},
    }


def test_a_crd_serves_only_when_established_and_serving_our_version() -> None:
    assert optional.crd_serves(crd(), "v1beta1")
    assert not optional.crd_serves(None, "v1beta1")
    assert not optional.crd_serves(crd(established="False"), "v1beta1")
    assert not optional.crd_serves(crd(versions=(("v1beta1", False),)), "v1beta1")
    assert not optional.crd_serves(crd(versions=(("v1", True),)), "v1beta1")
    assert optional.crd_serves(crd(versions=(("v1", True), ("v1beta1", True))), "v1beta1")


def test_the_crd_summary_keeps_what_serving_depends_on_and_drops_the_schema() -> None:
    summary = optional.crd_summary(crd())
    assert optional.crd_serves(summary, "v1beta1")
    assert "schema" not in summary["spec"]["versions"][0]
    assert optional.crd_field_selector(WIDGETS) == "metadata.name=widgets.example.io"


def _crd_informer(client: FakeClient) -> informer.Informer:
    source = listwatch.ListWatch(client, optional.CRDS)
    return informer.Informer(source, transform=optional.crd_summary)


def test_readers_are_empty_while_absent_refuse_while_listing_and_read_once_synced() -> None:
    client = FakeClient()
    opt = optional.OptionalInformer(client, WIDGETS, crds=_crd_informer(client))
    reader = opt.reader()
    assert opt.availability is A.ABSENT
    assert opt.settled()
    assert reader.list() == []
    assert reader.keys() == []
    assert reader.get(keys.ObjectKey("ns", "w")) is None
    assert reader.by_index("namespace", "ns") == []
    opt.availability = A.SYNCING
    assert not opt.settled()
    with pytest.raises(optional.NotSynced):
        reader.list()
    with pytest.raises(optional.NotSynced):
        reader.get(keys.ObjectKey("ns", "w"))


async def test_the_inner_informer_follows_the_crd_appearing_going_and_coming_back() -> None:
    client = FakeClient({str(WIDGETS): [widget("w")]})
    crds = _crd_informer(client)
    crds.replace([], "1")  # synced: no CRD yet
    opt = optional.OptionalInformer(client, WIDGETS, crds=crds, clock=clock.SystemClock())
    seen: list[informer.Event] = []
    changes: list[optional.Availability] = []
    opt.add_handler(seen.append)
    opt.on_change(changes.append)
    task = asyncio.create_task(opt.run(), name="optional widgets")
    try:
        assert opt.availability.value == "absent"
        assert opt.current is None

        crds.upsert(crd(established="False"))
        assert not opt.wanted(), "not Established yet"

        crds.upsert({**crd(), "metadata": {"name": "widgets.example.io", "resourceVersion": "2"}})
        await wait_until(lambda: opt.availability is A.SYNCED, timeout=5, what="widgets synced")
        first = opt.current
        assert opt.reader().get(keys.ObjectKey("ns", "w")) is not None
        assert [type(e).__name__ for e in seen] == ["Added"]
        assert changes == [A.SYNCED]

        crds.delete(crd())
        await wait_until(lambda: opt.availability is A.ABSENT, timeout=5, what="widgets stopped")
        assert opt.current is None
        assert opt.reader().list() == []
        assert changes == [A.SYNCED, A.ABSENT]

        crds.upsert({**crd(), "metadata": {"name": "widgets.example.io", "resourceVersion": "3"}})
        await wait_until(lambda: opt.availability is A.SYNCED, timeout=5, what="widgets again")
        assert opt.current is not None
        assert opt.current is not first, "a fresh informer"
        assert changes == [A.SYNCED, A.ABSENT, A.SYNCED]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert opt.current is None


def test_the_factory_shares_one_optional_informer_and_runs_it_without_gating_readiness() -> None:
    mgr = manager.Manager(handle_signals=False)
    shared = factory.InformerFactory(FakeClient(), mgr, clock=clock.FakeClock())
    a = shared.optional_informer(WIDGETS, indexers={"x": informer_index})
    b = shared.optional_informer(WIDGETS, indexers={"x": informer_index})
    assert a is b
    assert "x" in a.store.index_names
    targets = [s.target for s in shared.stats()]
    assert targets == [
        factory.WatchTarget(optional.CRDS, field_selector="metadata.name=widgets.example.io")
    ], "only the CRD informer is a Manager informer (gates /readyz)"
    with pytest.raises(factory.IndexConflict):
        shared.optional_informer(WIDGETS, indexers={"x": lambda _o: ["other"]})


def informer_index(obj: Obj) -> list[str]:
    return [str(obj.get("kind"))]

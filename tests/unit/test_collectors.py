"""The collector registry: adding a collector is one module and one registration. A stand-in
registered here is run by the sampler in its place in the order, and its series and status
reach ``/metrics`` with nothing else changed; one that fails costs its own series only. And the
metric filter (``--metric-allowlist`` / ``--metric-denylist``) over the whole body."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry, Counter

from nodeguard.cli import build_parser
from nodeguard.cli.run import metric_filter
from nodeguard.collectors import base
from nodeguard.collectors.base import Collector, Parts, ordered, register
from nodeguard.collectors.families import Families, Family
from nodeguard.exposition.metric_filter import MetricFilter
from nodeguard.sampling.sampler import COLLECTOR_NAMES, Sampler, SamplerConfig
from nodeguard.server import make_app
from nodeguard.snapshot import NodeSnapshot
from tests.support.hosts import host_paths


class StandIn(Collector):
    """Reads after meminfo (the free memory it saw) and renders one labelled gauge."""

    name = "standin"
    after: ClassVar[tuple[str, ...]] = ("meminfo",)

    def read(self, parts: Parts) -> None:
        assert parts.meminfo is not None  # read first: it is named in `after`
        parts.extra[self.name] = {"free": parts.meminfo.free_bytes, "label": 'a "quoted"\nvalue'}

    @staticmethod
    def render(snapshot: NodeSnapshot, out: Families) -> Iterator[Family]:
        part = snapshot.extra.get("standin")
        if part is None:
            return
        family = out.gauge("standin_free_bytes", "free memory as the stand-in saw it", ["what"])
        family.add((part["label"],), part["free"])
        yield family


class Broken(Collector):
    name = "broken"

    def read(self, parts: Parts) -> None:
        raise RuntimeError("a stand-in that fails")

    @staticmethod
    def render(snapshot: NodeSnapshot, out: Families) -> Iterator[Family]:
        return iter(())


@pytest.fixture
def restored() -> Iterator[None]:
    """The registry as it was, after the test."""
    saved = dict(base.COLLECTORS)
    yield
    base.COLLECTORS.clear()
    base.COLLECTORS.update(saved)


@pytest.fixture
def registered(restored: None) -> None:
    """StandIn and Broken registered for one test."""
    register(StandIn)
    register(Broken)


async def _metrics(
    sampler: Sampler,
    metric_filter: MetricFilter | None = None,
    registry: CollectorRegistry | None = None,
) -> str:
    app = make_app(
        sampler=sampler, registry=registry or CollectorRegistry(), metric_filter=metric_filter
    )
    client: TestClient[Any, Any] = TestClient(TestServer(app))
    await client.start_server()
    try:
        resp = await client.get("/metrics")
        assert resp.status == 200
        return await resp.text()
    finally:
        await client.close()


@pytest.fixture
async def sampler() -> AsyncIterator[Sampler]:
    s = Sampler(config=SamplerConfig(paths=host_paths("v2-systemd-containerd"), node_name="n"))
    yield s
    s.close()


def test_every_collector_module_registers_its_collector_in_reading_order() -> None:
    """Every ``Collector`` subclass defined in ``nodeguard/collectors/`` is registered (a
    module that forgets ``@register`` fails here), and the sampler's list is the registry's."""
    import importlib
    import inspect
    import pkgutil

    import nodeguard.collectors as package

    defined = {
        cls.name
        for info in pkgutil.iter_modules(package.__path__)
        for _, cls in inspect.getmembers(importlib.import_module(f"{package.__name__}.{info.name}"))
        if inspect.isclass(cls)
        and issubclass(cls, Collector)
        and not inspect.isabstract(cls)
        and cls.__module__ == f"{package.__name__}.{info.name}"
    }
    shipped = {n for n, c in base.COLLECTORS.items() if c.__module__.startswith("nodeguard.")}
    assert defined == shipped and len(shipped) >= 7, defined ^ shipped
    assert set(COLLECTOR_NAMES) == shipped
    order = [c.name for c in ordered()]
    for cls in base.COLLECTORS.values():  # each after those whose parts it reads
        assert all(order.index(a) < order.index(cls.name) for a in cls.after), cls.name


async def test_a_registered_stand_in_reaches_metrics_with_its_status(registered: None) -> None:
    s = Sampler(
        config=SamplerConfig(
            paths=host_paths("v2-systemd-containerd"),
            node_name="n",
            collectors=frozenset(base.COLLECTORS) - {"gpu"},
        )
    )
    try:
        names = [c.name for c in s.collectors]
        assert names.index("standin") > names.index("meminfo")
        snap = s.sample_once()
        body = await _metrics(s)
    finally:
        s.close()
    assert snap.meminfo is not None
    assert snap.meminfo.free_bytes == 2 << 30
    assert snap.extra["standin"]["free"] == 2 << 30
    assert 'nodeguard_standin_free_bytes{what="a \\"quoted\\"\\nvalue"} 2.147483648e+09' in body
    assert 'nodeguard_collector_success{collector="standin"} 1.0' in body
    assert 'nodeguard_collector_success{collector="broken"} 0.0' in body
    assert 'nodeguard_collector_success{collector="cgroups"} 1.0' in body  # the rest still read
    assert "nodeguard_container_memory_working_set_bytes{" in body


def test_registration_and_order_refuse_mistakes(restored: None) -> None:
    with pytest.raises(ValueError, match="registered twice"):
        register(type("Again", (StandIn,), {"name": "meminfo"}))

    class Loop(StandIn):
        name = "loop"
        after: ClassVar[tuple[str, ...]] = ("loop2",)

    class Loop2(StandIn):
        name = "loop2"
        after: ClassVar[tuple[str, ...]] = ("loop",)

    register(Loop)
    with pytest.raises(ValueError, match="unknown"):
        ordered()
    register(Loop2)
    with pytest.raises(ValueError, match="wait on each other"):
        ordered()


def _families(body: str) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+) ", body, re.M))


async def test_metric_allowlist_and_denylist(sampler: Sampler) -> None:
    sampler.sample_once()
    registry = CollectorRegistry()
    Counter("nodeguard_test_actions", "actions", registry=registry).inc()
    everything = _families(await _metrics(sampler, registry=registry))
    assert "nodeguard_test_actions_total" in everything
    assert "nodeguard_pod_memory_usage_bytes" in everything

    deny = MetricFilter(deny=("nodeguard_pod_memory_.*", "nodeguard_test_actions_total"))
    denied = _families(await _metrics(sampler, deny, registry=registry))
    assert not any(f.startswith("nodeguard_pod_memory_") for f in denied)
    assert "nodeguard_test_actions_total" not in denied
    assert "nodeguard_container_memory_usage_bytes" in denied
    assert denied == {
        f
        for f in everything
        if not f.startswith(("nodeguard_pod_memory_", "nodeguard_test_actions_"))
    }  # the counter goes whole, its _created sample (a family of its own here) with it

    allow = MetricFilter(
        allow=("nodeguard_container_memory_(working_set|limit)_bytes", "nodeguard_build_info")
    )
    body = await _metrics(sampler, allow, registry=registry)
    assert _families(body) == {
        "nodeguard_container_memory_working_set_bytes",
        "nodeguard_container_memory_limit_bytes",
        "nodeguard_build_info",
    }
    # A counter is matched by the name its series carry: with _total, never a prefix.
    only = MetricFilter(allow=("nodeguard_container_memory_oom_kills",))
    assert _families(await _metrics(sampler, only, registry=registry)) == set()


def test_metric_filter_flags() -> None:
    parser = build_parser()
    args = parser.parse_args(["run", "--metric-denylist", "nodeguard_pod_.*, nodeguard_gpu_.*"])
    assert metric_filter(args) == MetricFilter(deny=("nodeguard_pod_.*", "nodeguard_gpu_.*"))
    assert not metric_filter(parser.parse_args(["run"])).active
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--metric-allowlist=a", "--metric-denylist=b"])
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--metric-allowlist=nodeguard_(pod"])
    with pytest.raises(ValueError, match="mutually exclusive"):
        MetricFilter(allow=("a",), deny=("b",))

"""The fast writer of ``/metrics`` (nodeguard/exposition/render.py) against its oracle,
prometheus_client's own writers (the plain path, ``nodeguard.exposition.handler.plain_body``):
the same bytes in the text format 0.0.4 and OpenMetrics 1.0.0, gzipped or not, for

- every fixture host's snapshot (the golden bodies' hosts among them), with the agent's own
  families after the snapshot's;
- random snapshots, a run of them through one writer (so that the lines it keeps between
  renders are exercised): pods and containers coming and going, names from the pod list with
  quotes, backslashes, newlines and non-ASCII, values from 0 to 2**64, counters absent and
  present, GPUs, PSI;
- random families: any text in label values and HELP, NaN, +Inf, -Inf, 0, -0.0, huge and tiny
  floats and ints, families and series appearing and disappearing between renders.

Derandomized and bounded: a few seconds.
"""

from __future__ import annotations

import dataclasses
import gzip
import math
import random
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import choose_encoder
from prometheus_client.utils import floatToGoString

from nodeguard.collectors.families import Family, Kind
from nodeguard.exposition.exporter import snapshot_families
from nodeguard.exposition.handler import Exposition, encoder_for, plain_body
from nodeguard.exposition.render import Renderer, go_float
from nodeguard.sampling.sampler import COLLECTOR_NAMES
from nodeguard.snapshot import (
    CgroupMemory,
    CollectorStatus,
    ContainerMemory,
    GpuDevice,
    GpuInfo,
    GpuMemory,
    GpuProcess,
    MigDevice,
    NodeMeta,
    NodeSnapshot,
    OomLog,
    PodMemory,
    PodMeta,
    Pressure,
    PressureLine,
)
from tests.support.hosts import fixture_snapshot

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hosts"
HOSTS = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
OPENMETRICS = "application/openmetrics-text;version=1.0.0"
ACCEPTS = [
    OPENMETRICS,  # what Prometheus asks for first
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8",
    "text/plain;version=0.0.4",
    "",  # no Accept: the text format
]
# Label values and HELP texts that need escaping, or that a writer could get wrong.
HOSTILE = [
    "",
    'a"b',
    "back\\slash",
    "new\nline",
    '\\"\n\\n',
    "ünïcødé",
    "日本語",
    "emoji 🧠",
    "tab\tand space",
    "}{,=",
    "\\\\",
    "\r",
    "# EOF",
]


def _own() -> CollectorRegistry:
    """Stand-ins for the agent's own families (collected on the loop): a counter (with its
    ``_created`` sample, which the two formats place differently) and a labelled gauge."""
    registry = CollectorRegistry(auto_describe=True)
    Counter("nodeguard_test_actions", "actions", ["outcome"], registry=registry).labels("x").inc(3)
    Gauge("nodeguard_test_connections", 'open "now"', registry=registry).set(2)
    return registry


def _both(
    exposition: Exposition, families: list[Family], *, accept: str, own: CollectorRegistry
) -> tuple[bytes, bytes]:
    """The fast path's body (plain and gzipped, which must inflate to the same) and the
    plain path's."""
    metrics = list(own.collect())
    fast, _ = exposition.render(accept=accept, names=(), own=metrics)
    zipped, headers = exposition.render(
        accept=accept, names=(), own=metrics, accept_encoding="gzip"
    )
    assert headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(zipped) == fast
    plain = plain_body(families=families, own=metrics, encoder=choose_encoder(accept)[0])
    return fast, plain


@pytest.mark.parametrize("host", HOSTS)
def test_fixture_hosts_render_the_librarys_bytes(host: str) -> None:
    snap = fixture_snapshot(host)
    exposition = Exposition(latest=lambda: snap, families=snapshot_families)
    for accept in ACCEPTS:
        fast, plain = _both(exposition, snapshot_families(snap), accept=accept, own=_own())
        assert fast == plain, accept
        assert b"nodeguard_container_memory_working_set_bytes{" in fast


# -- random snapshots ----------------------------------------------------------------------------
def _text(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return rng.choice(HOSTILE)
    alphabet = "abc-_.:/ \"\\\n'é日🧠0123456789"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))


def _size(rng: random.Random) -> int | None:
    return rng.choice(
        [None, 0, 1, 999_999, 1_000_000, rng.randint(0, 1 << 40), rng.randint(0, 1 << 64), 1 << 53]
    )


def _pressure(rng: random.Random) -> Pressure | None:
    if rng.random() < 0.3:
        return None

    def line() -> PressureLine:
        return PressureLine(
            avg10=rng.choice([0.0, 0.01, rng.random()]),
            avg60=rng.random(),
            avg300=rng.random(),
            total_seconds=rng.choice([0.0, rng.random() * 1e6, 1e-6]),
        )

    return Pressure(some=line(), full=line() if rng.random() < 0.7 else None)


def _memory(rng: random.Random, path: str) -> CgroupMemory:
    usage = _size(rng)
    return CgroupMemory(
        path=path,
        cgroup_version=rng.choice([1, 2]),
        usage_bytes=usage,
        working_set_bytes=_size(rng),
        anon_bytes=_size(rng),
        file_bytes=_size(rng),
        inactive_file_bytes=_size(rng),
        limit_bytes=_size(rng),
        effective_limit_bytes=_size(rng),
        oom_kills=_size(rng),
        limit_hits=_size(rng),
        high_events=_size(rng),
        pressure=_pressure(rng),
    )


def _meta(rng: random.Random, uid: str, containers: list[str]) -> PodMeta:
    return PodMeta(
        uid=uid,
        name=_text(rng),
        namespace=_text(rng),
        node_name="n",
        phase=rng.choice(["Running", "Succeeded", "Pending"]),
        priority=0,
        priority_class=_text(rng),
        qos_class="burstable",
        memory_request_bytes=rng.randint(0, 1 << 36),
        memory_limit_bytes=rng.choice([None, rng.randint(0, 1 << 36)]),
        owners=(),
        labels={},
        annotations={},
        containers={c: _text(rng) for c in containers if rng.random() < 0.8},
        container_requests={},
        mirror=False,
        daemonset=False,
        terminating=False,
    )


def _gpu(rng: random.Random, pods: list[PodMemory]) -> GpuInfo | None:
    if rng.random() < 0.5:
        return None
    devices = []
    for index in range(rng.randint(0, 3)):
        mem = GpuMemory(
            total_bytes=80 << 30,
            used_bytes=rng.randint(0, 80 << 30),
            free_bytes=rng.randint(0, 80 << 30),
            reserved_bytes=rng.choice([None, 1 << 29]),
            info_version=rng.choice([1, 2]),
        )
        procs = tuple(
            GpuProcess(
                pid=rng.randint(1, 1 << 22),
                used_bytes=_size(rng),
                mig_gpu_instance_id=rng.choice([None, 1, 2]),
                mig_compute_instance_id=None,
                cgroup=None,
                pod_uid=pod.uid,
                container_id=rng.choice([None, *(c.container_id for c in pod.containers)]),
            )
            for pod in rng.sample(pods, min(len(pods), rng.randint(0, 3)))
        )
        migs = tuple(
            MigDevice(
                index=i, uuid=_text(rng), gpu_instance_id=i, compute_instance_id=0, memory=mem
            )
            for i in range(rng.randint(0, 2))
        )
        devices.append(
            GpuDevice(
                index=index,
                uuid=_text(rng),
                name=_text(rng),
                mig_enabled=rng.choice([None, True, False]),
                memory=rng.choice([None, mem]),
                mig_devices=migs,
                processes=procs,
                lost=rng.random() < 0.1,
            )
        )
    return GpuInfo(driver_version=rng.choice([None, _text(rng)]), devices=tuple(devices))


def _snapshot(rng: random.Random, uids: list[str], t: float) -> NodeSnapshot:
    pods = []
    for uid in uids:
        containers = [f"{uid}-c{i}" for i in range(rng.randint(0, 3))]
        pods.append(
            PodMemory(
                uid=uid,
                qos_class=rng.choice(["guaranteed", "burstable", "besteffort"]),
                memory=_memory(rng, f"/{uid}"),
                containers=tuple(
                    ContainerMemory(container_id=c, runtime="", memory=_memory(rng, f"/{uid}/{c}"))
                    for c in containers
                ),
            )
        )
    with_meta = rng.random() < 0.7
    meta = (
        {p.uid: _meta(rng, p.uid, [c.container_id for c in p.containers]) for p in pods}
        if with_meta
        else None
    )
    by_container = {
        f"{p.uid}/{c.container_id}": rng.randint(1, 9) for p in pods[:2] for c in p.containers
    }
    return NodeSnapshot(
        timestamp=t,
        node_name="n",
        meminfo=None,
        pressure=_pressure(rng),
        pods=tuple(pods),
        oom=rng.choice(
            [
                None,
                OomLog(
                    total=3,
                    by_constraint={"CONSTRAINT_MEMCG": 2, _text(rng): 1},
                    by_container=by_container,
                    recent=(),
                ),
            ]
        ),
        processes=(),
        collectors=tuple(
            CollectorStatus(
                name=name,
                success=rng.random() < 0.8,
                available=rng.random() < 0.8,
                duration_seconds=rng.random() / 100,
                skipped={"unreadable": 2} if rng.random() < 0.2 else {},
            )
            for name in COLLECTOR_NAMES
        ),
        cgroup_version=2,
        pod_meta=meta,
        node_meta=rng.choice(
            [
                None,
                NodeMeta(
                    name="n",
                    allocatable_memory_bytes=1 << 36,
                    capacity_memory_bytes=None,
                    unschedulable=False,
                ),
            ]
        ),
        gpu=_gpu(rng, pods),
        cgroup_files_open=rng.choice([None, 0, 2200]),
    )


@pytest.mark.parametrize("seed", range(6))
def test_random_snapshots_render_the_librarys_bytes(seed: int) -> None:
    """Runs of snapshots through one writer, pods coming and going, in every format."""
    rng = random.Random(seed)
    pool = [f"pod-{i:03d}" for i in range(30)]
    latest: list[NodeSnapshot] = []
    exposition = Exposition(latest=lambda: latest[-1], families=snapshot_families)
    own = _own()
    for step in range(40):
        if latest and rng.random() < 0.4:  # the same pods, memory and all: most families too
            latest.append(dataclasses.replace(latest[-1], timestamp=1000.0 + step))
        else:
            uids = sorted(rng.sample(pool, rng.randint(0, 12)))
            latest.append(_snapshot(rng, uids, t=1000.0 + step))
        families = snapshot_families(latest[-1])
        accept = rng.choice(ACCEPTS)
        fast, plain = _both(exposition, families, accept=accept, own=own)
        assert fast == plain, (seed, step, accept)
        # The same snapshot again (an HA pair's second scrape): served from what was kept.
        again, _ = exposition.render(accept=accept, names=(), own=list(own.collect()))
        assert again == plain


# -- random families -----------------------------------------------------------------------------
def _value(rng: random.Random) -> float | int:
    value: float | int = rng.choice(
        [
            0,
            0.0,
            -0.0,
            math.nan,
            math.inf,
            -math.inf,
            1,
            -1,
            True,
            999_999,
            1_000_000,
            rng.randint(-(1 << 70), 1 << 70),
            rng.randint(0, 1 << 64),
            rng.randint(0, 1 << 53),
            rng.random(),
            rng.random() * 10 ** rng.randint(-30, 30),
            -rng.random() * 10 ** rng.randint(-30, 30),
            5e-324,
            1.7976931348623157e308,
            1e16,
            123456789.0,
        ]
    )
    return value


def _family(rng: random.Random, name: str, kind: Kind, labels: tuple[str, ...]) -> Family:
    family = Family(name=name, kind=kind, help=_text(rng), labels=labels)
    keys = [tuple(_text(rng) for _ in labels) for _ in range(rng.randint(0, 6))]
    for key in keys + rng.sample(keys, len(keys) // 2):  # some series again, as the library allows
        family.add(key, _value(rng))
    return family


@pytest.mark.parametrize("seed", range(6))
def test_random_families_render_the_librarys_bytes(seed: int) -> None:
    rng = random.Random(100 + seed)
    shapes = [
        (f"nodeguard_f{i}", rng.choice(["gauge", "counter"]), labels)
        for i, labels in enumerate(
            [(), ("a",), ("pod", "namespace"), ("z", "b", "m"), ("container", "pod", "namespace")]
        )
    ]
    renderer = Renderer()
    last: dict[str, Family] = {}
    for step in range(120):
        families = []
        for name, kind, labels in rng.sample(shapes, rng.randint(0, len(shapes))):
            family = _family(rng, name, kind, labels)  # type: ignore[arg-type]
            before = last.get(name)
            if before is not None and rng.random() < 0.5:
                # As last time, or nearly: what the writer keeps whole, or must not.
                family = Family(name=name, kind=before.kind, help=before.help, labels=labels)
                for key, was in before.samples:
                    now = (
                        rng.choice([0, 0.0, -0.0, was, _value(rng)]) if rng.random() < 0.1 else was
                    )
                    family.add(key, now)
            families.append(family)
            last[name] = family
        for accept in (OPENMETRICS, ""):
            chunks = renderer.render(families, openmetrics=accept == OPENMETRICS)
            fast = b"".join(c.data for c in chunks)
            fast += b"# EOF\n" if accept == OPENMETRICS else b""
            plain = plain_body(families=families, own=(), encoder=choose_encoder(accept)[0])
            assert fast == plain, (seed, step, accept)


def test_go_float_is_the_librarys_float_to_go_string() -> None:
    rng = random.Random(7)
    values: list[float | int] = [0, 1, 999_999, 10**6, 10**15, 10**16 - 1, 10**16, (1 << 53) - 1]
    values += [1 << 53, -1, -(10**6), 10**7, 1200000, 1000001]
    for _ in range(50_000):
        values.append(rng.randint(0, 10 ** rng.randint(0, 18)))
        values.append(rng.randint(1, 9) * 10 ** rng.randint(0, 17))
        values.append(_value(rng))
    # prometheus_client.utils carries no annotations.
    theirs = [floatToGoString(v) for v in values]  # type: ignore[no-untyped-call]
    assert [go_float(v) for v in values] == theirs


def test_the_swap_and_the_fast_format_cover_only_what_they_write_alike() -> None:
    """Formats the fast writer does not write go to the library (other versions, escapings)."""
    from nodeguard.exposition.handler import fast_format

    assert fast_format(encoder_for("")[0]) == "text"
    assert fast_format(encoder_for(OPENMETRICS)[0]) == "openmetrics"
    for accept in (
        "application/openmetrics-text;version=2.0.0",
        "application/openmetrics-text;version=1.0.0;escaping=dots",
        "application/openmetrics-text;version=1.0.0;escaping=values",
        "text/plain;version=1.0.0;escaping=allow-utf-8",
    ):
        assert fast_format(encoder_for(accept)[0]) is None, accept

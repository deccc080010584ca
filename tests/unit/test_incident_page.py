"""The incident page (nodeguard/remediation/incident_page.py) of a record made the real way: the
real Timeline and OomIncidents over synthetic snapshots of a container growing to its limit
and killed, a dry-run firing on it before. The record round-trips out of its script element,
hostile names stay text, the node memory stack adds up to usable at every point, a record
without a timeline says so, and the agent and the command line give the same page."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import html
import json
import re
from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from nodeguard.cli import main
from nodeguard.remediation.incident_charts import MEMORY_PARTS, OOM_KILL, chart_specs, memory_stack
from nodeguard.remediation.incident_page import page
from nodeguard.remediation.incidents import IncidentStore
from nodeguard.remediation.oom_incidents import OomIncidents
from nodeguard.remediation.timeline import Timeline
from nodeguard.sampling.sampler import Sampler, SamplerConfig
from nodeguard.server import make_app
from nodeguard.snapshot import (
    ContainerMemory,
    GpuDevice,
    GpuInfo,
    GpuMemory,
    GpuProcess,
    NodeSnapshot,
    OomKill,
    OomLog,
    PodMemory,
    PodMeta,
)
from nodeguard.sources.meminfo import derive_meminfo
from tests.support.hosts import cgroup_memory, host_paths

MiB, GiB = 1 << 20, 1 << 30
LIMIT = 64 * MiB
HOSTILE_NS = "</script><script>alert(1)</script>"
HOSTILE_POD = "<img src=x onerror=alert(2)>"
TRAINER, LOADER = ("pod-t", "c" * 64), ("pod-l", "d" * 64)
KEY = f"{TRAINER[0]}/{TRAINER[1]}"
_RECORD = re.compile(r'<script type="application/json" id="nodeguard-record">(.*?)</script>', re.S)


def _meminfo(used: int) -> Any:
    """16 GiB of which ``used`` is taken by workloads, 2 GiB of page cache, some slab."""
    fields = {
        "MemTotal": 16 * GiB,
        "MemFree": 16 * GiB - used - 2 * GiB - 300 * MiB,
        "MemAvailable": 16 * GiB - used - 300 * MiB,
        "Buffers": 0,
        "Cached": 2 * GiB + 40 * MiB,
        "Shmem": 40 * MiB,
        "Active(file)": GiB,
        "Inactive(file)": GiB,
        "SReclaimable": 200 * MiB,
        "SUnreclaim": 60 * MiB,
    }
    return derive_meminfo(fields)


def _pod(uid: str, cid: str, *, used: int, limit: int) -> PodMemory:
    memory = dataclasses.replace(
        cgroup_memory(f"/p{uid}/{cid}", used=used), limit_bytes=limit, effective_limit_bytes=limit
    )
    return PodMemory(
        uid=uid,
        qos_class="burstable",
        memory=cgroup_memory(f"/p{uid}", used=used),
        containers=(ContainerMemory(container_id=cid, runtime="", memory=memory),),
    )


def _meta(uid: str, cid: str, *, namespace: str, name: str, container: str) -> PodMeta:
    return PodMeta(
        uid=uid,
        name=name,
        namespace=namespace,
        node_name="n",
        phase="Running",
        priority=100,
        priority_class="low",
        qos_class="burstable",
        memory_request_bytes=32 * MiB,
        memory_limit_bytes=LIMIT,
        owners=(),
        labels={},
        annotations={},
        containers={cid: container},
        container_requests={container: 32 * MiB},
        mirror=False,
        daemonset=False,
        terminating=False,
    )


_GPU = GpuInfo(
    driver_version="550.54",
    devices=(
        GpuDevice(
            index=0,
            uuid="GPU-0",
            name="<b>H100</b>",
            mig_enabled=None,
            memory=GpuMemory(
                total_bytes=80 * GiB,
                used_bytes=60 * GiB,
                free_bytes=20 * GiB,
                reserved_bytes=GiB,
                info_version=2,
            ),
            mig_devices=(),
            processes=(
                GpuProcess(
                    pid=7,
                    used_bytes=59 * GiB,
                    mig_gpu_instance_id=None,
                    mig_compute_instance_id=None,
                    cgroup=None,
                    pod_uid=TRAINER[0],
                    container_id=TRAINER[1],
                ),
            ),
        ),
    ),
)


def _snap(t: float, *, grown: int, kill: OomKill | None = None) -> NodeSnapshot:
    return NodeSnapshot(
        timestamp=t,
        node_name="n",
        meminfo=_meminfo(GiB + grown + 48 * MiB),
        pressure=None,
        pods=(
            _pod(*TRAINER, used=grown, limit=LIMIT),
            _pod(*LOADER, used=48 * MiB, limit=128 * MiB),
        ),
        oom=OomLog(
            total=1 if kill else 0,
            by_constraint={},
            by_container={},
            recent=(kill,) if kill else (),
        ),
        processes=(),
        collectors=(),
        pod_meta={
            TRAINER[0]: _meta(*TRAINER, namespace=HOSTILE_NS, name=HOSTILE_POD, container="train"),
            LOADER[0]: _meta(*LOADER, namespace="ml", name="loader-0", container="load"),
        },
        gpu=_GPU,
    )


def _kill_record(store: IncidentStore) -> dict[str, Any]:
    """The trainer growing by 2 MiB every 0.25 s to its limit, a dry-run firing half-way,
    then killed: the record the real OomIncidents writes."""
    oom = OomIncidents(store=store, timeline=Timeline(spacing=0.25), node="n", boot_id="b")
    t = 1_800_000_000.0
    for i in range(33):
        oom.observe(_snap(t + i * 0.25, grown=2 * MiB * i))
        if i == 16:
            firing = {"id": "f-half-way", "kind": "firing", "rule": "half-way", "target": KEY}
            store.put(
                firing | {"time": t + i * 0.25, "dry_run": True, "actions": [{"action": "record"}]}
            )
    kill = OomKill(
        sequence=9,
        time=t + 8.1,
        pid=4242,
        process="python",
        constraint="CONSTRAINT_MEMCG",
        task_memcg=f"/kubepods/burstable/pod{TRAINER[0]}/{TRAINER[1]}",
        anon_rss_bytes=LIMIT,
        file_rss_bytes=0,
        shmem_rss_bytes=0,
        pod_uid=TRAINER[0],
        container_id=TRAINER[1],
    )
    (record,) = oom.observe(_snap(t + 8.3, grown=0, kill=kill))
    return record


@pytest.fixture
def record() -> dict[str, Any]:
    return _kill_record(IncidentStore(directory=None))


def _tags(text: str, name: str) -> list[str]:
    """The start tags ``<name ...>`` of ``text`` (its attributes), as a tokenizer finds them
    (no comment or CDATA in the page: a ``<`` in the embedded JSON is written ``\\u003c``)."""
    return re.findall(rf"<{name}\b([^>]*)>", text, re.I)


def test_the_record_round_trips_out_of_its_script_element(record: dict[str, Any]) -> None:
    text = page(record=record)
    (embedded,) = _RECORD.findall(text)
    assert json.loads(embedded) == json.loads(json.dumps(record))
    assert record["victim"]["namespace"] == HOSTILE_NS and record["timeline"]


def test_hostile_names_stay_text(record: dict[str, Any]) -> None:
    """A pod named ``</script>...`` or ``<img ...>``: no element of its own, escaped text."""
    text = page(record=record)
    assert _tags(text, "script") == [
        ' type="application/json" id="nodeguard-record"',
        ' type="application/json" id="nodeguard-charts"',
        "",
        "",
    ]
    assert _tags(text, "img") == []
    assert "alert(1)</script>" not in text and HOSTILE_POD not in text
    assert html.escape(HOSTILE_POD) in text and html.escape("<b>H100</b>") in text


def test_the_header_says_what_happened(record: dict[str, Any]) -> None:
    text = page(record=record)
    assert "<h1>OOM kill</h1>" in text and "CONSTRAINT_MEMCG (a cgroup at its limit)" in text
    for shown in ("python (pid 4242)", "64.0 MiB", "32.0 MiB", "100 (low)", "burstable"):
        assert f"<td>{shown}</td>" in text, shown
    assert "<td>2027-01-15 08:00:08.100 UTC</td>" in text  # the kill's time, from the record
    assert "fired 4.1 s before the kill; no action: dry run" in text
    assert "<h2>GPU memory then (driver 550.54)</h2>" in text and "59.0 GiB" in text


@pytest.mark.parametrize(
    "memory",
    [
        {},  # filled from the record's points below
        {  # the kernel's own numbers at odds with each other: still never over usable
            "usable_bytes": 10 * GiB,
            "available_bytes": GiB,
            "slab_unreclaimable_bytes": 12 * GiB,
            "shmem_bytes": 6 * GiB,
            "page_cache_bytes": 3 * GiB,
            "slab_reclaimable_bytes": GiB,
        },
        {"usable_bytes": GiB, "available_bytes": 2 * GiB, "page_cache_bytes": 3 * GiB},
    ],
    ids=["recorded", "parts-over-used", "available-over-usable"],
)
def test_the_stack_adds_up_to_usable(record: dict[str, Any], memory: dict[str, int]) -> None:
    memories = [memory] if memory else [p["memory"] for p in record["timeline"]]
    for m in memories:
        stack = memory_stack(m)
        assert stack is not None and list(stack) == [p.label for p in MEMORY_PARTS]
        assert sum(stack.values()) == m["usable_bytes"] and min(stack.values()) >= 0, stack
    assert memory_stack({"usable_bytes": GiB}) is None


def test_the_recorded_stack_is_the_meminfo_split(record: dict[str, Any]) -> None:
    """Used (usable - MemAvailable) is SUnreclaim + Shmem + workloads; available is page
    cache + SReclaimable + the rest; and the chart draws those values, point by point."""
    last = record["timeline"][-1]["memory"]
    stack = memory_stack(last)
    assert stack is not None
    assert stack["workloads (anon & other)"] == last["used_bytes"] - 60 * MiB - 40 * MiB
    assert (stack["page cache"], stack["slab reclaimable"]) == (2 * GiB, 200 * MiB)
    memory_chart = chart_specs(record)[0]
    assert memory_chart["unit"] == "GiB" and memory_chart["stacked"]
    sums: dict[float, float] = {}
    for d in memory_chart["datasets"]:
        for x, y in d["points"]:
            sums[x] = sums.get(x, 0) + y
    assert len(sums) == len(record["timeline"]) and all(x <= 0 for x in sums)
    assert all(abs(s - 16) < 1e-3 for s in sums.values()), sums


def test_the_container_chart_names_every_line(record: dict[str, Any]) -> None:
    memory, containers = chart_specs(record)
    # One x range, whole seconds, the kill at 0 inside it rather than on the edge.
    assert (memory["x_min"], memory["x_max"]) == (containers["x_min"], containers["x_max"])
    assert (containers["x_min"], containers["x_max"]) == (-9, 1)
    labels = [d["label"] for d in containers["datasets"]]
    names = {c["name"] for p in record["timeline"] for c in p["containers"]}
    assert names == {f"{HOSTILE_NS}/{HOSTILE_POD}/train", "ml/loader-0/load"}
    assert set(labels[:2]) == names
    assert labels[2:] == ["victim's limit 64.0 MiB", OOM_KILL, "half-way fired (4.1 s before)"]
    kill = containers["datasets"][3]
    assert kill["marker"] and [x for x, _ in kill["points"]] == [0, 0]
    (victim,) = [d for d in containers["datasets"] if d.get("victim")]
    assert victim["label"].endswith("/train") and victim["points"][-1][1] == 64.0


def test_a_record_without_a_timeline_says_so(record: dict[str, Any]) -> None:
    bare = record | {"timeline": [], "sampled_before": False, "evidence": {}}
    text = page(record=bare)
    assert "no timeline: not sampled before" in text and "<canvas" not in text
    assert '<script type="application/json" id="nodeguard-charts">[]</script>' in text
    assert "Not sampled: nodeguard read the kill from the kernel log later." in text


def test_a_firing_page_says_what_it_did_and_the_kill_after() -> None:
    store = IncidentStore(directory=None)
    kill = _kill_record(store)
    firing = store.get("f-half-way")
    assert firing is not None and firing["killed_later"]["id"] == kill["id"]
    text = page(record=firing)
    assert "<h1>half-way fired</h1>" in text and "<b>record</b>: ?" in text
    assert "Then the kernel OOM-killed it 4.1 s later" in text
    assert "no timeline: the record carries no memory history" in text


def test_chartjs_is_the_vendored_release() -> None:
    static = resources.files("nodeguard.remediation").joinpath("static")
    data = static.joinpath("chart.umd.min.js").read_bytes()
    readme = static.joinpath("README.md").read_text()
    assert hashlib.sha256(data).hexdigest() in readme and f"{len(data):,} bytes" in readme
    assert data.startswith(b"/*!\n * Chart.js v4.6.2\n")
    assert "Chart.js v4.6.2" in page(record={"id": "x", "time": 0})


@contextlib.asynccontextmanager
async def _agent_serving(record: dict[str, Any]) -> AsyncIterator[TestClient[Any, Any]]:
    """The agent's HTTP endpoints with ``record`` in its store."""
    store = IncidentStore(directory=None)
    store.put(record)
    sampler = Sampler(
        config=SamplerConfig(paths=host_paths("v2-systemd-containerd"), node_name="n")
    )
    app = make_app(sampler=sampler, registry=CollectorRegistry(), incidents=store)
    client: TestClient[Any, Any] = TestClient(TestServer(app))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()
        sampler.close()


async def test_the_agent_serves_the_page(record: dict[str, Any]) -> None:
    async with _agent_serving(record) as client:
        resp = await client.get(f"/incidents/{record['id']}.html")
        assert resp.status == 200 and resp.content_type == "text/html"
        assert resp.charset == "utf-8" and await resp.text() == page(record=record)
        resp = await client.get(f"/incidents/{record['id']}")
        assert resp.content_type == "application/json" and (await resp.json())["id"] == record["id"]
        resp = await client.get("/incidents/nothing-like-it.html")
        assert resp.status == 404 and resp.content_type == "text/html"
        assert "No incident nothing-like-it" in await resp.text()
        index = await (await client.get("/")).text()
        assert f'<a href="/incidents/{record["id"]}.html">' in index


def test_the_command_line_writes_the_same_page(
    record: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = IncidentStore(directory=tmp_path / "incidents")
    store.put(record)
    out = tmp_path / "page.html"
    argv = ["incidents", f"--incidents.dir={tmp_path / 'incidents'}", record["id"][:20]]
    assert main([*argv, "--html", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == page(record=record)
    assert f"wrote incident {record['id']} to {out}" in capsys.readouterr().out
    assert main([*argv, "--html", "-"]) == 0
    assert capsys.readouterr().out == page(record=record)  # the page alone
    assert main([*argv, "--html", str(out), "--json"]) == 2  # one way to write it, not two
    assert "--html and --json are two ways" in capsys.readouterr().err
    assert main(["incidents", f"--incidents.dir={tmp_path}", "--html", str(out)]) == 2
    said = capsys.readouterr().err
    assert said.startswith("nodeguard incidents: error: --html writes one incident's page: ")


def test_a_hand_edited_record_is_said_not_a_traceback(
    record: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = {**record, "victim": ["not", "an", "object"], "timeline": [None]}
    store = IncidentStore(directory=tmp_path / "incidents")
    store.put(broken)
    argv = ["incidents", f"--incidents.dir={tmp_path / 'incidents'}", record["id"]]
    for extra in ([], ["--html", str(tmp_path / "p.html")]):
        assert main([*argv, *extra]) == 1
        said = capsys.readouterr().out
        assert "cannot be shown: a field is not as nodeguard writes it" in said, said
    assert main([*argv, "--json"]) == 0  # as stored
    assert json.loads(capsys.readouterr().out)["victim"] == ["not", "an", "object"]


async def test_the_agent_says_a_hand_edited_record_cannot_be_drawn(
    record: dict[str, Any],
) -> None:
    async with _agent_serving({**record, "victim": ["x"], "timeline": [None]}) as client:
        resp = await client.get(f"/incidents/{record['id']}.html")
        assert resp.status == 500 and "cannot be drawn" in await resp.text()


def test_the_list_leaves_out_records_edited_by_hand(
    record: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "incidents"
    IncidentStore(directory=directory).put(record)
    (directory / "20200101T000000-a.json").write_text("[1, 2]")
    (directory / "20200101T000001-b.json").write_text(
        json.dumps({**record, "id": "20200101T000001-b", "actions": [None]})
    )
    (directory / "20200101T000002-c.json").write_text("[" * 100_000)
    assert main(["incidents", f"--incidents.dir={directory}"]) == 0
    listed = capsys.readouterr().out
    assert "1 incident(s)" in listed, listed
    assert main(["incidents", f"--incidents.dir={directory}", "20200101T000000-a"]) == 1

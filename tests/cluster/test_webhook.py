"""The Alertmanager webhook receiver: bad input, auth, limits, mixed batches, idempotency."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from nodeguard.alerts.claims import ANNOTATION, AlertClaims
from nodeguard.alerts.webhook import AlertDedupe, WebhookAlert, WebhookReceiver, delivery_key
from nodeguard.kube.client import KubeClient
from tests.support.alerts import (
    WEBHOOK_AUTH,
    RecordingQueue,
    alert,
    payload,
    receiver_of,
)


@pytest.fixture
async def setup() -> AsyncIterator[tuple[TestClient[Any, Any], WebhookReceiver, RecordingQueue]]:
    queue = RecordingQueue()
    receiver = receiver_of(queue)
    app = web.Application(client_max_size=4096)
    app.router.add_post("/webhook/alertmanager", receiver.handle)
    client = TestClient(TestServer(app))
    await client.start_server()
    yield client, receiver, queue
    await client.close()


async def post(
    client: TestClient[Any, Any],
    body: Any,
    *,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> tuple[int, dict[str, Any]]:
    resp = await client.post(
        "/webhook/alertmanager",
        headers=WEBHOOK_AUTH if headers is None else headers,
        data=raw if raw is not None else json.dumps(body),
    )
    return resp.status, await resp.json()


async def test_token_required(setup: Any) -> None:
    client, _, queue = setup
    assert (await post(client, payload(alert()), headers={}))[0] == 401
    assert (await post(client, payload(alert()), headers={"Authorization": "Bearer wrong"}))[
        0
    ] == 401
    assert (await post(client, payload(alert()), headers={"Authorization": "s3cret"}))[0] == 401
    assert queue.items == []


async def test_bad_input(setup: Any) -> None:
    client, receiver, queue = setup
    status, body = await post(client, None, raw=b'{"version": "4", "alerts": [')
    assert status == 400 and "malformed JSON" in body["error"]
    status, body = await post(client, {"version": "4"})
    assert status == 400 and "alerts" in body["error"]
    status, body = await post(client, payload(alert(), version="3"))
    assert status == 400 and "version" in body["error"]
    no_fp = alert()
    del no_fp["fingerprint"]
    status, body = await post(client, payload(no_fp))
    assert status == 400 and "fingerprint" in body["error"]
    status, _ = await post(client, None, raw=json.dumps(payload(alert())).encode() + b" " * 5000)
    assert status == 413
    assert queue.items == []
    assert receiver.requests == {400: 4, 413: 1}


async def test_unknown_fields_are_ignored_and_a_batch_mixes_statuses(setup: Any) -> None:
    client, receiver, queue = setup
    firing = alert(fingerprint="a", somethingNew="1")
    firing["futureField"] = {"x": 1}
    resolved = alert(status="resolved", fingerprint="b")
    container = alert(
        "NodeguardContainerNearLimit",
        fingerprint="c",
        severity="warning",
        namespace="ml",
        pod="pandas-prep",
    )
    other = alert("SomethingElse", fingerprint="d")
    status, body = await post(client, payload(firing, resolved, container, other, extra=True))
    assert status == 200
    assert [a["outcome"] for a in body["alerts"]] == ["queued", "queued", "queued", "unmatched"]
    kinds = [
        (f.rule, f.kind, [a.action for a in f.steps], f.node, f.scope, f.pod_ref)
        for f in queue.items
    ]
    assert kinds == [
        ("am-node-memory-low", "firing", ["cordon"], "gpu-1", "node", None),
        ("am-node-memory-low", "resolved", ["uncordon"], "gpu-1", "node", None),
        ("am-container-near-limit", "firing", ["evict"], "gpu-1", "pod", ("ml", "pandas-prep")),
    ]
    assert all(f.source == "alertmanager" and f.dry_run for f in queue.items)
    assert receiver.counts[("firing", "unmatched")] == 1


async def test_repeated_delivery_acts_once_and_stale_firing_is_ignored(setup: Any) -> None:
    client, _, queue = setup
    first = payload(alert(fingerprint="x"))
    assert [a["outcome"] for a in (await post(client, first))[1]["alerts"]] == ["queued"]
    assert [a["outcome"] for a in (await post(client, first))[1]["alerts"]] == ["duplicate"]
    resolved = payload(alert(status="resolved", fingerprint="x"))
    assert [a["outcome"] for a in (await post(client, resolved))[1]["alerts"]] == ["queued"]
    # The firing of the same instance again, written another way: the same delivery.
    same = payload(alert(fingerprint="x", starts="2026-11-30T06:00:00.123456Z"))
    assert [a["outcome"] for a in (await post(client, same))[1]["alerts"]] == ["duplicate"]
    # An older instance's firing arrives after the resolution (from the HA peer): ignored.
    late = payload(alert(fingerprint="x", starts="2026-11-30T05:59:00Z"))
    assert [a["outcome"] for a in (await post(client, late))[1]["alerts"]] == ["stale"]
    # A new instance of the alert (later startsAt) acts again.
    again = payload(alert(fingerprint="x", starts="2026-11-30T07:00:00Z"))
    assert [a["outcome"] for a in (await post(client, again))[1]["alerts"]] == ["queued"]
    assert [f.kind for f in queue.items] == ["firing", "resolved", "firing"]


async def test_alert_without_node_label(setup: Any) -> None:
    client, _, queue = setup
    a = alert(fingerprint="n")
    del a["labels"]["node"]
    assert [x["outcome"] for x in (await post(client, payload(a)))[1]["alerts"]] == ["no_node"]
    assert queue.items == []


async def test_full_queue_answers_503_and_the_retry_is_deduplicated(setup: Any) -> None:
    client, _, queue = setup
    queue.capacity = 1
    batch = payload(alert(fingerprint="p"), alert(fingerprint="q"))
    status, body = await post(client, batch)
    assert status == 503
    assert [a["outcome"] for a in body["alerts"]] == ["queued", "queue_full"]
    queue.capacity = 10
    status, body = await post(client, batch)  # Alertmanager's retry
    assert status == 200
    assert [a["outcome"] for a in body["alerts"]] == ["duplicate", "queued"]
    assert [f.target for f in queue.items] == ["gpu-1", "gpu-1"]


def test_dedupe_expires() -> None:
    now = [0.0]
    d = AlertDedupe(ttl=60, clock=lambda: now[0])
    a = WebhookAlert.model_validate(alert())
    assert d.take(a) is None
    assert d.take(a) == "duplicate"
    now[0] = 61
    assert d.take(a) is None


def test_a_still_firing_alert_stays_deduplicated() -> None:
    now = [0.0]
    d = AlertDedupe(ttl=24 * 3600, clock=lambda: now[0])
    a = WebhookAlert.model_validate(alert())
    assert d.take(a) is None
    for hours in (4, 20, 40, 60):  # re-sent every repeat_interval while it fires
        now[0] = hours * 3600
        assert d.take(a) == "duplicate"


def test_one_instant_written_three_ways_is_one_alert() -> None:
    # Alertmanager writes startsAt as Go's RFC 3339 with nanoseconds; relays and other senders
    # write the same instant as Z, .000Z or with an offset.
    d = AlertDedupe()
    forms = ["2026-11-30T10:00:00Z", "2026-11-30T10:00:00.000Z", "2026-11-30T11:00:00+01:00"]
    outcomes = [d.take(WebhookAlert.model_validate(alert(starts=f))) for f in forms]
    assert outcomes == [None, "duplicate", "duplicate"]
    assert len({delivery_key(WebhookAlert.model_validate(alert(starts=f))) for f in forms}) == 1


def test_dedupe_memory_is_bounded_in_bytes() -> None:
    # 900 KB fingerprints once cost 87 MB in 100 alerts. The payload model now refuses a
    # fingerprint over 64 characters, and what is kept of one is a fixed-size digest anyway.
    store: dict[str, Any] = {}
    d = AlertDedupe(limit=50, store=store)
    for i in range(200):
        d.take(WebhookAlert.model_validate(alert(fingerprint=f"{i:04d}" + "x" * 60)))
    assert len(store["seen"]) == 50
    assert len(json.dumps(store)) < 50 * 120


async def test_fifty_identical_deliveries_at_once_queue_one(setup: Any) -> None:
    client, _, queue = setup
    body = payload(alert(fingerprint="storm"))
    answers = await asyncio.gather(*(post(client, body) for _ in range(50)))
    outcomes = sorted(a[1]["alerts"][0]["outcome"] for a in answers)
    assert outcomes == ["duplicate"] * 49 + ["queued"]
    assert len(queue.items) == 1


async def test_starts_at_must_be_a_time(setup: Any) -> None:
    client, _, queue = setup
    for bad in ("yesterday", "2026-11-30T10:00:00"):  # no zone: which instant is it?
        status, body = await post(client, payload(alert(starts=bad)))
        assert status == 400 and "RFC 3339" in body["error"], body
    assert queue.items == []


async def test_claims_on_the_node_let_one_agent_act(cluster: Any, control_plane: Any) -> None:
    # Five agents claim the same delivery at once (an HA pair's two copies and retries, spread
    # by the Service): exactly one wins, whatever the interleaving, and conflicts are never
    # taken for a win. The winner, restarted, finds its own claim.
    node = cluster.node()
    kubes = [KubeClient.load(kubeconfig=control_plane.kubeconfig_path) for _ in range(5)]
    try:
        claims = [AlertClaims(kube=k, claimant=f"agent-{i}") for i, k in enumerate(kubes)]
        key = delivery_key(WebhookAlert.model_validate(alert(fingerprint="ha")))
        outcomes = await asyncio.gather(
            *(c.claim(node=node, key=key) for c in claims for _ in range(4))
        )
        # One claim wins; the winner's own other copies find it theirs; the rest duplicates.
        assert sorted(outcomes) == ["claimed"] + ["duplicate"] * 16 + ["ours"] * 3
        winner = claims[outcomes.index("claimed") // 4]
        restarted = AlertClaims(kube=kubes[0], claimant=winner._claimant)
        assert await restarted.claim(node=node, key=key) == "ours"
        # The resolution, then a late firing of an older instance: stale for everyone.
        resolved = delivery_key(
            WebhookAlert.model_validate(alert("X", "resolved", fingerprint="ha"))
        )
        assert await claims[1].claim(node=node, key=resolved) == "claimed"
        older = delivery_key(
            WebhookAlert.model_validate(alert(fingerprint="ha", starts="2026-11-30T05:00:00Z"))
        )
        assert await claims[2].claim(node=node, key=older) == "stale"
        annotations = cluster.core.read_node(node).metadata.annotations
        assert len(annotations[ANNOTATION]) < 2000  # digests, not fingerprints
    finally:
        for k in kubes:
            k.close()


async def test_claims_wait_for_an_api_server_that_is_down(cluster: Any, control_plane: Any) -> None:
    node = cluster.node()
    kube = KubeClient.load(kubeconfig=control_plane.kubeconfig_path)
    try:
        key = delivery_key(WebhookAlert.model_validate(alert(fingerprint="down")))
        await asyncio.to_thread(control_plane.stop_apiserver)
        try:
            assert await AlertClaims(kube=kube, claimant="a").claim(node=node, key=key) == (
                "unavailable"
            )
        finally:
            await asyncio.to_thread(control_plane.start_apiserver)
        assert await AlertClaims(kube=kube, claimant="b").claim(node=node, key=key) == "claimed"
    finally:
        kube.close()


async def test_starts_at_is_rfc_3339_only(setup: Any) -> None:
    # pydantic also reads a Unix time, or a time without a zone: neither is Alertmanager's.
    client, _, queue = setup
    for bad in ("1764496800", "2026-11-30", "2026-11-30T10:00:00Zjunk"):
        status, body = await post(client, payload(alert(starts=bad)))
        assert status == 400 and "RFC 3339" in body["error"], (bad, body)
    assert queue.items == []


async def test_a_claim_is_kept_while_its_alert_keeps_firing(
    cluster: Any, control_plane: Any
) -> None:
    # Alertmanager re-sends a firing alert every repeat_interval to any agent. Each copy that
    # finds the claim extends it, so it never expires while the alert fires; and 70 other
    # deliveries for the node do not push it out.
    node = cluster.node()
    kube = KubeClient.load(kubeconfig=control_plane.kubeconfig_path)
    now = {"t": 1_000_000.0}
    try:
        a = AlertClaims(kube=kube, claimant="agent-a", clock=lambda: now["t"])
        b = AlertClaims(kube=kube, claimant="agent-b", clock=lambda: now["t"])
        key = delivery_key(WebhookAlert.model_validate(alert(fingerprint="long")))
        assert await a.claim(node=node, key=key) == "claimed"
        for i in range(70):
            other = delivery_key(WebhookAlert.model_validate(alert(fingerprint=f"x{i}")))
            assert await a.claim(node=node, key=other) == "claimed"
        for _ in range(12):  # two days of re-sends every 4 h
            now["t"] += 4 * 3600
            assert await b.claim(node=node, key=key) == "duplicate"
        now["t"] += 25 * 3600  # no copy for 25 h: the alert stopped; forgotten
        assert await b.claim(node=node, key=key) == "claimed"
    finally:
        kube.close()


def test_the_open_webhook_only_listens_on_loopback(tmp_path: Any) -> None:
    import subprocess
    import sys

    from tests.support.agent import free_port
    from tests.support.hosts import host_flags

    port = free_port()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "nodeguard",
            "run",
            *host_flags("v2-systemd-containerd"),
            f"--path.state={tmp_path}",
            f"--listen-address=:{port}",
            "--webhook.allow-unauthenticated",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "only with --listen-address on loopback" in done.stderr


def test_a_delivery_whose_runbook_could_not_plan_acts_when_re_sent() -> None:
    # Its eviction found no pod list in time (the agent had just started): the copy Alertmanager
    # re-sends after repeat_interval must act, not be dropped as a duplicate.
    d = AlertDedupe()
    a = WebhookAlert.model_validate(alert())
    assert d.take(a) is None
    d.forget(delivery_key(a))
    assert d.take(a) is None
    assert d.take(a) == "duplicate"

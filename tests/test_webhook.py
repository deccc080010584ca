"""The Alertmanager webhook receiver: bad input, auth, limits, mixed batches, idempotency."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from nodeguard.alerts.webhook import AlertDedupe, WebhookReceiver
from nodeguard.rules.engine import Firing
from nodeguard.rules.schema import AlertRule

RULES = (
    AlertRule.model_validate(
        {
            "name": "am-node-memory-low",
            "alertname": "NodeguardNodeMemoryLow",
            "actions": [{"action": "cordon"}],
            "resolve": [{"action": "uncordon"}],
        }
    ),
    AlertRule.model_validate(
        {
            "name": "am-container-near-limit",
            "alertname": "NodeguardContainerNearLimit",
            "matchers": {"severity": "warning", "pod": "*"},
            "actions": [{"action": "evict", "args": {"maxPriority": 999}}],
        }
    ),
)


def alert(
    name: str = "NodeguardNodeMemoryLow",
    status: str = "firing",
    *,
    fingerprint: str = "fp1",
    starts: str = "2026-11-30T06:00:00.123456789Z",
    **labels: str,
) -> dict[str, Any]:
    return {
        "status": status,
        "labels": {"alertname": name, "node": "gpu-1", **labels},
        "annotations": {"summary": "MemAvailable 3%"},
        "startsAt": starts,
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prom/graph",
        "fingerprint": fingerprint,
    }


def payload(*alerts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "version": "4",
        "groupKey": "{}:{}",
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "nodeguard",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://am",
        "alerts": list(alerts),
        **extra,
    }


class Queue:
    def __init__(self, capacity: int = 100) -> None:
        self.items: list[Firing] = []
        self.capacity = capacity

    def submit(self, firing: Firing) -> bool:
        if len(self.items) >= self.capacity:
            return False
        self.items.append(firing)
        return True


def receiver_of(queue: Queue, **options: Any) -> WebhookReceiver:
    """A receiver for node gpu-1 with the test rules, queueing into ``queue``."""
    return WebhookReceiver(
        node_name="gpu-1",
        rules=lambda: RULES,
        submit=queue.submit,
        latest=lambda: None,
        global_dry_run=True,
        token="s3cret",
        **options,
    )


@pytest.fixture
async def setup() -> AsyncIterator[tuple[TestClient[Any, Any], WebhookReceiver, Queue]]:
    queue = Queue()
    receiver = receiver_of(queue)
    app = web.Application(client_max_size=4096)
    app.router.add_post("/webhook/alertmanager", receiver.handle)
    client = TestClient(TestServer(app))
    await client.start_server()
    yield client, receiver, queue
    await client.close()


AUTH = {"Authorization": "Bearer s3cret"}


async def post(
    client: TestClient[Any, Any],
    body: Any,
    *,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> tuple[int, dict[str, Any]]:
    resp = await client.post(
        "/webhook/alertmanager",
        headers=AUTH if headers is None else headers,
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
        (f.rule, f.kind, [a.action for a in f.actions], f.node, f.scope, f.pod_ref)
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
    # The firing of the same instance arrives late (from the HA peer): ignored.
    late = payload(alert(fingerprint="x", starts="2026-11-30T06:00:00.123456789Z"))
    late["alerts"][0]["startsAt"] = "2026-11-30T06:00:00.123456Z"  # same instant, other format
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
    from nodeguard.alerts.webhook import WebhookAlert

    a = WebhookAlert.model_validate(alert())
    d.handled(a)
    assert d.check(a) == "duplicate"
    now[0] = 61
    assert d.check(a) is None


def test_a_still_firing_alert_stays_deduplicated() -> None:
    from nodeguard.alerts.webhook import WebhookAlert

    now = [0.0]
    d = AlertDedupe(ttl=24 * 3600, clock=lambda: now[0])
    a = WebhookAlert.model_validate(alert())
    d.handled(a)
    for hours in (4, 20, 40, 60):  # re-sent every repeat_interval while it fires
        now[0] = hours * 3600
        assert d.check(a) == "duplicate"


async def test_starts_at_must_be_a_time(setup: Any) -> None:
    client, _, queue = setup
    status, body = await post(client, payload(alert(starts="yesterday")))
    assert status == 400 and "RFC 3339" in body["error"]
    assert queue.items == []


async def test_two_agents_act_once_through_claims_on_the_node(
    cluster: Any, control_plane: Any
) -> None:
    from nodeguard.alerts.claims import ANNOTATION, AlertClaims
    from nodeguard.kube.client import KubeClient

    node = cluster.node()
    queues, clients, kubes = [], [], []
    for _ in range(2):  # two agents behind one Service, each with its own memory
        kube = KubeClient.load(kubeconfig=control_plane.kubeconfig_path)
        queue = Queue()
        receiver = WebhookReceiver(
            node_name="agent",
            rules=lambda: RULES,
            submit=queue.submit,
            latest=lambda: None,
            global_dry_run=True,
            token="s3cret",
            claims=AlertClaims(kube=kube),
        )
        app = web.Application()
        app.router.add_post("/webhook/alertmanager", receiver.handle)
        client = TestClient(TestServer(app))
        await client.start_server()
        queues.append(queue)
        clients.append(client)
        kubes.append(kube)
    a, b = clients
    try:
        firing = payload(alert(fingerprint="ha", node=node))
        assert (await post(a, firing))[1]["alerts"][0]["outcome"] == "queued"
        assert (await post(b, firing))[1]["alerts"][0]["outcome"] == "duplicate"
        resolved = payload(alert(status="resolved", fingerprint="ha", node=node))
        assert (await post(b, resolved))[1]["alerts"][0]["outcome"] == "queued"
        assert (await post(a, firing))[1]["alerts"][0]["outcome"] == "duplicate"  # memory
        late = payload(alert(fingerprint="ha", node=node, starts="2026-11-30T06:00:00.123456Z"))
        late["alerts"][0]["startsAt"] = "2026-11-30T05:59:00Z"  # an older instance
        assert (await post(a, late))[1]["alerts"][0]["outcome"] == "stale"
        assert [f.kind for f in queues[0].items] == ["firing"]
        assert [f.kind for f in queues[1].items] == ["resolved"]
        annotations = cluster.core.read_node(node).metadata.annotations
        assert '"ha"' in annotations[ANNOTATION]
    finally:
        for client in clients:
            await client.close()
        for kube in kubes:
            kube.close()

"""``/metrics``: the latest snapshot as metric families, written once per snapshot.

- :mod:`~nodeguard.exposition.exporter`: the snapshot's families (every collector's, which
  each collector renders itself, and the snapshot's own);
- :mod:`~nodeguard.exposition.handler`: ``GET /metrics``, negotiated as prometheus_client
  negotiates it, rendered off the event loop, once per snapshot;
- :mod:`~nodeguard.exposition.render`: the fast writer, held byte for byte to
  prometheus_client's;
- :mod:`~nodeguard.exposition.metric_filter`: which families are kept
  (``--metric-allowlist`` / ``--metric-denylist``).

The families themselves are the collectors' (:mod:`nodeguard.collectors.families`): a
collector renders its part of the snapshot into them.
"""

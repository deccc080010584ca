"""Self metrics of the rule engine, the rule files and the remediator.

A custom collector (like the exporter's) reading the objects' counters at scrape time:
``nodeguard_rules_loaded``, ``nodeguard_rules_reloads_total``,
``nodeguard_rules_reload_errors_total``, ``nodeguard_rule_targets{rule,state}``,
``nodeguard_rule_firings_total{rule,kind}``, ``nodeguard_rule_suppressed_total{rule,reason}``,
``nodeguard_remediation_queue_length``, ``nodeguard_remediation_in_flight``,
``nodeguard_incidents_total``; of the state file (:class:`StateCollector`, with a state
directory): ``nodeguard_state_persisted``, ``nodeguard_state_save_failures_total``. Action
outcomes are ``nodeguard_actions_total`` (the auditor's).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nodeguard.remediation.worker import Remediator
from nodeguard.rules.engine import RuleEngine
from nodeguard.rules.load import RuleSource
from nodeguard.statefile import StateFile

__all__ = ["RemediationCollector", "StateCollector"]


class StateCollector(Collector):
    """Renders whether the remediation state file can be written; nothing without a state
    directory (the state is in memory: there is no write to fail)."""

    def __init__(self, *, state: StateFile) -> None:
        self._state = state

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        if self._state.path is None:
            return
        ok = GaugeMetricFamily(
            "nodeguard_state_persisted",
            "1 when the latest write of the remediation state succeeded; 0 while it cannot be "
            "written (a full or failing disk): no new action starts meanwhile",
        )
        ok.add_metric([], 1.0 if self._state.persisted else 0.0)
        failures = CounterMetricFamily(
            "nodeguard_state_save_failures",
            "writes of the remediation state that failed (ENOSPC, EIO, a short write); the "
            "previous file was kept",
        )
        failures.add_metric([], self._state.save_failures)
        yield from (ok, failures)


class RemediationCollector(Collector):
    """Renders the engine's, the rule source's and the remediator's state."""

    def __init__(self, *, engine: RuleEngine, source: RuleSource, remediator: Remediator) -> None:
        self._engine, self._source, self._rem = engine, source, remediator

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        loaded = GaugeMetricFamily("nodeguard_rules_loaded", "rules in force")
        loaded.add_metric([], len(self._engine.rules))
        reloads = CounterMetricFamily("nodeguard_rules_reloads", "successful rule reloads")
        reloads.add_metric([], self._source.reloads_total)
        errors = CounterMetricFamily(
            "nodeguard_rules_reload_errors",
            "rule reloads refused because a file was bad (the last good rules stayed)",
        )
        errors.add_metric([], self._source.errors_total)
        yield from (loaded, reloads, errors)

        targets = GaugeMetricFamily(
            "nodeguard_rule_targets", "targets of each rule by state", labels=["rule", "state"]
        )
        for rule, (pending, firing) in sorted(self._engine.state().items()):
            targets.add_metric([rule, "pending"], pending)
            targets.add_metric([rule, "firing"], firing)
        yield targets

        firings = CounterMetricFamily(
            "nodeguard_rule_firings",
            "rule firings by kind (firing, resolved)",
            labels=["rule", "kind"],
        )
        suppressed = CounterMetricFamily(
            "nodeguard_rule_suppressed",
            "firings not acted on, by reason (cooldown, cap, queue_full, state_not_persisted)",
            labels=["rule", "reason"],
        )
        for (rule, what), n in sorted(self._engine.counts.items()):
            if what == "firings":
                firings.add_metric([rule, "firing"], n)
            elif what == "resolved":
                firings.add_metric([rule, "resolved"], n)
            else:
                suppressed.add_metric([rule, what.removeprefix("suppressed_")], n)
        yield from (firings, suppressed)

        queue = GaugeMetricFamily("nodeguard_remediation_queue_length", "firings waiting")
        queue.add_metric([], self._rem.queued())
        busy = GaugeMetricFamily("nodeguard_remediation_in_flight", "firings being acted on")
        busy.add_metric([], self._rem.in_flight)
        journal = GaugeMetricFamily(
            "nodeguard_remediation_journal_entries",
            "runbooks under way in the state file (queued, running or waiting for a retry)",
        )
        journal.add_metric([], len(self._rem.journal))
        restarts = CounterMetricFamily(
            "nodeguard_remediation_restored",
            "runbooks found under way at start, by what was done with them",
            labels=["decision"],
        )
        restarts.add_metric(["resumed"], self._rem.resumed_total)
        restarts.add_metric(["abandoned"], self._rem.abandoned_total)
        incidents = CounterMetricFamily(
            "nodeguard_incidents", "incident records written by this agent"
        )
        incidents.add_metric([], self._rem.incidents.written)
        yield from (queue, busy, journal, restarts, incidents)

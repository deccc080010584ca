"""``nodeguard run`` from start to stop: the settings checked, every part built, then served."""

from __future__ import annotations

import ipaddress
import logging

from nodeguard.agent.build import build
from nodeguard.agent.config import AgentConfig
from nodeguard.agent.serve import serve

__all__ = ["run_agent"]

log = logging.getLogger("nodeguard")


def _loopback(host: str | None) -> bool:
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


async def run_agent(cfg: AgentConfig) -> int:
    """Run until SIGTERM/SIGINT; the exit status (1: another agent holds the state directory;
    2: a setting refused, or the port cannot be listened on)."""
    if cfg.webhook_unauthenticated and cfg.webhook_token is None and not _loopback(cfg.host):
        log.error(
            "--webhook.allow-unauthenticated takes deliveries from anyone who reaches the port: "
            "only with --listen-address on loopback (127.0.0.1:PORT), not %s",
            cfg.host or "every address",
        )
        return 2
    agent = build(cfg)
    if agent is None:  # another agent holds the state directory (logged)
        return 1
    return await serve(agent)

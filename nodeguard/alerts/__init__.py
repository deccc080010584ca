"""Alertmanager integration: the webhook receiver that turns alerts into firings."""

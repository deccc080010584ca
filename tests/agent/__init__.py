"""Tests of the agent tier (see CONTRIBUTING.md, "Test tiers")."""

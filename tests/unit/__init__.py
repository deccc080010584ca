"""Tests of the unit tier (see CONTRIBUTING.md, "Test tiers")."""

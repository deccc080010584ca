"""Tests of the cluster tier (see CONTRIBUTING.md, "Test tiers")."""

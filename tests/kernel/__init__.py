"""Tests of the kernel tier (see CONTRIBUTING.md, "Test tiers")."""

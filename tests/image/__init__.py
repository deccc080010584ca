"""Tests of the image tier (see CONTRIBUTING.md, "Test tiers")."""

"""Integrations with host frameworks, each behind its own extra."""

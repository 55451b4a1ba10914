"""Orchestration: one level-based reconcile per kind, built from pure functions and adapters."""

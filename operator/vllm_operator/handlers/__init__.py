"""Kopf registration only: each handler calls one reconcile function."""

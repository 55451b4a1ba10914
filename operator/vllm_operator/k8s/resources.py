"""Where each kind the operator touches lives in the Kubernetes API (a static table: no
discovery requests, so converging costs only the requests that do work).

The kinds a controller reconciles, watches or holds a permission on come from the
controller table (k8s/controllers.py); the rows here are the others (Namespace: the
scale benchmark's harness creates and deletes its namespaces through this client)."""

from __future__ import annotations

from typing import Final

from vllm_operator.k8s.controllers import NAMESPACE, Resource, controlled_resources

__all__ = ["Resource", "resource_for"]

_OTHERS: Final = [NAMESPACE]
_TABLE: Final = [*controlled_resources(), *_OTHERS]
_BY_KIND: Final = {(r.api_version, r.kind): r for r in _TABLE}


def resource_for(api_version: str, kind: str) -> Resource:
    try:
        return _BY_KIND[(api_version, kind)]
    except KeyError:
        raise KeyError(f"no API path known for {api_version} {kind}") from None

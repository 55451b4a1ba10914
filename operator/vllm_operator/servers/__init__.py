"""Clients of the vLLM servers the operator runs (their HTTP API, not Kubernetes')."""

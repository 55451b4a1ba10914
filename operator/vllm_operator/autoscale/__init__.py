"""The autoscaler's pure parts: vLLM's /metrics text → readings → a replica decision.

No I/O here: the reconcile layer scrapes the pods, keeps the state between readings, and
writes the decision through the InferenceService's scale subresource.
"""

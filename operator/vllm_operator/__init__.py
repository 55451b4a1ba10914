"""vllm-operator: a Kubernetes operator that runs tuned vLLM inference services.

The package is layered (enforced by import-linter in the test suite):
``models`` (API types) <- ``render`` / ``tuning`` (pure functions) <- ``k8s`` (I/O
adapters) <- ``reconcile`` (orchestration) <- ``handlers`` (Kopf registration only).
"""

__version__ = "0.1.0"

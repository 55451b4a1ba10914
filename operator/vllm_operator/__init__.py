"""vllm-operator: a Kubernetes operator that runs tuned vLLM inference services.

The package's layers, from the CLI down to the constants, are one import-linter contract
in pyproject.toml, checked by ``make lint``. ``__version__`` is the one place of the
version: the wheel's, the chart's (tests/test_versions.py) and ``vllm-operator --version``.
"""

__version__ = "0.1.0"

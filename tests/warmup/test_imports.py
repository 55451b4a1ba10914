"""The warmup runs in a plain Job: it must not pull in Kopf or a Kubernetes client."""

from __future__ import annotations

import subprocess
import sys


def test_warmup_imports_no_kopf_and_no_kubernetes_client() -> None:
    code = (
        "import sys\n"
        "import vllm_operator.warmup.cli, vllm_operator.warmup.run\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('kopf', 'kubernetes', 'kubernetes_asyncio'))\n"
        "print(','.join(bad))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""

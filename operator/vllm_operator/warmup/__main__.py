"""``python -m vllm_operator.warmup``: the same as ``vllm-operator warmup``."""

import sys

from vllm_operator.warmup.cli import main

sys.exit(main())

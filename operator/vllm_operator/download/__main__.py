"""``python -m vllm_operator.download``: the same as ``vllm-operator download``."""

import sys

from vllm_operator.download.cli import main

sys.exit(main())

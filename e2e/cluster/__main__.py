"""`python -m e2e.cluster up|down|status|env`: the control plane's command line."""

import sys

from e2e.cluster.cluster import main

sys.exit(main())

"""`python -m devenv.cluster up|down|status|env`: the control plane's command line."""

import sys

from devenv.cluster.cluster import main

sys.exit(main())

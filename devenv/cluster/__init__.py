"""The local Kubernetes control plane of the test tiers; see `cluster.py` and README.md."""

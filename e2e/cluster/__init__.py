"""The local Kubernetes control plane of the cluster tier; see `cluster.py` and README.md."""

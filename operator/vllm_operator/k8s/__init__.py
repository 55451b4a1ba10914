"""I/O adapters: the only layer that talks to the Kubernetes API (server-side apply, reads)."""

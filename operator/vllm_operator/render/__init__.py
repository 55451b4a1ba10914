"""Pure builders: validated models in, plain Kubernetes manifests (dicts) out."""

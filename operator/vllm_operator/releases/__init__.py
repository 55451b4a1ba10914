"""What the operator knows of each vLLM release: its version, read from the serving image
or the spec, and the arguments its ``vllm serve`` accepts (tables derived from each
release's own source, docs/vllm-flags.md). Pure: no Kubernetes, no vLLM import."""

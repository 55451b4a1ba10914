"""What the operator knows of each vLLM release: its version, read from the serving image
or the spec, the arguments its ``vllm serve`` accepts (tables derived from each
release's own source, docs/vllm-flags.md), and what its ``/metrics`` says (the series'
names and how a pod's reading is read, :mod:`~vllm_operator.releases.metrics`). Pure: no
Kubernetes, no vLLM import."""

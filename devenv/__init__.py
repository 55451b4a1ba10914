"""The development environment on this machine: what the test tiers and `make dev` run on.

Not product code and not tests. `cluster/` is the local control plane (etcd, apiserver,
controller-manager, scheduler, kwok's fake nodes, one real node; `python -m
devenv.cluster`) and `images/` the build contexts of the images the real node runs;
`dev.py` is `make dev`; `vllm_server.py` runs a real CPU vLLM as a local process and
`vllm_fixtures.py` offers it to pytest; `operator_process.py` runs the operator as a local
process (the cluster tier's and the benchmark's); `scale.py` is the scale benchmark
(`make bench-scale`, docs/scale.md); `fakes/` holds the fakes of the boundaries we own (the
OpenAI server, the NVML answer sets). The unit tier (tests/), the cluster tier (e2e/) and
scripts/ import from here; nothing here imports tests/ or e2e/ (import-linter holds it).
"""

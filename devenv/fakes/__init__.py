"""Fakes of the boundaries we own, for the tests, the benchmarks and the generated files.

One home that the unit tier (tests/), the cluster tier (e2e/), the rest of devenv/ (the
overload benchmark, the fault-server image) and scripts/ (the client comparison, the
generated agent answer files) all import from. It sits inside devenv/ (what the tiers run
on) rather than beside it, so that it is linted, sorted and kept out of the packaging as
devenv/ is; and it imports nothing from tests/ or e2e/ (an import-linter contract in
pyproject.toml), so that tooling never reaches into a test tier:

- ``openai_server``: the one fake OpenAI-compatible server, with injected delays and
  failures, in its own process (the load generator's tests and benchmarks) or in a thread
  of this one (warmup's tests and the fault-server image).
- ``answer_sets``: hand-built NVML answers for the node agent, written as YAML answer
  files under tests/agent/fixtures/ by ``make generate``.
"""

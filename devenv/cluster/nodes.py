"""Fake nodes: shapes read from `nodes.yaml`, rendered as Node objects that kwok manages.

kwok picks the nodes it plays the kubelet for by an annotation (`kwok.x-k8s.io/node: fake`,
matched by the `--manage-nodes-with-annotation-selector` flag the cluster starts it with).
kwok's own examples also taint such nodes so that real workloads avoid them; here every
node is fake, so a taint would only force a toleration onto every test workload, and the
shapes carry none unless they ask for one (`taints:`).

Status is set on create (the Node API allows it): kwok's node stage keeps the capacity and
allocatable it finds and fills in conditions, addresses and node info.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# The label keys are spelled as in operator/vllm_operator/constants.py; they are copied,
# not imported, so the control plane starts without the operator package installed.
# e2e/test_cluster.py checks that both spellings agree.
LABEL_GPU_PRODUCT = "nvidia.com/gpu.product"
LABEL_GPU_MEMORY_MIB = "nvidia.com/gpu.memory"
LABEL_GPU_COUNT = "nvidia.com/gpu.count"
LABEL_GPU_INTERCONNECT = "inference.vllm-operator.dev/gpu-interconnect"
GPU_RESOURCE = "nvidia.com/gpu"

# Ours: which nodes the e2e cluster registered, and GPU facts no label key exists for.
LABEL_E2E_NODE = "e2e.vllm-operator.dev/fake-node"
ANNOTATION_GPU_TOPOLOGY = "e2e.vllm-operator.dev/gpu-topology"
ANNOTATION_GPU_PRODUCT_NAME = "e2e.vllm-operator.dev/gpu-product-name"

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"
KWOK_NODE_SELECTOR = f"{KWOK_ANNOTATION}={KWOK_ANNOTATION_VALUE}"

DEFAULT_NODES_FILE = Path(__file__).with_name("nodes.yaml")


@dataclass(frozen=True)
class GPUShape:
    """The GPUs of one node: all of one product, as GPU Feature Discovery assumes."""

    product: str
    count: int
    memory_mib: int
    interconnect: str
    topology: str | None = None

    @property
    def product_label(self) -> str:
        # GPU Feature Discovery writes the product with dashes: label values have no spaces.
        return self.product.replace(" ", "-")


@dataclass(frozen=True)
class NodeShape:
    """One fake node: name, allocatable resources, optional GPUs, extra labels and taints."""

    name: str
    cpu: str
    memory: str
    pods: int
    ephemeral_storage: str = "1Ti"
    gpu: GPUShape | None = None
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[dict[str, str], ...] = ()


def load_shapes(path: Path = DEFAULT_NODES_FILE) -> list[NodeShape]:
    """Reads node shapes, failing with the file and entry named on anything malformed."""
    doc = yaml.safe_load(path.read_text())
    entries = doc.get("nodes") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: expected a non-empty list under `nodes`")
    shapes: list[NodeShape] = []
    for i, e in enumerate(entries):
        where = f"{path}: nodes[{i}]"
        try:
            gpu = None
            if g := e.get("gpu"):
                gpu = GPUShape(
                    product=str(g["product"]),
                    count=int(g["count"]),
                    memory_mib=int(g["memoryMiB"]),
                    interconnect=str(g["interconnect"]),
                    topology=str(g["topology"]) if g.get("topology") else None,
                )
            shapes.append(
                NodeShape(
                    name=str(e["name"]),
                    cpu=str(e["cpu"]),
                    memory=str(e["memory"]),
                    pods=int(e.get("pods", 110)),
                    ephemeral_storage=str(e.get("ephemeralStorage", "1Ti")),
                    gpu=gpu,
                    labels={str(k): str(v) for k, v in (e.get("labels") or {}).items()},
                    taints=tuple(e.get("taints") or ()),
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"{where}: {exc!r}") from exc
    names = [s.name for s in shapes]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: node names repeat: {names}")
    return shapes


def render_node(shape: NodeShape) -> dict[str, Any]:
    """The Node object for one shape, status included."""
    labels = {
        "kubernetes.io/hostname": shape.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        LABEL_E2E_NODE: "true",
    }
    annotations = {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE}
    resources: dict[str, str] = {
        "cpu": shape.cpu,
        "memory": shape.memory,
        "pods": str(shape.pods),
        "ephemeral-storage": shape.ephemeral_storage,
    }
    if shape.gpu is not None:
        g = shape.gpu
        labels |= {
            LABEL_GPU_PRODUCT: g.product_label,
            LABEL_GPU_MEMORY_MIB: str(g.memory_mib),
            LABEL_GPU_COUNT: str(g.count),
            LABEL_GPU_INTERCONNECT: g.interconnect,
            "nvidia.com/gpu.present": "true",
        }
        annotations[ANNOTATION_GPU_PRODUCT_NAME] = g.product
        if g.topology:
            annotations[ANNOTATION_GPU_TOPOLOGY] = g.topology
        resources[GPU_RESOURCE] = str(g.count)
    labels |= shape.labels
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": shape.name, "labels": labels, "annotations": annotations},
        "spec": {"taints": list(shape.taints)} if shape.taints else {},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }
    return node


def render_nodes(path: Path = DEFAULT_NODES_FILE) -> list[dict[str, Any]]:
    """Every Node object of a shapes file."""
    return [render_node(s) for s in load_shapes(path)]

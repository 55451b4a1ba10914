"""GPUNode: what a node's GPUs really are, as the node agent reads them through NVML.

One cluster-scoped GPUNode per Kubernetes node, with the node's name. Its spec carries the
power policy and bandwidth-probe requests; its status the inventory, interconnect,
measured bandwidths and the classic faults (power caps, degraded links) as conditions.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal, Self

from pydantic import Field, model_validator

from vllm_operator.models.base import CONDITIONS_LIST, ApiModel, Condition, cel_rules
from vllm_operator.models.inference_service import ObjectMeta

PowerPolicy = Literal["Unmanaged", "Default", "Max", "Watts"]


class PowerSpec(ApiModel):
    """Power-limit policy for every GPU of the node."""

    policy: PowerPolicy = Field(
        default="Unmanaged",
        description="Unmanaged (leave as found), Default (the board's default limit), Max "
        "(the highest allowed), or Watts (an explicit limit, clamped to the allowed range).",
    )
    watts: int | None = Field(default=None, ge=1, le=5000, description="Limit, for Watts.")

    model_config = cel_rules(
        {
            "rule": "(self.policy == 'Watts') == has(self.watts)",
            "message": "watts is required with policy Watts and only then",
            "fieldPath": ".watts",
        }
    )

    @model_validator(mode="after")
    def _watts(self) -> Self:
        if (self.policy == "Watts") != (self.watts is not None):
            raise ValueError("watts is required with policy Watts and only then")
        return self


class ProbeSpec(ApiModel):
    """Bandwidth probe requests: a new requestId asks the agent to probe once."""

    request_id: str | None = Field(
        default=None,
        max_length=63,
        description="Change to any new value to run the bandwidth probe again.",
    )


class GPUNodeSpec(ApiModel):
    """Desired state of a node's GPUs."""

    power: PowerSpec = Field(default_factory=PowerSpec, description="Power-limit policy.")
    probe: ProbeSpec = Field(default_factory=ProbeSpec, description="Bandwidth probe request.")


class PowerLimits(ApiModel):
    """Power limits of one GPU, in watts."""

    current: float | None = Field(default=None, description="Enforced limit.")
    default: float | None = Field(default=None, description="Board default limit.")
    min: float | None = Field(default=None, description="Lowest settable limit.")
    max: float | None = Field(default=None, description="Highest settable limit.")
    draw: float | None = Field(default=None, description="Power drawn now.")


class Clocks(ApiModel):
    """Clocks of one GPU, in MHz."""

    sm: int | None = Field(default=None, description="SM clock now.")
    sm_max: int | None = Field(default=None, description="Highest SM clock.")
    memory: int | None = Field(default=None, description="Memory clock now.")
    memory_max: int | None = Field(default=None, description="Highest memory clock.")
    throttle_reasons: list[str] = Field(
        default_factory=list,
        description="Why the GPU's clocks are held below their maximum now (NVML's clock "
        "event reasons; idle is left out): SwPowerCap (the power limit), HwSlowdown (a "
        "hardware slowdown: temperature or power brake), SwThermalSlowdown and "
        "HwThermalSlowdown (too hot), HwPowerBrakeSlowdown (the external power brake), "
        "SyncBoost (held to match GPUs in a sync-boost group), ApplicationsClocksSetting "
        "(application clocks set below the maximum), DisplayClockSetting (the display "
        "clock setting).",
    )


class PCIeLink(ApiModel):
    """PCIe link of one GPU."""

    generation: int | None = Field(default=None, description="Current generation.")
    max_generation: int | None = Field(default=None, description="Highest the pair allows.")
    width: int | None = Field(default=None, description="Current lanes.")
    max_width: int | None = Field(default=None, description="Most lanes the slot allows.")


class GPUInfo(ApiModel):
    """One GPU."""

    index: int = Field(description="NVML index.")
    uuid: str = Field(description="GPU UUID.")
    product: str = Field(description="Product name.")
    memory_bytes: int | None = Field(default=None, description="Total memory.")
    compute_capability: str | None = Field(default=None, description="Such as 9.0.")
    pci_bus_id: str | None = Field(default=None, description="PCI bus id.")
    power: PowerLimits | None = Field(default=None, description="Power limits.")
    clocks: Clocks | None = Field(default=None, description="Clocks.")
    temperature_celsius: int | None = Field(default=None, description="Core temperature.")
    pcie: PCIeLink | None = Field(default=None, description="PCIe link.")
    numa_node: int | None = Field(default=None, description="NUMA node.")
    cpu_affinity: str | None = Field(default=None, description="CPUs close to it, as 0-31.")
    nvlinks_active: int | None = Field(default=None, description="Active NVLinks.")


LinkKind = Literal["NVLink", "PIX", "PXB", "PHB", "NODE", "SYS"]


class GPULink(ApiModel):
    """How two GPUs reach each other (the nvidia-smi topo -m matrix, one cell)."""

    a: int = Field(description="Index of one GPU.")
    b: int = Field(description="Index of the other GPU.")
    kind: LinkKind = Field(
        description="NVLink, or the PCIe path: PIX (one switch), PXB (several switches), PHB "
        "(host bridge), NODE (across host bridges in a NUMA node), SYS (across sockets)."
    )
    nvlinks: int | None = Field(default=None, description="NVLinks between them, for NVLink.")


class Bandwidth(ApiModel):
    """A measured bandwidth against what the hardware should deliver."""

    source: str = Field(description="What was measured, such as gpu0, gpu0->gpu1, host->gpu0.")
    kind: Literal["DeviceCopy", "HostToDevice", "DeviceToHost", "PeerToPeer"] = Field(
        description="Kind of copy."
    )
    gigabytes_per_second: float = Field(description="Measured, GB/s (10^9 bytes).")
    expected_gigabytes_per_second: float | None = Field(
        default=None, description="What the product and link should deliver."
    )


class BandwidthProbe(ApiModel):
    """Results of the last bandwidth probe."""

    request_id: str | None = Field(default=None, description="The request it answered.")
    measured_at: datetime | None = Field(default=None, description="When it ran.")
    results: list[Bandwidth] = Field(default_factory=list, description="Measured bandwidths.")
    error: str | None = Field(default=None, description="Why it failed, if it did.")


class AppliedPower(ApiModel):
    """Power limit the agent manages on one GPU."""

    uuid: str = Field(description="GPU UUID.")
    original_watts: float = Field(description="Limit found before the agent changed it.")
    applied_watts: float | None = Field(default=None, description="Limit the agent set.")
    dry_run: bool = Field(default=False, description="True when only reported, not applied.")


class GPUNodeStatus(ApiModel):
    """What the node agent observed."""

    observed_generation: int | None = Field(default=None, description="Generation observed.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, PowerCapped, LinkDegraded, ClocksThrottled, PowerPolicyApplied.",
        json_schema_extra=CONDITIONS_LIST,
    )
    driver_version: str | None = Field(default=None, description="NVIDIA driver version.")
    cuda_version: str | None = Field(default=None, description="CUDA version the driver has.")
    gpus: list[GPUInfo] = Field(default_factory=list, description="The GPUs.")
    gpu_count: int | None = Field(default=None, ge=0, description="How many GPUs the node has.")
    links: list[GPULink] = Field(default_factory=list, description="Pairwise interconnect.")
    interconnect: Literal["NVLink", "PCIe", "None"] | None = Field(
        default=None, description="Weakest path between any two GPUs, as a class."
    )
    bandwidth: BandwidthProbe | None = Field(default=None, description="Last probe.")
    power: list[AppliedPower] = Field(
        default_factory=list, description="Limits under management, with the originals."
    )
    last_updated: datetime | None = Field(default=None, description="Last inventory read.")


class GPUNode(ApiModel):
    """The GPUs of one Kubernetes node."""

    api_version: Literal["inference.vllm-operator.dev/v1alpha1"] = Field(
        default="inference.vllm-operator.dev/v1alpha1"
    )
    kind: Literal["GPUNode"] = Field(default="GPUNode")
    metadata: ObjectMeta
    spec: GPUNodeSpec = Field(default_factory=GPUNodeSpec)
    status: GPUNodeStatus | None = None

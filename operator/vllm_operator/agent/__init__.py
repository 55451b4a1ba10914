"""The GPU node agent: what a node's GPUs really are, published as its GPUNode.

The agent runs on every GPU node (a DaemonSet). Each loop it reads the GPUs through NVML,
turns the answers into the GPUNode's status, applies the power policy from the GPUNode's
spec, runs the bandwidth probe when one is requested, and writes the status only when it
changed.

The I/O lives in thin modules: ``nvml`` (NVML through pynvml, or a recorded answer set),
``cuda`` (the CUDA driver API through ctypes, for the probe) and ``kube`` (the apiserver).
Everything between them is pure and works on plain dataclasses: ``readings`` (the NVML
answer set), ``topology``, ``inventory``, ``conditions``, ``power``, ``probe`` and
``manifests`` (the DaemonSet). Pure modules import neither pynvml nor a Kubernetes client,
so they are tested at the NVML boundary with hand-built and recorded answer sets.
"""

"""The bandwidth probe's copies, through the CUDA driver API (``libcuda.so.1``) and ctypes.

No framework: the agent's image carries no PyTorch or CUDA runtime. The driver library is
the one the NVIDIA container toolkit mounts into the pod with NVML, and the handful of
entry points below are enough to time copies with CUDA events:

- device copy: ``cuMemcpyDtoDAsync_v2`` between two buffers on one GPU;
- host to device and back: ``cuMemcpyHtoDAsync_v2`` / ``cuMemcpyDtoHAsync_v2`` from and to
  pinned host memory (``cuMemHostAlloc``; pageable memory would measure the staging copy);
- GPU to GPU: ``cuMemcpyPeerAsync`` with peer access enabled where the pair allows it
  (without it the driver stages through the host, which is not the link being probed).

Each copy runs once to warm up, then ``repeats`` times between two events; the best of
``trials`` such runs is kept (the least disturbed by anything else on the GPU). Buffers
shrink when the GPU has too little free memory, since vLLM may hold most of it.

CUDA devices are matched to NVML indices by PCI bus id, as the two may number GPUs
differently (CUDA puts the fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from vllm_operator.agent.probe import CopyKind, Measurement, ProbeRun
from vllm_operator.agent.topology import normalise_bus_id

log = logging.getLogger(__name__)

MIB = 1024 * 1024
CU_MEMHOSTALLOC_PORTABLE = 0x01
CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704


@dataclass(frozen=True)
class ProbeConfig:
    """Sizes and repetitions of the probe's copies."""

    device_copy_bytes: int = 1024 * MIB
    host_copy_bytes: int = 256 * MIB
    peer_copy_bytes: int = 512 * MIB
    repeats: int = 10
    trials: int = 3
    # Smallest buffer worth timing; below it launch overhead dominates.
    min_bytes: int = 32 * MIB
    # Free memory left alone on each GPU, for whatever else runs there.
    reserve_bytes: int = 1024 * MIB


class CudaError(Exception):
    """A CUDA driver call failed."""

    def __init__(self, call: str, code: int, name: str) -> None:
        super().__init__(f"{call} failed: {name} ({code})")
        self.code = code


class Driver:
    """The few CUDA driver API entry points the probe needs."""

    def __init__(self, library: str = "libcuda.so.1") -> None:
        self._lib = ctypes.CDLL(library)
        c = ctypes
        u64, size, vp = c.c_uint64, c.c_size_t, c.c_void_p
        signatures: dict[str, list[Any]] = {
            "cuInit": [c.c_uint],
            "cuDeviceGetCount": [c.POINTER(c.c_int)],
            "cuDeviceGet": [c.POINTER(c.c_int), c.c_int],
            "cuDeviceGetPCIBusId": [c.c_char_p, c.c_int, c.c_int],
            "cuDevicePrimaryCtxRetain": [c.POINTER(vp), c.c_int],
            "cuDevicePrimaryCtxRelease_v2": [c.c_int],
            "cuCtxSetCurrent": [vp],
            "cuCtxSynchronize": [],
            "cuCtxEnablePeerAccess": [vp, c.c_uint],
            "cuCtxDisablePeerAccess": [vp],
            "cuDeviceCanAccessPeer": [c.POINTER(c.c_int), c.c_int, c.c_int],
            "cuMemGetInfo_v2": [c.POINTER(size), c.POINTER(size)],
            "cuMemAlloc_v2": [c.POINTER(u64), size],
            "cuMemFree_v2": [u64],
            "cuMemsetD8_v2": [u64, c.c_ubyte, size],
            "cuMemHostAlloc": [c.POINTER(vp), size, c.c_uint],
            "cuMemFreeHost": [vp],
            "cuMemcpyDtoDAsync_v2": [u64, u64, size, vp],
            "cuMemcpyHtoDAsync_v2": [u64, vp, size, vp],
            "cuMemcpyDtoHAsync_v2": [vp, u64, size, vp],
            "cuMemcpyPeerAsync": [u64, vp, u64, vp, size, vp],
            "cuEventCreate": [c.POINTER(vp), c.c_uint],
            "cuEventRecord": [vp, vp],
            "cuEventSynchronize": [vp],
            "cuEventDestroy_v2": [vp],
            "cuGetErrorName": [c.c_int, c.POINTER(c.c_char_p)],
        }
        for name, args in signatures.items():
            fn = getattr(self._lib, name)
            fn.argtypes = args
            fn.restype = c.c_int
        # CUDA 12.8 added a _v2 that CUDA 13's headers use; older drivers have only the first.
        self._elapsed = (
            getattr(self._lib, "cuEventElapsedTime_v2", None) or self._lib.cuEventElapsedTime
        )
        self._elapsed.argtypes = [c.POINTER(c.c_float), vp, vp]
        self._elapsed.restype = c.c_int

    def call(self, name: str, *args: Any) -> None:
        """Call an entry point; raise CudaError on a non-zero CUresult."""
        self._check(name, getattr(self._lib, name)(*args))

    def _check(self, name: str, code: int) -> None:
        if code == 0:
            return
        text = ctypes.c_char_p()
        self._lib.cuGetErrorName(code, ctypes.byref(text))
        raise CudaError(name, code, (text.value or b"CUDA_ERROR_UNKNOWN").decode())

    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Milliseconds between two recorded events."""
        out = ctypes.c_float()
        self._check("cuEventElapsedTime", self._elapsed(ctypes.byref(out), start, end))
        return float(out.value)


class _Session:
    """Contexts, buffers and events of one probe run, all released at the end."""

    def __init__(self, driver: Driver) -> None:
        self.d = driver
        self.contexts: dict[int, ctypes.c_void_p] = {}
        self._cleanup: list[Callable[[], None]] = []

    def context(self, ordinal: int) -> ctypes.c_void_p:
        if ordinal not in self.contexts:
            ctx = ctypes.c_void_p()
            self.d.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), ordinal)
            self.contexts[ordinal] = ctx
            self._cleanup.append(lambda: self.d.call("cuDevicePrimaryCtxRelease_v2", ordinal))
        self.d.call("cuCtxSetCurrent", self.contexts[ordinal])
        return self.contexts[ordinal]

    def free_bytes(self, ordinal: int) -> int:
        self.context(ordinal)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.d.call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return int(free.value)

    def device_buffer(self, ordinal: int, size: int) -> int:
        self.context(ordinal)
        ptr = ctypes.c_uint64()
        self.d.call("cuMemAlloc_v2", ctypes.byref(ptr), size)
        self._cleanup.append(lambda: self._in(ordinal, "cuMemFree_v2", ptr))
        # Touch it, so no first-use cost lands inside a timed copy.
        self.d.call("cuMemsetD8_v2", ptr, 1, size)
        return int(ptr.value)

    def host_buffer(self, size: int) -> int:
        ptr = ctypes.c_void_p()
        self.d.call("cuMemHostAlloc", ctypes.byref(ptr), size, CU_MEMHOSTALLOC_PORTABLE)
        self._cleanup.append(lambda: self.d.call("cuMemFreeHost", ptr))
        ctypes.memset(ptr, 1, size)
        return int(ptr.value or 0)

    def enable_peer(self, ordinal: int, peer: int) -> bool:
        ok = ctypes.c_int()
        self.d.call("cuDeviceCanAccessPeer", ctypes.byref(ok), ordinal, peer)
        if not ok.value:
            return False
        peer_ctx = self.context(peer)
        self.context(ordinal)
        try:
            self.d.call("cuCtxEnablePeerAccess", peer_ctx, 0)
        except CudaError as error:
            if error.code != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED:
                raise
            return True
        self._cleanup.append(lambda: self._in(ordinal, "cuCtxDisablePeerAccess", peer_ctx))
        return True

    def _in(self, ordinal: int, name: str, *args: Any) -> None:
        self.d.call("cuCtxSetCurrent", self.contexts[ordinal])
        self.d.call(name, *args)

    def time(self, ordinal: int, copy: Callable[[], None], repeats: int, trials: int) -> float:
        """Best seconds for ``repeats`` copies, on the context's default stream."""
        self.context(ordinal)
        start, end = ctypes.c_void_p(), ctypes.c_void_p()
        self.d.call("cuEventCreate", ctypes.byref(start), 0)
        self.d.call("cuEventCreate", ctypes.byref(end), 0)
        try:
            copy()  # warm-up
            self.d.call("cuCtxSynchronize")
            best = float("inf")
            for _ in range(trials):
                self.d.call("cuEventRecord", start, None)
                for _ in range(repeats):
                    copy()
                self.d.call("cuEventRecord", end, None)
                self.d.call("cuEventSynchronize", end)
                best = min(best, self.d.elapsed_ms(start, end) / 1000)
            return best
        finally:
            self.d.call("cuEventDestroy_v2", start)
            self.d.call("cuEventDestroy_v2", end)

    def close(self) -> None:
        for release in reversed(self._cleanup):
            try:
                release()
            except CudaError:
                log.warning("Failed to release a CUDA resource", exc_info=True)
        self._cleanup.clear()


@contextmanager
def _session(driver: Driver) -> Iterator[_Session]:
    s = _Session(driver)
    try:
        yield s
    finally:
        s.close()


def _fit(wanted: int, free: int, buffers: int, config: ProbeConfig) -> int:
    """The largest buffer size up to ``wanted`` that fits ``buffers`` times in free memory."""
    size = wanted
    while size >= config.min_bytes and size * buffers > free - config.reserve_bytes:
        size //= 2
    if size < config.min_bytes:
        raise MemoryError(f"too little free GPU memory ({free // MIB} MiB) for the probe")
    return size


def device_map(driver: Driver, nvml_bus_ids: Mapping[str, int]) -> dict[int, int]:
    """CUDA device -> NVML index, matched by PCI bus id. GPUs NVML did not list are left out.

    The CUdevice handles are what the other calls take (they equal the ordinals in
    practice, but the API does not promise it)."""
    count = ctypes.c_int()
    driver.call("cuDeviceGetCount", ctypes.byref(count))
    wanted = {normalise_bus_id(b): i for b, i in nvml_bus_ids.items()}
    out: dict[int, int] = {}
    for ordinal in range(count.value):
        device = ctypes.c_int()
        driver.call("cuDeviceGet", ctypes.byref(device), ordinal)
        buf = ctypes.create_string_buffer(32)
        driver.call("cuDeviceGetPCIBusId", buf, len(buf), device.value)
        index = wanted.get(normalise_bus_id(buf.value.decode()))
        if index is not None:
            out[device.value] = index
    return out


def run_probe(
    nvml_bus_ids: Mapping[str, int],
    config: ProbeConfig | None = None,
    *,
    library: str = "libcuda.so.1",
) -> ProbeRun:
    """Time every copy the probe makes. Never raises: failures become ``errors``."""
    cfg = config or ProbeConfig()
    try:
        driver = Driver(library)
        driver.call("cuInit", 0)
        ordinals = device_map(driver, nvml_bus_ids)
    except (OSError, AttributeError, CudaError) as error:
        return ProbeRun(errors=(f"CUDA driver API unavailable: {error}",))
    if not ordinals:
        return ProbeRun(errors=("CUDA sees none of the GPUs NVML listed",))
    measurements: list[Measurement] = []
    errors: list[str] = []

    def attempt(what: str, measure: Callable[[_Session], Measurement]) -> None:
        with _session(driver) as s:
            try:
                measurements.append(measure(s))
            except (CudaError, MemoryError) as error:
                errors.append(f"{what}: {error}")

    def m(kind: CopyKind, src: int | None, dst: int | None, size: int, secs: float) -> Measurement:
        return Measurement(kind, src, dst, size, cfg.repeats, secs)

    for ordinal, index in sorted(ordinals.items(), key=lambda item: item[1]):

        def device_copy(s: _Session, o: int = ordinal, i: int = index) -> Measurement:
            size = _fit(cfg.device_copy_bytes, s.free_bytes(o), 2, cfg)
            a, b = s.device_buffer(o, size), s.device_buffer(o, size)
            secs = s.time(
                o,
                lambda: driver.call("cuMemcpyDtoDAsync_v2", b, a, size, None),
                cfg.repeats,
                cfg.trials,
            )
            return m("DeviceCopy", i, i, size, secs)

        def host_copies(s: _Session, o: int = ordinal, i: int = index) -> None:
            size = _fit(cfg.host_copy_bytes, s.free_bytes(o), 1, cfg)
            host, dev = s.host_buffer(size), s.device_buffer(o, size)
            up = s.time(
                o,
                lambda: driver.call("cuMemcpyHtoDAsync_v2", dev, host, size, None),
                cfg.repeats,
                cfg.trials,
            )
            measurements.append(m("HostToDevice", None, i, size, up))
            down = s.time(
                o,
                lambda: driver.call("cuMemcpyDtoHAsync_v2", host, dev, size, None),
                cfg.repeats,
                cfg.trials,
            )
            measurements.append(m("DeviceToHost", i, None, size, down))

        attempt(f"gpu{index} device copy", device_copy)
        with _session(driver) as s:
            try:
                host_copies(s)
            except (CudaError, MemoryError) as error:
                errors.append(f"gpu{index} host copies: {error}")

    for src_o, src_i in ordinals.items():
        for dst_o, dst_i in ordinals.items():
            if src_o == dst_o:
                continue

            def peer_copy(
                s: _Session, so: int = src_o, do: int = dst_o, si: int = src_i, di: int = dst_i
            ) -> Measurement:
                size = min(
                    _fit(cfg.peer_copy_bytes, s.free_bytes(so), 1, cfg),
                    _fit(cfg.peer_copy_bytes, s.free_bytes(do), 1, cfg),
                )
                direct = s.enable_peer(so, do)
                src, dst = s.device_buffer(so, size), s.device_buffer(do, size)
                dst_ctx, src_ctx = s.context(do), s.context(so)
                secs = s.time(
                    so,
                    lambda: driver.call(
                        "cuMemcpyPeerAsync", dst, dst_ctx, src, src_ctx, size, None
                    ),
                    cfg.repeats,
                    cfg.trials,
                )
                if not direct:
                    errors.append(f"gpu{si}->gpu{di}: no peer access; copied through the host")
                return m("PeerToPeer", si, di, size, secs)

            attempt(f"gpu{src_i}->gpu{dst_i} peer copy", peer_copy)
    measurements.sort(
        key=lambda x: (
            x.kind,
            x.src if x.src is not None else -1,
            x.dst if x.dst is not None else -1,
        )
    )
    return ProbeRun(measurements=tuple(measurements), errors=tuple(errors))

"""A plain PyTorch copy on each GPU, timed the way the agent's probe times its copies.

The reference the probe is checked against: same buffer sizes, same repeats, best of the
same number of trials, CUDA events around the copies, device copies counting bytes read
plus written. Prints JSON. Run on a GPU machine by tests/agent/h200/capture.sh; not a test.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

MIB = 1024 * 1024
DEVICE_COPY = 1024 * MIB
HOST_COPY = 256 * MIB
PEER_COPY = 512 * MIB
REPEATS = 10
TRIALS = 3


def main() -> int:
    try:
        import torch
    except ImportError as error:
        print(json.dumps({"skipped": f"PyTorch not importable: {error}"}))
        return 0

    def best(device: int, copy: Callable[[], object]) -> float:
        with torch.cuda.device(device):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            copy()
            torch.cuda.synchronize(device)
            seconds = float("inf")
            for _ in range(TRIALS):
                start.record()
                for _ in range(REPEATS):
                    copy()
                end.record()
                end.synchronize()
                seconds = min(seconds, start.elapsed_time(end) / 1000)
            return seconds

    results = []
    count = torch.cuda.device_count()
    for d in range(count):
        a = torch.ones(DEVICE_COPY, dtype=torch.uint8, device=d)
        b = torch.empty_like(a)
        s = best(d, lambda a=a, b=b: b.copy_(a))
        results.append(
            {
                "source": f"cuda{d}",
                "kind": "DeviceCopy",
                "gigabytes_per_second": round(2 * DEVICE_COPY * REPEATS / s / 1e9, 1),
            }
        )
        del a, b
        h = torch.ones(HOST_COPY, dtype=torch.uint8).pin_memory()
        g = torch.empty(HOST_COPY, dtype=torch.uint8, device=d)
        up = best(d, lambda h=h, g=g: g.copy_(h, non_blocking=True))
        down = best(d, lambda h=h, g=g: h.copy_(g, non_blocking=True))
        results.append(
            {
                "source": f"host->cuda{d}",
                "kind": "HostToDevice",
                "gigabytes_per_second": round(HOST_COPY * REPEATS / up / 1e9, 1),
            }
        )
        results.append(
            {
                "source": f"cuda{d}->host",
                "kind": "DeviceToHost",
                "gigabytes_per_second": round(HOST_COPY * REPEATS / down / 1e9, 1),
            }
        )
        del h, g
        torch.cuda.empty_cache()
    for s_dev in range(count):
        for d_dev in range(count):
            if s_dev == d_dev:
                continue
            src = torch.ones(PEER_COPY, dtype=torch.uint8, device=s_dev)
            dst = torch.empty(PEER_COPY, dtype=torch.uint8, device=d_dev)
            secs = best(s_dev, lambda src=src, dst=dst: dst.copy_(src, non_blocking=True))
            results.append(
                {
                    "source": f"cuda{s_dev}->cuda{d_dev}",
                    "kind": "PeerToPeer",
                    "gigabytes_per_second": round(PEER_COPY * REPEATS / secs / 1e9, 1),
                }
            )
            del src, dst
            torch.cuda.empty_cache()
    names = [torch.cuda.get_device_name(d) for d in range(count)]
    bus = [getattr(torch.cuda.get_device_properties(d), "pci_bus_id", None) for d in range(count)]
    print(
        json.dumps(
            {"torch": torch.__version__, "devices": names, "pciBusIds": bus, "results": results},
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

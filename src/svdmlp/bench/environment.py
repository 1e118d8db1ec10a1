"""What a benchmark ran on: device, library versions, time. Every result file starts with it."""

from __future__ import annotations

import datetime
import platform
from pathlib import Path

import torch

from svdmlp.versions import installed_versions


def cache_bytes(device: torch.device) -> int:
    """The last cache level in front of memory: L2 on a GPU, the largest CPU cache Linux reports.

    0 where unknown (then the benchmark does not rotate weight copies).
    """
    if device.type == "cuda":
        return getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = entry.read_text().strip()
        scale = {"K": 1024, "M": 1024 * 1024}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KM")) * scale)
    return max(sizes, default=0)


def describe(device: torch.device) -> dict:
    """Device name and properties, host, Python/torch/triton/svdmlp versions, UTC timestamp."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        hardware = {
            "type": "cuda",
            "name": props.name,
            "sms": props.multi_processor_count,
            "cache_bytes": cache_bytes(device),
            "memory_bytes": props.total_memory,
            "capability": f"{props.major}.{props.minor}",
            "cuda": torch.version.cuda,
        }
    else:
        hardware = {
            "type": "cpu",
            "name": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
            "cache_bytes": cache_bytes(device),
        }
    return {
        "device": hardware,
        "machine": platform.platform(),
        "python": platform.python_version(),
        "versions": {"torch": torch.__version__, **installed_versions(("triton", "svdmlp"))},
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }

"""Facts about the machine and software a result was measured on."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any


def facts(device: str = "cpu") -> dict[str, Any]:
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gb = None
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        kb = int(meminfo.read_text().split()[1])
        mem_gb = round(kb / 1024 / 1024, 1)
    out: dict[str, Any] = {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "memory_gb": mem_gb,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": device,
        # Other work on the machine when the run began: on a shared machine, this is how
        # much to trust the absolute figures (the ratios within a run hold up better).
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }
    try:
        import torch

        out["torch"] = torch.__version__
        if device.startswith("cuda") and torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    try:
        out["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        out["commit"] = None
    return out

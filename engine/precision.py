"""Which arithmetic an engine computes in: the ``precision`` setting, resolved per device.

``auto`` picks bf16 only where the device computes it natively: a CPU with AVX512-BF16
or AMX-BF16 (as torch's cpuinfo reports them), a CUDA device of compute capability 8.0
or later. Elsewhere bf16 is emulated, slower than fp32, so ``auto`` gives fp32 there;
naming ``bf16`` still forces it (for a measurement).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

# torch is imported where it is used: the server's settings import this module, and
# `voxwire serve --help` should not wait for torch.
Setting = Literal["auto", "fp32", "bf16"]
Precision = Literal["fp32", "bf16", "fp16"]
SETTINGS: tuple[Setting, ...] = ("auto", "fp32", "bf16")
_CPU_BF16_FEATURES = ("avx512_bf16", "amx_bf16")


def dtype(precision: Precision) -> torch.dtype:
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def cpu_capabilities() -> Mapping[str, object]:
    """The CPU's instruction-set features, as torch sees them (tests replace this)."""
    import torch

    return torch.cpu.get_capabilities()


def native_bf16(device: str) -> bool:
    """Whether ``device`` ("cpu", "cuda", "cuda:1") computes bf16 in hardware."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.get_device_capability(dev)[0] >= 8
    if dev.type == "cpu":
        caps = cpu_capabilities()
        return any(bool(caps.get(f)) for f in _CPU_BF16_FEATURES)
    return False


def resolve(setting: str, device: str) -> Precision:
    """The precision ``setting`` gives on ``device``; a ValueError names a bad setting."""
    if setting not in SETTINGS:
        raise ValueError(f"unknown precision {setting!r}; use one of {', '.join(SETTINGS)}")
    if setting == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    return setting
